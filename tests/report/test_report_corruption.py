"""A corruption where a person looks (issue 49): report.html's corruption card (the reference
and the answer side by side, the first difference marked, the logprobs there, the verdict's
reason, cross-talk named, the server's state), the canary strip with every incident on one
time line, the canaries' figures; junit.xml's oracle case; the end block's lines. The run is
the seed's story built by hand (tests/report/oracle_run.py): corruption at +1:20, deadlock
at +2:00."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import xmlschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oracle_run import CORRUPT_AT, HANG_ONSET, START, corruption_json, seed_story
from report_paths import JUNIT_XSD
from soak.report.junit import build_junit
from soak.report.oracle import (CanaryMark, Corruption, canary_mark, corruption_from_json, corruption_sentence,
                                read_oracle, tally, thin)
from soak.report.oracle_html import corruption_card, strip_svg
from soak.report.render import write_report
from soak.run.end_block import end_block
from soak.summary_file import IncidentEntry, RunSummary

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from browser import render  # noqa: E402


@pytest.fixture
def story(tmp_path):
    return seed_story(tmp_path / "night")


def test_the_card_shows_both_answers_marks_the_first_difference_and_says_why(story):
    written = write_report(story)
    page = render(written.html)
    soup = page.soup
    cards = soup.select("div.corruption")
    assert len(cards) == 1, "one corruption, one card"
    card = cards[0]
    ref = card.select_one("div.tokens[data-side=reference] span.tok.diff")
    ans = card.select_one("div.tokens[data-side=answer] span.tok.diff")
    assert ref["data-position"] == ans["data-position"] == "7"
    assert ref.get_text() == " It" and ans.get_text() == " Banana"
    # before the difference the two sides agree token for token
    same = [[t.get_text() for t in card.select(f"div.tokens[data-side={side}] span.tok.same")]
            for side in ("reference", "answer")]
    assert same[0] == same[1] == ["The", " capital", " of", " France", " is", " Paris", "."]
    rows = [[td.get_text() for td in tr.select("td")] for tr in card.select("table.logprobs tr")[1:]]
    assert rows[0][:2] == [" Banana", "-0.05"] and [" Bonn", "-3.4", "alternative"] in rows
    text = " ".join(card.get_text(" ").split())
    assert "is not among the alternatives the server listed here" in text
    assert "Verdict corrupt: the reference token ' It' is not among the 3 alternatives listed at position 7" in text
    assert "canary c2 (long, 214K tokens) diverged at position 7" in text
    server = " ".join(card.select_one("table.server").get_text(" ").split())
    assert "running requests 12" in server and "waiting requests 3" in server and "91.0%" in server
    assert "largest 230,000 tokens" in server
    # the canaries' figures, the share measured against its bound
    assert "0.81% of server time (bound 2%)" in page.text()
    # a corruption's server still answered: no "no watchdog line" note is owed it
    first_incident = soup.select("div.incident")[0]
    assert "no watchdog line" not in first_incident.get_text()


def test_the_corruption_and_the_deadlock_are_on_one_time_line_corruption_first(story):
    page = render(write_report(story).html)
    strip = page.soup.select_one("svg.canaries")
    corruption = strip.select_one("g.incident.corruption")
    hang = strip.select_one("g.incident.hang")
    assert float(corruption["data-onset-t"]) == pytest.approx(CORRUPT_AT - START)
    assert float(hang["data-onset-t"]) == pytest.approx(HANG_ONSET - START)
    assert float(corruption["data-onset-t"]) < float(hang["data-onset-t"])
    # the onset interval the evidence allows: last good canary .. the bad one
    assert corruption.select_one("rect.onset-interval") is not None
    marks = strip.select("rect.canary")
    assert {m["class"][1] for m in marks} >= {"match", "explained", "corrupt", "crosstalk"}
    first_bad = min(float(m["data-t"]) for m in marks if m["class"][1] == "corrupt")
    assert first_bad == pytest.approx(CORRUPT_AT - START)
    assert all(float(m["data-t"]) < first_bad for m in marks if m["class"][1] == "explained")


def test_cross_talk_is_named(tmp_path):
    obj = corruption_json()
    obj["judgement"].update(verdict="crosstalk", crosstalk_with="c3", reason="the answer is canary c3's reference")
    run = seed_story(tmp_path / "night", corruption=obj)
    page = render(write_report(run).html)
    card = " ".join(page.soup.select_one("div.corruption").get_text(" ").split())
    assert "another canary's answer: c3" in card
    assert "Cross-talk: this is another canary's answer: c3" in card


def test_a_gap_within_the_tie_margin_is_said_so_and_one_beyond_it_too():
    near = corruption_json()
    near["judgement"].update(gap=0.05, alternatives=[[" Banana", -0.05], [" It", -0.1]])
    far = corruption_json()
    far["judgement"].update(gap=2.5, alternatives=[[" Banana", -0.05], [" It", -2.55]])
    for obj, word in ((near, "within"), (far, "beyond")):
        html = corruption_card(corruption_from_json(obj, number=1, evidence="incidents/1"), tie_margin=0.2, start=START)
        assert f"{word} the tie margin of 0.2 nats" in html
        assert "The reference's token &#x27; It&#x27; is listed." in html


def test_a_damaged_corruption_json_still_renders_the_page(tmp_path):
    run = seed_story(tmp_path / "night", write_corruption=False)
    (run / "incidents" / "1" / "corruption.json").write_bytes(b'{"canary_id": "c2", "judgement": [1, 2')
    written = write_report(run)
    text = written.html.read_text()
    assert "corruption.json cannot be read" in text and "Incident 1: corruption" in text


def test_junit_has_an_oracle_case_failing_with_the_reason(story):
    written = write_report(story)
    xmlschema.XMLSchema(str(JUNIT_XSD)).validate(str(written.junit))
    suite = ET.parse(written.junit).getroot()
    case = next(c for c in suite.iter("testcase") if c.get("name") == "oracle")
    failure = case.find("failure")
    assert failure is not None and failure.get("type") == "corruption"
    assert "diverged at position 7" in failure.get("message")
    assert "not among the 3 alternatives" in failure.get("message")
    assert "canaries: 19 judged" in failure.text


def test_junit_oracle_case_passes_when_every_canary_was_right():
    summary = RunSummary.from_json({"verdict": "pass", "started_at": START, "duration_s": 60.0, "incidents": []})
    marks = [CanaryMark(ts=START + i, canary_id="c0", verdict="match") for i in range(5)]
    suite = ET.fromstring(build_junit(summary, name="n", canaries=tally(marks)))
    case = next(c for c in suite.iter("testcase") if c.get("name") == "oracle")
    assert case.find("failure") is None and suite.get("failures") == "0"


def test_the_end_block_says_the_corruption_and_the_canaries(story):
    write_report(story)
    summary = RunSummary.from_json(json.loads((story / "summary.json").read_text()))
    block = end_block(summary, exit_code=1, files=[str(story / "report.html")], oracle=read_oracle(story))
    lines = block.splitlines()
    corruption = next(line for line in lines if line.startswith("corruption  "))
    assert "canary c2 (long, 214K tokens) diverged at position 7" in corruption
    assert corruption.endswith("evidence incidents/1/")
    canaries = next(line for line in lines if line.startswith("canaries    "))
    assert "19 judged: 13 matched, 1 explained (near ties), 4 corrupt, 1 cross-talk" in canaries
    assert "0.81% of server time" in canaries
    assert "1 corruption (corruption) at +1:20" in block


# -- properties -----------------------------------------------------------------------------

HOSTILE = "<script>alert(1)</script>\x1b[2J\u202e'\""
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**7) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12) | st.just(HOSTILE),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8) | st.just(HOSTILE),
                                                                      children, max_size=4),
    max_leaves=30)
# Well-shaped corruption.json with hostile strings in every string place, or anything at all there.
token = st.fixed_dictionaries({"token": st.text(max_size=6) | st.just(HOSTILE), "logprob": json_values,
                               "top": st.lists(st.tuples(st.text(max_size=6) | st.just(HOSTILE),
                                                         json_values).map(list), max_size=3)})
answer = st.fixed_dictionaries({"tokens": st.lists(token, max_size=12), "text": st.text(max_size=20) | st.just(HOSTILE),
                                "finish_reason": json_values, "model": json_values, "malformed": json_values}) | json_values
shaped = st.fixed_dictionaries({
    "canary_id": st.just(HOSTILE) | json_values, "long": json_values, "reference_source": json_values,
    "reference": answer, "answer": answer,
    "judgement": st.fixed_dictionaries({
        "verdict": json_values, "position": st.integers(-3, 15) | json_values,
        "reference_token": st.just(HOSTILE) | json_values, "answer_token": st.just(HOSTILE) | json_values,
        "gap": json_values, "alternatives": st.lists(st.tuples(st.just(HOSTILE) | st.text(max_size=4),
                                                               json_values).map(list), max_size=4) | json_values,
        "crosstalk_with": st.just(HOSTILE) | json_values, "reason": st.just(HOSTILE) | json_values}) | json_values,
    "server": st.fixed_dictionaries({"running": json_values, "waiting": json_values, "kv_cache_usage": json_values,
                                     "in_flight": json_values, "contexts": st.lists(json_values, max_size=5)})
    | json_values,
    "onset": st.fixed_dictionaries({"earliest": json_values, "latest": json_values}) | json_values,
}) | json_values


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=shaped, tie_margin=st.floats(0, 5))
def test_any_corruption_json_renders_and_escapes_hostile_strings(obj, tie_margin):
    c = corruption_from_json(obj, number=1, evidence="incidents/1")
    html = corruption_card(c, tie_margin=tie_margin, start=START)
    assert "<script" not in html and "\x1b" not in html
    sentence = corruption_sentence(c)
    assert isinstance(sentence, str) and sentence
    # junit.xml carries it: well-formed XML whatever the strings were
    summary = RunSummary.from_json({"verdict": "fail", "started_at": START, "incidents": [
        {"number": 1, "kind": "corruption", "rule": "corruption", "onset_at": START + 5, "evidence": "incidents/1"}]})
    suite = ET.fromstring(build_junit(summary, name="night", corruptions=[c]))
    assert any(case.get("name") == "oracle" and case.find("failure") is not None for case in suite.iter("testcase"))


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.dictionaries(st.sampled_from(["ts", "canary_id", "verdict", "long", "position", "share",
                                                       "crosstalk_with", "prompt_tokens"]), json_values, max_size=8)
                      | st.fixed_dictionaries({"ts": st.floats(START, START + 1e4), "canary_id": st.just(HOSTILE),
                                               "verdict": st.sampled_from(["match", "corrupt", "bogus", "crosstalk"]),
                                               "share": json_values}), max_size=30))
def test_any_canary_line_reads_totally_and_counts_once(lines):
    marks = [m for m in (canary_mark(line) for line in lines) if m is not None]
    t = tally(marks)
    assert t.total == len(marks)
    assert t.share is None or 0.0 <= t.share <= 1.0
    assert t.pass_rate is None or 0.0 <= t.pass_rate <= 1.0
    svg = strip_svg(marks, [IncidentEntry.from_json({"number": 1, "kind": HOSTILE, "onset_at": START + 3})],
                    start=START, end=START + 100)
    assert "<script" not in svg
    assert len(thin(marks, limit=5)) <= max(5, sum(m.verdict not in ("match", "explained", "reference") for m in marks))


def test_thinning_keeps_every_bad_canary():
    marks = [CanaryMark(ts=START + i, canary_id="c", verdict="corrupt" if i % 97 == 0 else "match")
             for i in range(5000)]
    kept = thin(marks, limit=200)
    assert len(kept) <= 200 and sum(m.bad for m in kept) == sum(m.bad for m in marks)
    assert list(kept) == sorted(kept, key=lambda m: m.ts)


def test_corruption_sentence_names_crosstalk_and_position():
    c = corruption_from_json({"canary_id": "c1", "long": False, "judgement": {"crosstalk_with": "c3", "position": 0}},
                             number=1, evidence="incidents/1")
    assert isinstance(c, Corruption)
    assert corruption_sentence(c) == "canary c1 (short) returned another canary's answer: c3 (from position 0)"


def test_the_responders_shape_a_window_of_tokens_and_the_probes_server_fields():
    """As soak.respond.corruption writes it: each side a window of the answer (``tokens_from``), the
    server's ``kv_cache_usage_perc``, the client's streams under ``load``, the canary's fields beside."""
    obj = corruption_json(prompt_tokens=214000, verdict="corrupt", crosstalk_with=None,
                          server={"ts": START, "running": 12, "waiting": 0, "kv_cache_usage_perc": 0.5},
                          load={"in_flight": 3, "streams": [{"age_s": 1.0, "tokens": 40}, {"age_s": 2.0, "tokens": 7}]})
    for side in ("reference", "answer"):
        obj[side]["tokens_from"] = 100
        obj[side]["tokens_total"] = 400
    obj["judgement"]["position"] = 107
    c = corruption_from_json(obj, number=1, evidence="incidents/1")
    assert c.at("answer", 107).token == " Banana" and c.at("reference", 107).token == " It"
    assert c.prompt_tokens == 214000 and c.server.kv_cache_usage == 0.5 and c.server.in_flight == 3
    html = corruption_card(c, tie_margin=0.2, start=START)
    assert html.count("data-position='107'") == 2
    assert "… 100 tokens …" in html and "50.0%" in html and "40, 7" in html
    assert "canary c2 (long, 214K tokens) diverged at position 107" in corruption_sentence(c)
    # without the judgement's position, the first differing position of the two windows
    del obj["judgement"]["position"]
    assert corruption_from_json(obj, number=1, evidence="incidents/1").position == 107
