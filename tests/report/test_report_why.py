"""The top of report.html on data: why a run failed, the plain stop line, the
thresholds rows, and which warnings are the server's (soak.report.why)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from soak.report.why import (breach_text, clock, harness_windows, pass_line, server_warnings, stop_line,
                             threshold_rows, verdict_reasons)
from soak.summary_file import RunSummary

T0 = 1_800_000_000.0


def _summary(**fields) -> RunSummary:
    return RunSummary.from_json({"verdict": "fail", "started_at": T0, **fields})


def _hang(number: int, onset_s: float, rule: str = "pp_tail_stall") -> dict:
    return {"number": number, "kind": "hang", "rule": rule, "onset_at": T0 + onset_s, "detected_at": T0 + onset_s + 3}


def _breached_ttft(observed: float) -> dict:
    return {"name": "ttft_p99 < 2s", "metric": "ttft_p99", "expression": "< 2s", "scope": "run",
            "outcome": "breached", "observed": observed, "limit": 2.0, "passed": False, "window_s": None,
            "window_end": None}


@settings(max_examples=100, deadline=None)
@given(st.floats(min_value=-10_000, max_value=200_000))
def test_a_clock_never_reads_plus_minus(seconds: float) -> None:
    text = clock(seconds)
    assert "+-" not in text and text[0] in "+-"
    if abs(seconds) < 0.5:
        assert text == "+0:00"


def test_the_banner_names_the_hangs_their_times_the_restarts_and_the_breached_threshold() -> None:
    summary = _summary(incidents=[_hang(1, 148), _hang(2, 303)], restarts=2,
                       thresholds={"passed": False, "results": [_breached_ttft(7.46)]})
    assert verdict_reasons(summary, start=T0) == (
        "2 hangs (pp_tail_stall) at +2:28 and +5:03, each detected 3.0 s after its onset (point estimates)",
        "the server restarted twice", "ttft_p99 7.46 s \u2265 2s")


def test_the_banner_gives_the_detection_latency_as_the_interval_the_onsets_allow() -> None:
    one = {**_hang(1, 148), "onset_earliest_at": T0 + 147.3, "onset_latest_at": T0 + 148.0,
           "detected_at": T0 + 148.9}
    assert verdict_reasons(_summary(incidents=[one]), start=T0) == (
        "1 hang (pp_tail_stall) at +2:28, detected 0.9-1.6 s after the onset",)
    # the second has no interval (an old summary.json): its one estimate, said as one
    assert verdict_reasons(_summary(incidents=[one, _hang(2, 303)]), start=T0)[0] == (
        "2 hangs (pp_tail_stall) at +2:28 and +5:03, each detected 0.9-3.0 s after its onset "
        "(1 of them a point estimate)")


def test_a_sub_second_breach_is_written_in_milliseconds_and_a_window_is_named() -> None:
    row = {**_breached_ttft(0.000651), "expression": "< 500us"}
    assert breach_text(row) == "ttft_p99 651 us \u2265 500us"
    windowed = {**_breached_ttft(0.25), "expression": "< 100ms", "window_s": 60.0}
    assert breach_text(windowed) == "ttft_p99 250 ms \u2265 100ms in the worst 60 s window"


def test_a_pass_has_no_reasons_and_says_what_held_and_the_stop_is_a_plain_fact() -> None:
    summary = RunSummary.from_json({
        "verdict": "pass", "started_at": T0, "stop_reason": "duration", "planned_duration_s": 3960,
        "thresholds": {"passed": True, "results": [{"metric": "ttft_p99", "expression": "< 2s", "passed": True,
                                                    "observed": 0.2, "outcome": "passed"}]}})
    assert verdict_reasons(summary, start=T0) == ()
    assert pass_line(summary) == "Passed: no hang, no crash, all 1 threshold held."
    assert stop_line(summary) == "The run ended: its planned duration (66 min) was reached."


def test_threshold_rows_carry_the_observed_value_the_window_and_when_it_broke() -> None:
    windowed = {"metric": "error_rate", "expression": "< 1%", "outcome": "breached", "passed": False,
                "observed": 0.125, "window_s": 60.0, "window_end": T0 + 300}
    summary = _summary(thresholds={"results": [_breached_ttft(0.0123), windowed,
                                               {"metric": "tpot_p99", "expression": "< 1s", "outcome": "no_data",
                                                "passed": False, "observed": None}]})
    ttft, errors, tpot = threshold_rows(summary, start=T0)
    assert (ttft.held, ttft.observed, ttft.window, ttft.breached_at) == (False, "12.3 ms", "whole run",
                                                                         "over the whole run")
    assert (errors.observed, errors.window, errors.breached_at) == ("12.5%", "worst 60 s window", "+4:00 to +5:00")
    assert (tpot.observed, tpot.breached_at) == ("no data", "no data")


def _incident_events(kill_at: float, restart_done_at: float, number: int = 1) -> list[dict]:
    return [{"type": "incident_started", "ts": T0 + kill_at, "number": number},
            {"type": "incident", "ts": T0 + kill_at, "number": number, "detected_at": T0 + kill_at},
            {"type": "restart_done", "ts": T0 + restart_done_at, "number": number}]


def _metrics(*spans: tuple[float, float | None, float | None]) -> dict:
    return {"stale_after_s": 5.0, "covered_from": T0, "note": "server token totals ... ClientConnectorError",
            "stale_spans": [{"from": T0 + a, "first_failure": None if f is None else T0 + f,
                             "to": None if b is None else T0 + b, "error": "ClientConnectorError"}
                            for a, f, b in spans]}


def test_stale_metrics_during_the_harness_kill_and_at_the_stop_are_no_server_warning() -> None:
    events = _incident_events(100, 110) + [{"type": "load_stopped", "ts": T0 + 300}]
    # the last fresh scrape a moment before the kill, no answer until the restarted server is up;
    # then the stop at the end
    summary = _summary(server_metrics=_metrics((99.0, None, 111.0), (299.5, 300.4, None)))
    assert server_warnings(summary, events) == []
    gpu_gone = {"type": "gpu_source_stale", "ts": T0 + 104, "message": "GPU source sim is stale"}
    assert server_warnings(summary, events + [gpu_gone]) == []


def test_a_real_stale_metrics_span_with_no_kill_still_warns() -> None:
    events = _incident_events(100, 110) + [{"type": "load_stopped", "ts": T0 + 300}]
    summary = _summary(server_metrics=_metrics((200.0, 201.0, 240.0)))
    (warning,) = server_warnings(summary, events)
    assert warning.startswith("Server metrics: ") and "ClientConnectorError" in warning
    # and on a run with no incident at all
    assert server_warnings(summary, [{"type": "load_stopped", "ts": T0 + 300}])


def test_harness_windows_cover_each_kill_to_its_restart_and_the_stop_onwards() -> None:
    events = _incident_events(100, 110) + _incident_events(200, 220, number=2) + [
        {"type": "load_stopped", "ts": T0 + 300}]
    windows = harness_windows(events, grace_s=5.0)
    assert [(w.start - T0, w.end - T0) for w in windows] == [(95, 115), (195, 225), (295, math.inf)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["hang", "crash"]), st.sampled_from(["pp_tail_stall", "log_signature"]),
                          st.floats(min_value=0, max_value=86_400)), max_size=6),
       st.integers(min_value=0, max_value=5))
def test_every_incident_is_counted_once_with_its_time_and_no_reason_reads_plus_minus(incidents, restarts) -> None:
    summary = _summary(incidents=[{"number": i, "kind": kind, "rule": rule, "onset_at": T0 + at}
                                  for i, (kind, rule, at) in enumerate(incidents, start=1)], restarts=restarts)
    reasons = verdict_reasons(summary, start=T0)
    counted = 0
    for reason in reasons:
        if reason.split()[1].startswith(("hang", "crash")):
            counted += int(reason.split()[0])
    assert counted == len(incidents)
    for _, _, at in incidents:
        assert any(clock(at) in r for r in reasons)
    assert ("the server restarted" in " ".join(reasons)) is (restarts > 0)
    assert all("+-" not in r for r in reasons)
