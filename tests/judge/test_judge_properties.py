"""The judge is a function of the record: judged twice it says the same, and a run
directory judged again later (``soak report DIR``: ``rejudge``) says what the run's
own end said (``conclude``): the same verdict, exit code, reasons, stop reason and
summary.json, whatever incidents, request outcomes, thresholds and ending facts."""

from __future__ import annotations

import itertools
import re
import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from soak.judge import Ending, Problem, conclude, judge, read_recorded, rejudge, summary_json
from soak.judge.reasons import threshold_text, value_text

T0 = 1_800_000_000.0
_dirs = itertools.count()

outcomes = st.sampled_from(["ok", "ok", "ok", "http_status", "reset", "aborted"])
# config.yaml holds the resolved config: each rule in its long form, windows in seconds
thresholds = st.fixed_dictionaries({}, optional={
    "ttft_p99": st.sampled_from([{"threshold": ["< 90s"]}, {"threshold": ["< 1ms"]}]),
    "error_rate": st.sampled_from([{"threshold": ["< 50%"]}, {"threshold": ["< 1%"], "window": 5.0}]),
    "requests_per_s": st.sampled_from([{"threshold": ["> 0.001"]}, {"threshold": ["> 1000000"], "window": 3.0}]),
    "hangs": st.just({"threshold": ["< 1"]}),
})
endings = st.builds(
    lambda problem, interrupted, fault, failed, reason, seen: Ending.live(
        problem=problem, interrupted=interrupted, harness_fault=fault, failed_live=failed,
        stop_reason=reason, load_cut_short=interrupted or fault is not None or problem is not None,
        incidents_seen=seen),
    st.sampled_from([None, None, Problem.ENVIRONMENT, Problem.USAGE]), st.booleans(),
    st.sampled_from([None, None, "while writing the run directory (on_event): OSError: disk full"]),
    st.booleans(), st.sampled_from([None, "duration", "threshold breached (abort_on_fail): x", "interrupted"]),
    st.integers(0, 1))


def _lines(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _write_run(root: Path, *, requests: list[tuple[str, float]], incidents: list[str], on_disk: bool,
               section: dict[str, Any], breach: bool, error_max: float) -> Path:
    run = root / f"run{next(_dirs)}"
    run.mkdir()
    (run / "config.yaml").write_text(json.dumps({"thresholds": section} if section else {}))  # JSON is YAML
    events = [{"ts": T0, "mono": 0.0, "type": "run_started", "run_id": run.name, "duration_s": 30.0, "warmup_s": 0.0},
              {"ts": T0 + 1, "mono": 1.0, "type": "load_started"},
              {"ts": T0 + 1, "mono": 1.0, "type": "criteria_config", "criteria": {"error_rate": {"max": error_max}}}]
    for number, rule in enumerate(incidents, start=1):
        event = {"ts": T0 + 10 + number, "mono": 10.0 + number, "type": "incident", "number": number,
                 "kind": "hang", "rule": rule, "evidence": f"incidents/{number}"}
        if on_disk:
            (run / "incidents" / str(number)).mkdir(parents=True)
            (run / "incidents" / str(number) / "incident.json").write_text(json.dumps({"record": event}))
        else:
            events.append(event)
    if breach:
        events.append({"ts": T0 + 20, "mono": 20.0, "type": "threshold_breached", "threshold": "ttft_p99 < 1ms",
                       "observed": 0.5, "reason": "ttft_p99 = 500 ms: breaches < 1ms"})
    events.append({"ts": T0 + 29, "mono": 29.0, "type": "load_stopped"})
    _lines(run / "events.jsonl", events)
    _lines(run / "requests.jsonl", [
        {"request_id": f"r{i}", "outcome": outcome, "started_at": T0 + 1 + i * 0.5, "ended_at": T0 + 2 + i * 0.5 + e2e,
         "started_mono": 1 + i * 0.5, "ended_mono": 2 + i * 0.5 + e2e, "ttft_s": e2e / 4, "e2e_s": e2e,
         "tpot_s": 0.01, "itl_p50_s": 0.01, "output_tokens": 10 if outcome == "ok" else 0, "prompt_tokens": 100}
        for i, (outcome, e2e) in enumerate(requests)])
    _lines(run / "samples.jsonl", [
        {"ts": T0 + s, "mono": float(s), "kind": "server", "ok": True,
         "values": {"prompt_tokens": 100.0 * s, "generation_tokens": 10.0 * s,
                    "prefix_cache_hits": 5.0 * s, "prefix_cache_queries": 10.0 * s}}
        for s in range(0, 30, 2)])
    return run


def _writer(run: Path):
    def record_end(fields: dict[str, Any]) -> dict[str, Any]:
        event = {"ts": T0 + 30, "type": "run_ended", "mono": 30.0, **fields}
        with (run / "events.jsonl").open("a") as fh:
            fh.write(json.dumps(event) + "\n")
        return event
    return record_end


runs = st.fixed_dictionaries({
    "requests": st.lists(st.tuples(outcomes, st.floats(0.05, 3.0)), max_size=30),
    "incidents": st.lists(st.sampled_from(["gen_tokens_frozen", "pp_tail_stall"]), max_size=2),
    "on_disk": st.booleans(),
    "section": thresholds,
    "breach": st.booleans(),
    "error_max": st.sampled_from([0.05, 0.5]),
})


@settings(max_examples=60, deadline=None)
@given(spec=runs, ending=endings)
def test_rejudging_the_directory_says_what_the_runs_end_said(tmp_path_factory, spec, ending) -> None:
    run = _write_run(tmp_path_factory.mktemp("judge"), **spec)
    at_end, summary = conclude(run, ending, record_end=_writer(run))
    again, recorded = rejudge(run)
    assert (again.verdict, again.exit_code, again.reasons, again.stop_reason) == \
        (at_end.verdict, at_end.exit_code, at_end.reasons, at_end.stop_reason)
    assert again.criteria == at_end.criteria and again.breached == at_end.breached
    assert json.loads(json.dumps(recorded.raw)) == json.loads(json.dumps(summary))
    if spec["section"]:  # every threshold judged, none refused as unreadable
        assert "error" not in summary["thresholds"] and summary["thresholds"]["results"]
    # what the run knew at its end is in run_ended: a ladder over the same facts
    assert recorded.exit_code == at_end.exit_code and summary["exit_code"] == at_end.exit_code


@settings(max_examples=40, deadline=None)
@given(spec=runs, ending=endings)
def test_the_judge_is_a_function_of_the_record(tmp_path_factory, spec, ending) -> None:
    run = _write_run(tmp_path_factory.mktemp("judge"), **spec)
    recorded = read_recorded(run, cut_short=ending.load_cut_short)
    first, second = judge(recorded, ending), judge(recorded, ending)
    assert first == second
    assert summary_json(recorded, first) == summary_json(recorded, second)
    # the record on disk decides the verdict: an incident or a failed criterion fails the run
    if spec["incidents"] or not first.criteria.passed:
        assert first.verdict.value == "fail" and first.failed
    if first.exit_code == 99:
        assert not first.failed and first.breached


def test_a_run_without_run_ended_is_cut_off(tmp_path) -> None:
    run = _write_run(tmp_path, requests=[("ok", 0.5)] * 4, incidents=[], on_disk=False, section={},
                     breach=False, error_max=0.05)
    judgement, summary = rejudge(run)
    assert judgement.exit_code is None and summary.cut_off and summary.verdict.value == "aborted"


def test_an_older_run_ended_is_read_from_its_exit_code(tmp_path) -> None:
    """A run_ended written before it carried the ending's facts: exit 130 was an interrupt."""
    run = _write_run(tmp_path, requests=[("ok", 0.5)] * 4, incidents=[], on_disk=False,
                     section={"requests_per_s": {"threshold": ["> 1000000"]}}, breach=False, error_max=0.05)
    _writer(run)({"verdict": "aborted", "reason": "interrupted", "exit_code": 130})
    judgement, summary = rejudge(run)
    assert (judgement.exit_code, summary.verdict.value, summary.stop_reason) == (130, "aborted", "interrupted")


@settings(max_examples=60, deadline=None)
@given(spec=runs, ending=endings)
def test_a_run_that_did_not_pass_says_why_with_each_breach_and_its_observed_value(tmp_path_factory, spec,
                                                                                 ending) -> None:
    """verdict_reasons is never empty on a run that did not pass (an exit-99 run
    had ``[]``), and every breached threshold is listed with what was observed."""
    run = _write_run(tmp_path_factory.mktemp("judge"), **spec)
    judgement = judge(read_recorded(run, cut_short=ending.load_cut_short), ending)
    if judgement.verdict.value != "pass" or judgement.exit_code not in (0, None):
        assert judgement.reasons, judgement
    text = "\n".join(judgement.reasons)
    for result in judgement.thresholds or ():
        if result.breached:
            if result.observed is None:  # no data at the end: said so, or by the live breach's value
                assert result.metric in text, text
            else:
                assert f"{result.metric} {value_text(result.metric, result.observed)}" in text, text
    if spec["breach"]:  # the live abort_on_fail stop (500 ms observed then) shows with a value
        assert re.search(r"ttft_p99 [0-9.]+ (us|ms|s) > 1 ms", text), text
    if judgement.exit_code == 99:
        assert len(judgement.reasons) >= len(judgement.breached)


def test_a_breach_reads_as_the_observed_value_against_the_limit() -> None:
    breach = {"metric": "ttft_p99", "observed": 7.46, "limit": 2.0, "expression": "< 2s", "passed": False}
    assert threshold_text(breach) == "ttft_p99 7.46 s > 2 s"
    windowed = {**breach, "metric": "error_rate", "observed": 0.125, "limit": 0.01, "expression": "< 1%",
                "window_s": 30.0}
    assert threshold_text(windowed) == "error_rate 12.5% > 1% in the worst 30 s window"
    held = {**breach, "observed": 0.000651, "passed": True}
    # the one latency formatter (soak.durations.format_latency, via format_value) says 651 us
    assert threshold_text(held) in ("ttft_p99 0.651 ms (< 2s holds)", "ttft_p99 651 us (< 2s holds)")
    assert threshold_text({**breach, "observed": None}) == "ttft_p99: no data, so < 2s cannot be shown"
