"""bisect.html and the bisect's sentences (soak/bisect/page.py), from the
document by pure functions: the sentence a person reads first, the posterior
chart with one line per build, the segments table linking each report; labels
from a file escaped. One page rendered in headless Chromium."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from soak.bisect.executor import Build, SegmentResult
from soak.bisect.page import render_html, segment_line, sentence, span
from soak.bisect.posterior import model
from soak.bisect.record import bisect_document

MIN = 60.0


def _doc(results, *, labels=("b1", "b2", "b3", "b4"), budget_s=None, threshold=0.95, **extra):
    builds = [Build(i, label) for i, label in enumerate(labels)]
    rs = [SegmentResult(b, Path(f"/x/segment-{n:03d}-build-{b}"), e, h, "hang" if h else "time")
          for n, (b, e, h) in enumerate(results)]
    return {**bisect_document(builds, rs, model=model(builds=len(labels)), segment_s=20 * MIN, threshold=threshold,
                              budget_s=budget_s), **extra}


# b3 (index 2) hangs fast, b2 (index 1) runs clean: enough to name b3 at 0.95
FOUND = [(2, 3 * MIN, 1), (1, 20 * MIN, 0), (2, 2 * MIN, 1), (1, 20 * MIN, 0), (2, 4 * MIN, 1), (1, 20 * MIN, 0),
         (2, 1 * MIN, 1), (1, 20 * MIN, 0), (2, 2 * MIN, 1), (1, 20 * MIN, 0), (2, 3 * MIN, 1)] * 2


def test_the_sentences_say_the_answer_or_what_is_still_needed() -> None:
    found = _doc(FOUND)
    assert found["now"]["state"] == "found"
    assert sentence(found).startswith(f"first bad build: b3 (posterior {found['now']['posterior']['confidence']:.2f}) "
                                      f"after {len(FOUND)} segments, ")
    searching = _doc(FOUND[:2])
    said = sentence(searching)
    assert said.startswith("still searching: most likely first bad build") and "0.95 needed" in said
    assert f"next: b{searching['now']['next']['build'] + 1} for 20 min" in said
    spent = _doc(FOUND[:2], budget_s=10 * MIN)
    assert sentence(spent).startswith("undecided, the budget (time at risk) is spent")
    bounded = _doc(FOUND[:2], stopped_by="segment bound")
    assert sentence(bounded).startswith("undecided, the budget (segment count) is spent")
    line = segment_line(searching, 1)
    assert line.startswith("segment 2: b2 20 min at risk, clean | still searching")
    assert segment_line(searching, 0).startswith("segment 1: b3 3 min at risk, 1 hang |")


def test_spans_read_as_people_say_them() -> None:
    assert [span(s) for s in (45, 41 * MIN, 150 * MIN)] == ["45 s", "41 min", "2.5 h"]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(alphabet="<>&\"'ab/ \u202e\x1b", max_size=12).map(lambda t: "<i>" + t),
                min_size=2, max_size=4, unique=True))
def test_hostile_labels_are_escaped_on_the_page_and_the_terminal(labels: list[str]) -> None:
    from bs4 import BeautifulSoup

    doc = _doc([(0, 5 * MIN, 1), (1, 20 * MIN, 0)], labels=tuple(labels))
    page = render_html(doc, reports=["segment-000-build-0/report.html", None])
    assert "<i>" not in page and not BeautifulSoup(page, "html.parser").find_all("i")
    assert "\x1b" not in segment_line(doc, 0) and "\u202e" not in segment_line(doc, 0)


def test_the_page_as_a_person_reads_it(tmp_path: Path) -> None:
    from tests.browser import render

    doc = _doc(FOUND)
    reports = [f"segment-{n:03d}-build-{b}/report.html" if n != 3 else None for n, (b, _, _) in enumerate(FOUND)]
    page_path = tmp_path / "bisect.html"
    page_path.write_text(render_html(doc, reports=reports, title="nightly bisect"), encoding="utf-8")
    page = render(page_path)
    soup = page.soup
    headline = soup.find(id="sentence")
    assert headline.get_text().startswith("first bad build: b3 (posterior ") and "found" in headline["class"]
    lines = soup.select("#posterior-chart polyline.build-line")
    assert [l["data-build"] for l in lines] == ["b1", "b2", "b3", "b4"]
    # each line has a point for the prior and one after every segment; b3's ends above the stop line
    assert all(len(l["points"].split()) == len(FOUND) + 1 for l in lines)
    stop_y = float(soup.select_one("#posterior-chart line.stop-at")["y1"])
    assert float(lines[2]["points"].split()[-1].split(",")[1]) < stop_y < float(lines[1]["points"].split()[-1].split(",")[1])
    rows = soup.select("#segments tbody tr")
    assert len(rows) == len(FOUND)
    assert rows[0].find("a")["href"] == "segment-000-build-2/report.html" and rows[3].find("a") is None
    assert [td.get_text() for td in rows[0].find_all("td")[:4]] == ["1", "b3", "3 min", "1"]
    best = soup.select_one("#builds tr.best td").get_text()
    assert best == "b3"
    assert "segments of 20 min of time at risk" in page.text()
