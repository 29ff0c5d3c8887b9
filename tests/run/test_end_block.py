"""The end-of-run block, rendered from summary.json on data: the verdict and why,
the stop reason as a neutral line, latency percentiles, every threshold with
✓/✗ and its observed value, the report path; total over any summary."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import pytest

from soak.run.end_block import end_block, format_latency
from soak.summary_file import RunSummary

FILES = ["/runs/night/report.html", "/runs/night/summary.json"]


def _summary(**over: Any) -> RunSummary:
    base: dict[str, Any] = {
        "verdict": "fail", "run_id": "night-1", "started_at": 1000.0, "duration_s": 360.0, "exit_code": 99,
        "stop_reason": "thresholds breached: ttft_p99 < 2s", "stopped_by": "duration",
        "verdict_reasons": ["ttft_p99 7.46 s > 2 s"], "requests": {"ok": 337, "failed": 4, "cut_by_incident": 2},
        "incidents": [], "restarts": 0,
        "latency": {"ttft_s": {"p50": 0.12, "p90": 0.5, "p95": 1.2, "p99": 7.46},
                    "tpot_s": {"p50": 0.000651, "p90": 0.0012, "p95": 0.002, "p99": 0.003},
                    "itl_p50_s": {"p50": 0.0007, "p90": 0.001, "p95": 0.0011, "p99": 0.0015}},
        "thresholds": {"passed": False, "breached": ["ttft_p99 < 2s"], "results": [
            {"name": "ttft_p99 < 2s", "metric": "ttft_p99", "expression": "< 2s", "observed": 7.46, "limit": 2.0,
             "passed": False, "scope": "run"},
            {"name": "error_rate < 5%", "metric": "error_rate", "expression": "< 5%", "observed": 0.0117,
             "limit": 0.05, "passed": True, "scope": "run"}]},
    }
    base.update(over)
    return RunSummary.from_json(json.loads(json.dumps(base)))


def _line(block: str, start: str) -> str:
    return next(line for line in block.splitlines() if line.startswith(start))


def test_a_breached_threshold_leads_with_its_observed_value_and_the_stop_reason_is_neutral() -> None:
    block = end_block(_summary(), exit_code=99, files=FILES, build="nightly-abc")
    assert _line(block, "verdict") == "verdict     FAIL, exit 99 (a threshold breached)"
    assert _line(block, "why") == "why         ttft_p99 7.46 s > 2 s"
    assert _line(block, "stopped").startswith("stopped     duration")  # not "thresholds breached"
    assert re.search(r"✗ ttft_p99 < 2s +observed 7.46 s", block)
    assert re.search(r"✓ error_rate < 5% +observed 1.17%", block)
    assert "build nightly-abc" in block.splitlines()[0]
    assert _line(block, "report") == "report      /runs/night/report.html"
    assert block.splitlines()[-1] == "soak run: fail (ttft_p99 7.46 s > 2 s); /runs/night/report.html"
    # p50/p90/p95/p99 of TTFT, TPOT and ITL; sub-millisecond values in microseconds, never "0.000651 s"
    assert _line(block, "latency").split() == ["latency", "p50", "p90", "p95", "p99"]
    assert _line(block, "  TTFT").split() == ["TTFT", "120", "ms", "500", "ms", "1.2", "s", "7.46", "s"]
    assert "651 us" in _line(block, "  TPOT") and "0.000651" not in block
    assert "MTBF        no hang in 6.0 min: MTBF above" in block
    assert "\x1b" not in block  # no colour unless on a terminal


def test_a_clean_pass_still_lists_every_threshold_that_held() -> None:
    rows = [{"name": "ttft_p99 < 90s", "metric": "ttft_p99", "expression": "< 90s", "observed": 0.2, "limit": 90.0,
             "passed": True}, {"name": "hangs < 1", "metric": "hangs", "expression": "< 1", "observed": 0,
                               "limit": 1.0, "passed": True}]
    block = end_block(_summary(verdict="pass", exit_code=0, verdict_reasons=[], stop_reason="duration",
                               thresholds={"passed": True, "breached": [], "results": rows}),
                      exit_code=0, files=FILES)
    assert "why" not in block and "thresholds  2 of 2 held" in block
    assert re.search(r"✓ ttft_p99 < 90s +observed 200 ms", block) and re.search(r"✓ hangs < 1 +observed 0", block)
    assert block.splitlines()[-1] == "soak run: pass; /runs/night/report.html"


def test_two_hangs_are_listed_with_their_time_into_the_run() -> None:
    incidents = [{"number": n, "kind": "hang", "rule": "pp_tail_stall", "onset_at": 1000.0 + at,
                  "detected_at": 1004.0 + at, "summary": "hang (pp_tail_stall): tail stage dark" if n == 1 else None}
                 for n, at in ((1, 148), (2, 303))]
    block = end_block(_summary(verdict="fail", exit_code=1, incidents=incidents, restarts=2, verdict_reasons=[
        "incident 1: hang (rule pp_tail_stall)", "incident 2: hang (rule pp_tail_stall)"]), exit_code=1, files=FILES)
    assert _line(block, "why") == "why         2 hangs (pp_tail_stall) at +2:28 and +5:03; the server restarted twice"
    assert "incident 1: hang" not in block
    assert "1. hang (pp_tail_stall) at +2:28: tail stage dark" in block
    assert "2. hang (pp_tail_stall) at +5:03, detected +5:07" in block
    assert "MTBF        2 hangs in 6.0 min: MTBF 3.0 min" in block
    assert "restarts 2" in block


def test_colour_only_on_a_terminal_and_hostile_text_never_reaches_it() -> None:
    hostile = _summary(verdict_reasons=["server said \x1b[2J\x07 boom"])
    assert "\x1b[2J" not in end_block(hostile, exit_code=99, files=FILES, colour=True)
    assert "\x1b[31m✗" in end_block(_summary(), exit_code=99, files=FILES, colour=True)


def test_latency_small_values_in_ms_and_us() -> None:
    assert [format_latency(v) for v in (0.000651, 0.0123, 0.651, 7.46, None)] == \
        ["651 us", "12.3 ms", "651 ms", "7.46 s", "\u2014"]


json_values = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=3), max_leaves=12)
summaries = st.dictionaries(st.sampled_from(["verdict", "verdict_reasons", "thresholds", "latency", "incidents",
                                             "requests", "duration_s", "stopped_by", "stop_reason", "criteria"]),
                            json_values)


@settings(max_examples=100, deadline=None)
@given(obj=summaries, exit_code=st.sampled_from([0, 1, 2, 3, 4, 5, 99, 130]))
def test_the_block_is_total_over_any_summary_and_never_prints_a_control_byte(obj, exit_code) -> None:
    block = end_block(RunSummary.from_json(obj), exit_code=exit_code, files=FILES)
    assert not any(not c.isprintable() and c != "\n" for c in block)
    assert block.splitlines()[-1].startswith("soak run: ")


def test_the_mtbf_is_over_the_time_at_risk_when_given() -> None:
    """The edge passes the time at risk history counts (onset to restart is not at risk)."""
    incidents = [{"number": 1, "kind": "hang", "rule": "pp_tail_stall", "onset_at": 1100.0, "detected_at": 1104.0}]
    summary = _summary(verdict="fail", exit_code=1, incidents=incidents, verdict_reasons=["incident 1: hang"])
    assert "1 hang in 6.0 min: MTBF 6.0 min" in end_block(summary, exit_code=1, files=FILES)
    assert "1 hang in 5.0 min: MTBF 5.0 min" in end_block(summary, exit_code=1, files=FILES, at_risk=(1, 300.0))


def test_an_incident_says_its_detection_latency_as_the_interval_its_onset_allows() -> None:
    hang = {"number": 1, "kind": "hang", "rule": "pp_tail_stall", "onset_at": 1148.7, "detected_at": 1149.6,
            "summary": "hang (pp_tail_stall): detected 0.9s after onset; SIGKILL to 3 processes; GPUs free"}
    interval = end_block(_summary(incidents=[{**hang, "onset_earliest_at": 1148.0, "onset_latest_at": 1148.7}]),
                         exit_code=1, files=FILES)
    assert "1. hang (pp_tail_stall) at +2:29: detected 0.9-1.6 s after the onset; SIGKILL to 3 processes; " \
           "GPUs free" in interval
    # a summary.json written before issue 37 (no onset interval, no detection_latency_s): its one estimate
    old = end_block(_summary(incidents=[hang]), exit_code=1, files=FILES)
    assert "1. hang (pp_tail_stall) at +2:29: detected 0.9 s after the onset (point estimate); SIGKILL" in old


UNDECIDED_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "prove" / "real_undecided"


def test_a_recorded_undecided_run_reads_undecided_exit_5_and_what_would_decide_it() -> None:
    """A real prove: run too short to decide exits 5: CI shows it red, so the block must not
    say PASS. Its headline is UNDECIDED, and why is how much more clean time would decide."""
    summary = RunSummary.from_json(json.loads((UNDECIDED_RUN / "summary.json").read_text()))
    assert summary.exit_code == 5 and summary.verdict is not None and summary.verdict.value == "pass"
    block = end_block(summary, exit_code=summary.exit_code, files=FILES)
    assert _line(block, "verdict") == "verdict     UNDECIDED, exit 5 (the sequential test (prove:) ended undecided: " \
                                      "soak more)"
    assert _line(block, "why") == "why         proof: 65 more clean minutes to accept; 2 hangs before minute 37 reject"
    assert block.splitlines()[-1] == ("soak run: undecided (proof: 65 more clean minutes to accept; 2 hangs before "
                                      "minute 37 reject); /runs/night/report.html")
    assert "PASS" not in block and "soak run: pass" not in block
    # on a terminal: neither pass green nor fail red
    coloured = end_block(summary, exit_code=5, files=FILES, colour=True)
    assert "\x1b[1m\x1b[36mUNDECIDED\x1b[0m" in coloured


def test_an_undecided_run_says_what_would_decide_it_even_where_the_judge_did_not_list_it() -> None:
    proof = {"decision": "truncated", "sentence": "undecided at the truncation (α 5%, β 5%): 1 hang in 163.5 minutes, "
                                                  "leaning fixed"}
    block = end_block(_summary(verdict="pass", exit_code=5, verdict_reasons=[], thresholds=None, proof=proof),
                      exit_code=5, files=FILES)
    assert _line(block, "why") == f"why         proof: {proof['sentence']}"


@pytest.mark.parametrize("exit_code, verdict, word", [
    (0, "pass", "PASS"), (1, "fail", "FAIL"), (2, "aborted", "ABORTED"), (3, "aborted", "ABORTED"),
    (4, "aborted", "ABORTED"), (5, "pass", "UNDECIDED"), (5, "fail", "UNDECIDED"), (99, "fail", "FAIL"),
    (130, "aborted", "ABORTED"), (130, "fail", "FAIL"),
])
def test_the_headline_word_is_the_exit_statuss(exit_code, verdict, word) -> None:
    """0 PASS, 1 FAIL, 5 UNDECIDED (also after a hang: the verdict fails, the test did not decide),
    99 FAIL; 2, 3, 4 and 130 the verdict's word, as before."""
    proof = {"decision": "undecided", "sentence": "41 more clean minutes to accept"} if exit_code == 5 else None
    block = end_block(_summary(verdict=verdict, exit_code=exit_code, proof=proof), exit_code=exit_code, files=FILES)
    assert _line(block, "verdict").startswith(f"verdict     {word}, exit {exit_code} (")
    assert block.splitlines()[-1].startswith(f"soak run: {word.lower()}")
