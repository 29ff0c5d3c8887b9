"""The failure criteria as pure functions (soak.criteria) and their config, and
the summary's metrics-coverage reading: records in, typed decisions out."""

from __future__ import annotations

import re

import pytest

from soak.config import RunConfig
from soak.criteria import CriteriaConfig, CriterionState, RequestTally, judge
from soak.store.summary import MetricsCoverage


def rec(ended: float, outcome: str = "ok", cut_by: str | None = None, error: str | None = None) -> dict:
    # An ok record generated tokens (content arrived: ttft_s set): an ok with nothing is no_output, a failure.
    work = {"ttft_s": 0.1, "output_tokens": 5} if outcome == "ok" else {}
    return {"outcome": outcome, "ended_at": ended, "cut_by": cut_by, "error": error, **work}


def tally_of(records, **config) -> tuple[CriteriaConfig, RequestTally]:
    cfg = CriteriaConfig.model_validate(config)
    return cfg, RequestTally.of(cfg, records)


def states(decision) -> dict[str, CriterionState]:
    return {r.name: r.state for r in decision.results}


def test_error_rate_passes_at_the_threshold_and_fails_past_it() -> None:
    records = [rec(i) for i in range(95)] + [rec(100 + i, "http_status") for i in range(5)]
    cfg, tally = tally_of(records)
    assert states(judge(cfg, tally, final=True))["error_rate"] is CriterionState.PASS  # 5% is allowed
    cfg, tally = tally_of(records + [rec(200, "reset")])
    decision = judge(cfg, tally, final=True)
    assert states(decision)["error_rate"] is CriterionState.FAIL and not decision.passed
    assert decision.reasons == ("error rate 5.9% is above the 5.0% allowed: 6 of 101 finished requests failed "
                                "(http_status 5, reset 1)",)
    # Live, a rate past its threshold is only at risk: it can still recover.
    assert states(judge(cfg, tally, final=False))["error_rate"] is CriterionState.AT_RISK


def test_requests_cut_by_the_harness_count_neither_way() -> None:
    records = [rec(1), rec(2, "aborted", cut_by="drain"), rec(3, "aborted", cut_by="incident"),
               rec(4, "aborted", error="interrupted (SIGTERM)"), rec(5, "aborted", error="drain time ran out"),
               rec(6, "aborted", error="incident 2")]
    cfg, tally = tally_of(records)
    assert (tally.ok, tally.failed, tally.cut) == (1, 0, {"drain": 2, "incident": 2, "interrupt": 1})
    assert judge(cfg, tally, final=True).passed


def test_too_few_requests_and_disabled_criteria_are_inactive() -> None:
    cfg, tally = tally_of([rec(1, "http_status")], error_rate={"min_requests": 5}, no_success={"enabled": False})
    decision = judge(cfg, tally, final=True)
    # work_evidence: no load span given (the load never started), nothing is owed.
    assert states(decision) == {"error_rate": CriterionState.INACTIVE, "no_success": CriterionState.INACTIVE,
                                "work_evidence": CriterionState.INACTIVE, "work_rate": CriterionState.INACTIVE,
                                "server_work": CriterionState.INACTIVE, "wrong_model": CriterionState.INACTIVE}
    assert decision.passed


def test_no_success_needs_failures_across_the_window_with_none_succeeding() -> None:
    # Failures from t=0 to t=130, one success in the middle: two stretches of 60 s, no breach.
    records = [rec(t, "timeout_stall") for t in range(0, 61, 10)] + [rec(65)] + \
              [rec(t, "timeout_stall") for t in range(70, 131, 10)]
    cfg, tally = tally_of(records, no_success={"window": "2m"})
    assert states(judge(cfg, tally, final=True))["no_success"] is CriterionState.PASS
    assert tally.longest.length_s == 60
    # Without the success it is one stretch of 130 s: a breach, and the soak stops.
    records = [r for r in records if r["outcome"] != "ok"]
    cfg, tally = tally_of(records, no_success={"window": "2m"}, error_rate={"enabled": False})
    decision = judge(cfg, tally, final=False)
    assert states(decision)["no_success"] is CriterionState.FAIL and decision.stop
    assert decision.results[1].evidence["breach"] == {"from": 0, "to": 130, "length_s": 130, "failures": 14}
    cfg, tally = tally_of(records, no_success={"window": "2m"}, stop_on_breach=False)
    assert not judge(cfg, tally, final=False).stop


def test_a_slow_healthy_server_is_not_a_stretch() -> None:
    """One failure, then minutes with nothing finishing, then successes: silence is
    the hang detector's business, not this criterion's."""
    cfg, tally = tally_of([rec(0, "timeout_first_token"), rec(400), rec(401)], no_success={"window": "2m"})
    decision = judge(cfg, tally, final=True)
    assert states(decision)["no_success"] is CriterionState.PASS


def test_live_tally_equals_the_tally_of_the_stored_records() -> None:
    from soak.samples import RequestRecord

    cfg = CriteriaConfig()
    live = RequestTally.for_config(cfg)
    stored = []
    for i, outcome in enumerate(["ok", "http_status", "ok", "aborted", "reset"]):
        record = RequestRecord(request_id=f"r{i}", session=None, turn=None, started_at=i, ended_at=i + 0.5,
                               outcome=outcome, cut_by="drain" if outcome == "aborted" else None)
        live.add(record)
        stored.append(record.to_json())
    again = RequestTally.of(cfg, reversed(stored))
    assert judge(cfg, live, final=True) == judge(cfg, again, final=True)


@pytest.mark.parametrize("section, message", [
    ({"error_rate": {"max": 5}}, "not a fraction between 0 and 1"),
    ({"error_rate": {"max": "lots"}}, "is not a fraction such as 0.05"),
    ({"error_rate": {"max": -0.1}}, "greater than or equal to 0"),
    ({"no_success": {"window": 0}}, "greater than 0"),
    ({"no_success": {"window": "soon"}}, "not a duration"),
    ({"no_success": {"min_failures": 0}}, "greater than or equal to 1"),
    ({"error_rates": {}}, "unknown key"),
    ({"work_evidence": {"window": 0}}, "greater than 0"),
    ({"work_evidence": {"window": "1m", "startup": "2m"}}, "startup (120s) must not exceed window (60s)"),
    ({"work_evidence": {"max_gap": "soon"}}, "not a duration"),
    ({"work_evidence": {"min_tokens": -1}}, "greater than or equal to 0"),
    ({"work_evidence": {"floor": 1}}, "unknown key"),
])
def test_criteria_config_is_strict(tmp_path, section, message) -> None:
    from soak.config import load_run_config
    from soak.errors import ConfigError

    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"criteria": section}))
    with pytest.raises(ConfigError) as info:
        load_run_config(path)
    line = str(info.value)
    # An unknown key also names its line in the file (c.yaml:2: criteria.error_rates: unknown key ...).
    where = rf"{re.escape(str(path))}:\d+" if message == "unknown key" else re.escape(str(path))
    assert re.match(rf"{where}: criteria\.", line) and message in line and "\n" not in line


def test_criteria_defaults_and_percent_strings() -> None:
    config = RunConfig.model_validate({"criteria": {"error_rate": {"max": "2.5%"}}})
    assert config.criteria.error_rate.max == pytest.approx(0.025)
    default = RunConfig().criteria
    assert (default.error_rate.max, default.no_success.window, default.stop_on_breach) == (0.05, 120.0, True)


def test_metrics_coverage_names_the_stale_tail_and_the_gaps() -> None:
    cov = MetricsCoverage(stale_after_s=5.0)
    fresh = {"prompt_tokens": 1.0}
    for t in range(0, 20):
        cov.add({"kind": "server", "ts": 100.0 + t, "ok": True, "values": fresh})
    for t in range(20, 30):  # an outage in the middle, then back
        cov.add({"kind": "server", "ts": 100.0 + t, "ok": False, "error": "timeout"})
    for t in range(30, 40):
        cov.add({"kind": "server", "ts": 100.0 + t, "ok": True, "values": fresh})
    for t in range(40, 60):  # unparsable, then nothing
        cov.add({"kind": "server", "ts": 100.0 + t, "ok": False, "error": "unparsable /metrics text: x"})
    report = cov.report(100.0, 160.0)
    assert report["complete"] is False
    assert (report["covered_from"], report["covered_to"], report["stale_after"]) == (100.0, 139.0, 139.0)
    assert report["stale_spans"][0] == {"from": 119.0, "first_failure": 120.0, "to": 130.0, "error": "timeout",
                                         "length_s": 11.0}
    assert report["note"].startswith("server token totals and the prefix-cache hit ratio cover +0s to +39s; "
                                     "/metrics stale after +39s (21s before the load ended)")
    assert "unparsable /metrics text" in report["note"]
    whole = MetricsCoverage(stale_after_s=5.0)
    for t in range(10):
        whole.add({"kind": "server", "ts": float(t), "ok": True, "values": fresh})
    assert whole.report(0.0, 10.0)["complete"] is True and whole.report(0.0, 10.0)["note"] is None


def test_the_summary_judges_by_the_recorded_criteria_even_when_config_yaml_does_not_parse(tmp_path) -> None:
    """config.yaml is for people (a redacted ``***`` is not valid YAML): the run's
    own criteria come from its criteria_config event, never silently the defaults."""
    import json

    from soak.judge import summarize

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("workload:\n  tokenizer:\n    chars_per_token: ***\n")
    events = [{"ts": 100.0, "type": "run_started", "run_id": "x"},
              {"ts": 100.0, "type": "criteria_config",
               "criteria": {"error_rate": {"enabled": False}, "no_success": {"window": 1.5, "min_failures": 3}}},
              {"ts": 110.0, "type": "run_ended", "verdict": "fail", "reason": "criterion", "exit_code": 1}]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run / "requests.jsonl").write_text("".join(
        json.dumps({"outcome": "http_status", "ended_at": 100.0 + t / 2}) + "\n" for t in range(5)))
    summary = summarize(run)
    assert summary["criteria"]["failed"] == ["no_success"] and "note" not in summary["criteria"]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events if e["type"] != "criteria_config"))
    summary = summarize(run)
    # config.yaml read as every reader reads it (a bare *** quoted): it has no criteria, so the defaults, said by no note
    assert summary["criteria"]["failed"] == ["error_rate"] and "note" not in summary["criteria"]
    (run / "config.yaml").write_text("workload: [unclosed\n")  # unreadable whatever the quoting
    summary = summarize(run)
    assert summary["criteria"]["failed"] == ["error_rate"]
    assert "config.yaml unreadable" in summary["criteria"]["note"]
