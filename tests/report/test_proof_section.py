"""report.html's proof section and junit.xml's prove case, rendered from
summary.json's ``proof`` (soak/report/proof.py, soak/report/junit.py): the
sentence, the walk with both lines, escaped; the case a CI report shows."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from bs4 import BeautifulSoup
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.prove.sprt import plan, walk
from soak.report.junit import build_junit
from soak.report.proof import proof_html, walk_svg

ISSUE = plan(broken_mtbf_s=1200.0, target_mtbf_s=12000.0)  # θ1 20 min, θ0 200 min, α = β = 5%


def proof_of(marks: list[float], total: float) -> dict:
    d = walk(ISSUE, hang_exposures_s=marks, exposure_s=total)
    return {**d.to_json(), "path": {"hang_exposures_s": marks, "exposure_s": total}}


def _line(svg, cls: str) -> tuple[float, float, float, float]:
    el = svg.find("line", class_=cls)
    return tuple(float(el[k]) for k in ("x1", "y1", "x2", "y2"))  # type: ignore[return-value]


def test_the_section_says_the_sentence_and_draws_both_lines_and_the_walk() -> None:
    soup = BeautifulSoup(proof_html(proof_of([30 * 60.0], 90 * 60.0)), "html.parser")
    stat = soup.find("div", class_="proof")
    # one hang at minute 30, standing at 90: the accept line for one hang is at 116.6 minutes
    # (26.6 more); at minute 90 the reject line is at c + b t = 1.279 + 0.01954 x 90 = 3.04
    # hangs, so 3 more (4 in all) reject if they land by (4 - 1.279) / 0.01954 = minute 139
    assert stat.get_text() == "27 more clean minutes to accept; 3 more hangs before minute 139 reject"
    svg = soup.find("svg", class_="proof")
    accept, reject = _line(svg, "accept-line"), _line(svg, "reject-line")
    assert accept[1] > accept[3] and reject[1] > reject[3]  # both rise (y grows downwards)
    assert reject[1] < accept[1]  # the reject line lies above the accept line
    walk_points = [tuple(map(float, p.split(","))) for p in svg.find("polyline", class_="walk")["points"].split()]
    ys = sorted({y for _, y in walk_points}, reverse=True)
    assert len(ys) == 2  # 0 hangs, then 1: one step up
    assert walk_points[0][0] < walk_points[-1][0]
    assert svg.find("circle", class_="decided") is None  # undecided: no decision point
    assert "θ1 20 min broken, θ0 200 min target" in soup.get_text()


def test_a_decided_test_marks_where_it_decided() -> None:
    soup = BeautifulSoup(proof_html(proof_of([], 70 * 60.0)), "html.parser")
    assert soup.find("div", class_="proof").get_text() == "fixed (α 5%, β 5%) after 65.4 clean minutes"
    assert "accepted" in soup.find("div", class_="proof")["class"]
    assert soup.find("circle", class_="decided") is not None


def test_a_truncated_plan_draws_its_truncation() -> None:
    p = plan(broken_mtbf_s=1200.0, target_mtbf_s=12000.0, max_exposure_s=163.5 * 60, max_hangs=3)
    svg = BeautifulSoup(walk_svg(p, hang_exposures_s=[600.0], exposure_s=3600.0, decision="undecided"),
                        "html.parser").find("svg")
    assert len(svg.find_all("line", class_="truncation")) == 2


def test_strings_from_the_run_directory_are_escaped_and_damage_is_no_traceback() -> None:
    hostile = {"decision": "<b>x</b>", "sentence": "<script>alert(1)</script>", "reasons": ["a", "<i>b</i>"],
               "plan": {"broken_mtbf_s": "x"}, "path": {"hang_exposures_s": [float("nan"), "1"]}}
    out = proof_html(hostile)
    assert "<script>" not in out and "&lt;script&gt;" in out and "<i>" not in out and "<b>" not in out
    assert "<svg" not in out  # no plan to draw
    assert proof_html(None) == "" and proof_html({}) != ""
    broken_path = {**proof_of([], 600.0), "path": {"hang_exposures_s": [float("inf"), -3, None], "exposure_s": "?"}}
    assert "<svg" in proof_html(broken_path)


def _summary(proof: dict | None, *, verdict: str = "pass", incidents: list | None = None) -> dict:
    return {"verdict": verdict, "started_at": 1.8e9, "duration_s": 60.0, "cut_off": False,
            "incidents": incidents or [], **({"proof": proof} if proof is not None else {})}


HANG = {"number": 1, "kind": "hang", "rule": "pp_tail_stall", "onset_at": 1.8e9 + 30, "detected_at": 1.8e9 + 35,
        "summary": "pp tail stall", "evidence": "incidents/1"}


def _cases(xml: bytes) -> dict[str, ET.Element]:
    return {c.get("name"): c for c in ET.fromstring(xml).iter("testcase")}


def _properties(xml: bytes) -> dict[str, str]:
    return {p.get("name"): p.get("value") for p in ET.fromstring(xml).iter("property")}


@pytest.mark.parametrize("marks, total, verdict, incidents, outcome", [
    ([], 70 * 60.0, "pass", [], "passed"),
    ([10 * 60.0, 20 * 60.0], 20 * 60.0, "fail", [HANG, {**HANG, "number": 2}], "failure"),
    ([], 30 * 60.0, "pass", [], "error"),
])
def test_junit_has_a_prove_case(marks, total, verdict, incidents, outcome) -> None:
    proof = proof_of(marks, total)
    xml = build_junit(_summary(proof, verdict=verdict, incidents=incidents), name="night")
    case = _cases(xml)["prove"]
    suite = ET.fromstring(xml)
    if outcome == "passed":
        assert list(case) == []
    elif outcome == "failure":
        (failure,) = list(case)
        assert failure.tag == "failure" and failure.get("type") == "prove_rejected"
        assert failure.get("message") == "not fixed (α 5%, β 5%): 2 hangs within 20.0 minutes"
    else:
        (error,) = list(case)
        assert error.tag == "error" and error.get("type") == "prove_undecided"
        assert error.get("message") == "undecided: 35 more clean minutes to accept; 2 hangs before minute 37 reject"
        assert suite.get("errors") == "1"
        # the run's exit status known (summary.json's exit_code): the message and the suite name exit 5
        named = build_junit({**_summary(proof, verdict=verdict, incidents=incidents), "exit_code": 5}, name="night")
        (error,) = list(_cases(named)["prove"])
        assert error.get("message") == "undecided (exit 5): 35 more clean minutes to accept; 2 hangs before minute " \
                                       "37 reject"
        assert _properties(named)["exit_code"] == "5"
    assert suite.get("tests") == "2"


def test_an_accept_after_a_hang_passes_the_soak_case_and_lists_the_hang() -> None:
    proof = proof_of([10 * 60.0], 120 * 60.0)
    assert proof["decision"] == "accepted"
    xml = build_junit(_summary(proof, verdict="pass", incidents=[HANG]), name="night")
    cases = _cases(xml)
    assert list(cases["night"]) == [] and list(cases["prove"]) == []
    assert "incident 1: hang (rule pp_tail_stall)" in ET.fromstring(xml).find("system-out").text
    assert ET.fromstring(xml).get("failures") == "0"


def test_without_prove_junit_is_as_it_was() -> None:
    xml = build_junit(_summary(None, verdict="fail", incidents=[HANG]), name="night")
    assert "prove" not in _cases(xml) and ET.fromstring(xml).get("tests") == "1"
    assert list(_cases(xml)["night"])[0].tag == "failure"


def test_an_accept_in_a_run_failed_by_a_criterion_passes_the_prove_case() -> None:
    """The proof answered (fixed); the run failed on its error rate: the error rate
    is the failure CI shows, the prove case is no 'undecided' error."""
    proof = proof_of([], 70 * 60.0)
    summary = {**_summary(proof, verdict="fail"), "exit_code": 1,
               "criteria": {"passed": False, "results": [{"name": "error_rate", "passed": False,
                                                          "reason": "error rate 90%"}]}}
    xml = build_junit(summary, name="night")
    cases, suite = _cases(xml), ET.fromstring(xml)
    assert list(cases["prove"]) == []
    assert suite.get("errors") == "0" and int(suite.get("failures")) >= 1  # the run's failure, still shown


@settings(max_examples=100, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True), st.floats(allow_nan=True, allow_infinity=True),
       st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=4))
def test_any_exposure_renders_quickly_and_escaped(path_exposure, exposure, marks) -> None:
    """exposure_s 1e300 in summary.json (or history) never finished rendering: the axis
    is bounded and so are its ticks, for any float, huge, negative, inf or nan."""
    proof = {**proof_of([], 600.0), "decision": "<i>undecided</i>", "exposure_s": exposure,
             "path": {"hang_exposures_s": marks, "exposure_s": path_exposure}}
    out = proof_html(proof)
    assert "<svg" in out and "<i>" not in out and "nan" not in out.lower().replace("nanos", "")
    soup = BeautifulSoup(out, "html.parser")
    assert len(soup.find("svg").find_all("text")) < 80


def test_a_recorded_plan_out_of_bounds_draws_no_plot_and_no_traceback() -> None:
    good = dict(ISSUE.to_json())
    for bad in ({"broken_mtbf_s": 10**400}, {"broken_mtbf_s": 1e-300, "target_mtbf_s": 1e300}, {"max_hangs": 2.5}):
        out = proof_html({"decision": "undecided", "sentence": "s", "plan": {**good, **bad}})
        assert "<svg" not in out and "s" in out


UNDECIDED_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "prove" / "real_undecided"


def test_a_recorded_undecided_run_names_exit_5_in_junit_and_the_report(tmp_path) -> None:
    """`soak report` of a real run that ended undecided (exit 5): CI shows it red, and the
    JUnit says why (the suite's exit_code, the prove case's "undecided (exit 5)"); report.html's
    banner reads UNDECIDED with what would decide it, never PASS."""
    from soak.report.render import write_report

    run = tmp_path / "run"
    shutil.copytree(UNDECIDED_RUN, run)
    written = write_report(run)
    xml = written.junit.read_bytes()
    props = _properties(xml)
    assert props["verdict"] == "pass" and props["exit_code"] == "5" and props["proof"] == "undecided"
    (error,) = list(_cases(xml)["prove"])
    assert error.get("type") == "prove_undecided"
    assert error.get("message") == ("undecided (exit 5): 65 more clean minutes to accept; 2 hangs before minute 37 "
                                    "reject")
    assert list(_cases(xml)["test"]) == []  # the soak itself did its work: only the proof is open
    banner = BeautifulSoup(written.html.read_text(), "html.parser").select_one(".banner")
    assert banner["class"] == ["banner", "undecided"]
    assert banner.select_one(".verdict").get_text() == "UNDECIDED"
    assert "did not decide: 65 more clean minutes to accept" in banner.get_text(" ", strip=True)
