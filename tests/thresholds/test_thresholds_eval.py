"""Threshold expressions and their evaluation, pure: every operator, every unit,
every kind of bad expression, the whole run and sliding windows."""

from __future__ import annotations

import pytest

from soak.thresholds.evaluate import (
    Outcome, ThresholdConfigError, WindowBook, compile_thresholds, evaluate_run, evaluate_windows, thresholds_entry,
)
from soak.thresholds.expr import ThresholdSyntaxError, parse_condition
from soak.thresholds.metrics import RUN_METRICS, run_value


@pytest.mark.parametrize("op, holds_below, holds_at, holds_above", [
    ("<", True, False, False), ("<=", True, True, False), (">", False, False, True),
    (">=", False, True, True), ("==", False, True, False), ("!=", True, False, True),
])
def test_each_operator_at_and_around_its_limit(op, holds_below, holds_at, holds_above):
    c = parse_condition("ttft_p99", f"{op} 90s")
    assert (c.holds(89.999), c.holds(90.0), c.holds(90.001)) == (holds_below, holds_at, holds_above)


@pytest.mark.parametrize("metric, text, seconds_or_value", [
    ("ttft_p99", "< 90s", 90.0), ("tpot_p50", "< 40ms", 0.040), ("tpot_p50", "<500us", 0.0005),
    ("tpot_p50", "< 500µs", 0.0005), ("e2e_p99", "< 2m", 120.0), ("e2e_p99", "< 2min", 120.0),
    ("e2e_max", "< 1.5h", 5400.0), ("ttft_p50", "<= 1e-1s", 0.1),
    ("error_rate", "< 1%", 0.01), ("error_rate", "< 0.01", 0.01), ("prefix_hit_ratio", "> 0.9", 0.9),
    ("prefix_hit_ratio", ">= 90%", 0.9),
    ("output_tokens_per_s", "> 60", 60.0), ("output_tokens_per_s", "> 60/s", 60.0),
    ("output_tokens_per_s", "> 3600/min", 60.0), ("requests_per_s", "> 7200/h", 2.0), ("hangs", "< 1", 1.0),
])
def test_each_unit_is_read_into_the_metrics_base_unit(metric, text, seconds_or_value):
    assert parse_condition(metric, text).value == pytest.approx(seconds_or_value)


@pytest.mark.parametrize("metric, text, words", [
    ("ttft_p99", "=< 90s", "unknown operator '=<'"),
    ("ttft_p99", "<< 90s", "unknown operator '<<'"),
    ("ttft_p99", "~ 90s", "unknown operator '~'"),
    ("ttft_p99", "90s", "no operator"),
    ("ttft_p99", "< 90", "needs a unit"),
    ("ttft_p99", "< 90q", "unknown unit 'q'"),
    ("ttft_p99", "< 90%", "unknown unit '%'"),
    ("error_rate", "< 1ms", "unknown unit 'ms'"),
    ("output_tokens_per_s", "> 60s", "unknown unit 's'"),
    ("prefix_hit_ratio", "> high", "is not an expression"),
    ("ttft_p99", "< ninety s", "is not an expression"),
    ("ttft_p99", "", "is not an expression"),
    ("ttft_p99", 5, "expected an expression"),
])
def test_bad_expressions_say_what_is_wrong(metric, text, words):
    with pytest.raises(ThresholdSyntaxError) as info:
        parse_condition(metric, text)
    assert words in str(info.value)


def test_compile_names_the_field_of_a_bad_metric_or_expression():
    with pytest.raises(ThresholdConfigError) as info:
        compile_thresholds({"ttft_p999": {"threshold": ("< 9s",)}})
    assert info.value.field == "thresholds.ttft_p999"
    assert info.value.message.startswith("unknown metric 'ttft_p999'; did you mean 'ttft_p99'? (known: ttft_p50")
    with pytest.raises(ThresholdConfigError) as info:
        compile_thresholds({"gpu_temperature": {"threshold": ("< 90",)}})
    assert "unknown metric 'gpu_temperature', known: ttft_p50" in info.value.message  # nothing close: the list
    with pytest.raises(ThresholdConfigError) as info:
        compile_thresholds({"tpot_p50": {"threshold": ("< 40ms", "< 4 parsecs")}})
    assert info.value.field == "thresholds.tpot_p50[1]"


SUMMARY = {
    "duration_s": 100.0,
    "requests": {"ok": 98, "failed": 3, "by_outcome": {"ok": 98, "http_status": 2, "timeout_stall": 1, "aborted": 4}},
    "latency": {"ttft_s": {"p50": 1.2, "p99": 95.0}, "tpot_s": {"p50": 0.035, "p99": 0.2}},
    "throughput": {"generated_tokens_per_s": 75.0, "requests_per_s": 1.0},
    "prefix_cache_hit_ratio": 0.93,
    "incidents": [],
}


def test_the_whole_run_is_judged_from_summary_json_with_reasons():
    thresholds = compile_thresholds({
        "ttft_p99": {"threshold": ("< 90s",)}, "tpot_p50": {"threshold": ("< 40ms",)},
        "error_rate": {"threshold": ("< 1%",)}, "output_tokens_per_s": {"threshold": ("> 60",)},
        "prefix_hit_ratio": {"threshold": ("> 0.9",)}, "hangs": {"threshold": ("== 0",)},
        "itl_p50": {"threshold": ("< 1s",)},
    })
    results = {r.metric: r for r in evaluate_run(thresholds, SUMMARY)}
    assert results["ttft_p99"].outcome is Outcome.BREACHED
    assert results["ttft_p99"].reason == "ttft_p99 = 95 s over the run: breaches < 90s"
    assert results["tpot_p50"].outcome is Outcome.PASSED and "35 ms" in results["tpot_p50"].reason
    # 3 the server failed out of 101 it answered; the 4 the harness cut count for neither side
    assert results["error_rate"].observed == pytest.approx(3 / 101)
    assert results["error_rate"].outcome is Outcome.BREACHED
    assert results["output_tokens_per_s"].outcome is Outcome.PASSED
    assert results["prefix_hit_ratio"].outcome is Outcome.PASSED
    assert results["hangs"].outcome is Outcome.PASSED
    # nothing recorded to judge: not a pass
    assert results["itl_p50"].outcome is Outcome.NO_DATA and results["itl_p50"].breached
    entry = thresholds_entry(results.values())
    assert entry["passed"] is False and set(entry["breached"]) == {"ttft_p99 < 90s", "error_rate < 1%", "itl_p50 < 1s"}


def test_the_error_rate_figure_the_run_store_records_is_the_one_judged():
    assert run_value("error_rate", {**SUMMARY, "error_rate": 0.5}) == 0.5
    assert run_value("error_rate", {**SUMMARY, "error_rate": {"value": 0.25}}) == 0.25


def _requests(start, end, every, ttft, tokens=10, outcome="ok"):
    t, out = start, []
    while t < end:
        out.append({"ended_at": t, "outcome": outcome, "ttft_s": ttft, "tpot_s": 0.03, "output_tokens": tokens})
        t += every
    return out


def test_a_sliding_window_finds_the_bad_minute_the_whole_run_hides():
    # 10 minutes at TTFT 1 s, one minute at 30 s, 10 minutes at 1 s again
    requests = _requests(0, 600, 1.0, 1.0) + _requests(600, 660, 1.0, 30.0) + _requests(660, 1260, 1.0, 1.0)
    thresholds = compile_thresholds({"ttft_p50": {"threshold": ("< 5s",), "window": 60.0}})
    run = evaluate_run(thresholds, {"latency": {"ttft_s": {"p50": 1.0}}})
    windows = evaluate_windows(thresholds, requests, [], start=0.0, end=1260.0)
    assert run[0].outcome is Outcome.PASSED
    assert windows[0].outcome is Outcome.BREACHED and windows[0].observed == 30.0
    # the first window whose median is in the slow minute: more than half of it after 600 s
    assert 630 <= windows[0].window_end <= 690 and windows[0].windows > 100
    assert windows[0].name == "ttft_p50 < 5s (every 60 s window)"


def test_windowed_throughput_and_hit_ratio_from_server_counters():
    requests = _requests(0, 120, 1.0, 1.0, tokens=100) + _requests(120, 180, 1.0, 1.0, tokens=10)
    server = [(float(t), {"prefix_cache_hits": 9.0 * t, "prefix_cache_queries": 10.0 * t}) for t in range(0, 181)]
    thresholds = compile_thresholds({"output_tokens_per_s": {"threshold": ("> 50",), "window": 30.0},
                                     "prefix_hit_ratio": {"threshold": ("> 0.85",), "window": 30.0}})
    by = {r.metric: r for r in evaluate_windows(thresholds, requests, server, start=0.0, end=180.0)}
    assert by["output_tokens_per_s"].outcome is Outcome.BREACHED and by["output_tokens_per_s"].observed == pytest.approx(29 * 10 / 30)  # 151..179 s
    assert by["prefix_hit_ratio"].outcome is Outcome.PASSED and by["prefix_hit_ratio"].observed == pytest.approx(0.9)


def test_a_live_run_aborts_on_the_first_breached_window_after_the_delay():
    thresholds = compile_thresholds({
        "error_rate": {"threshold": ("< 10%",), "window": 10.0, "abort_on_fail": True, "delay_abort_eval": 30.0},
        "ttft_p99": {"threshold": ("< 1s",)},  # not abort_on_fail: judged at the end only
    })
    book = WindowBook(thresholds, load_started_at=0.0)
    for t in range(0, 60):
        failed = 10 <= t < 16 or t >= 50
        book.add_request({"ended_at": float(t), "outcome": "http_status" if failed else "ok", "ttft_s": 9.0,
                          "output_tokens": 1})
        decision = book.check(float(t))
        if t < 50:
            assert decision is None, t  # the burst at 10-16 s falls inside delay_abort_eval
    assert decision is not None and decision.metric == "error_rate" and decision.outcome is Outcome.BREACHED
    assert "breaches < 10%" in decision.reason


def test_every_metric_name_has_a_label_and_direction():
    for name, spec in RUN_METRICS.items():
        assert spec.name == name and spec.label and spec.better.value in ("higher", "lower")


@pytest.mark.parametrize("yaml_text, field, words", [
    ('ttft_p99: "< 90s"\n  ttft_p999: "< 9s"', "thresholds.ttft_p999", "unknown metric 'ttft_p999'"),
    ('ttft_p99: "=< 90s"', "thresholds.ttft_p99", "unknown operator '=<'"),
    ('tpot_p50: "< 40"', "thresholds.tpot_p50", "needs a unit"),
    ('error_rate: "< 1 percent"', "thresholds.error_rate", "unknown unit 'percent'"),
    ('error_rate: {threshold: "< 1%", window: 5m, abort: true}', "thresholds.error_rate.abort", "unknown key"),
    ('error_rate: {threshold: "< 1%", windw: 5m}', "thresholds.error_rate.windw", "did you mean 'window'?"),
    ('hangs: {threshold: "< 1", window: 5m}', "thresholds.hangs.window", "whole-run figure"),
    ('ttft_p99: 90', "thresholds.ttft_p99", "expected an expression"),
    ('ttft_p99: {threshold: "< 9s", window: 0s}', "thresholds.ttft_p99.window", "greater than 0"),
])
def test_a_bad_thresholds_section_is_exit_2_with_one_line_naming_file_and_field(tmp_path, capsys, yaml_text, field, words):
    from soak.cli import main as soak_main

    path = tmp_path / "night.yaml"
    path.write_text(f"duration: 10s\nthresholds:\n  {yaml_text}\n")
    assert soak_main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    # An unknown key also names its line (the section starts on line 2, the rule on line 3).
    where = f"{path}:3" if field.endswith((".abort", ".windw")) else str(path)
    assert err.startswith(f"soak validate: {where}: {field}: ") and words in err, err
