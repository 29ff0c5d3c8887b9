"""p95 beside p50, p90 and p99: in the one percentile helper, summary.json's
latency block, thresholds (``ttft_p95`` was refused) and ``soak compare``."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.percentiles import LATENCY_QUANTILES, latency_stats, percentiles
from soak.thresholds.evaluate import Outcome, compile_thresholds, evaluate_run
from soak.thresholds.metrics import RUN_METRICS, window_values

samples = st.lists(st.floats(min_value=0, max_value=1e4, allow_nan=False), min_size=1, max_size=200)


@settings(max_examples=100, deadline=None)
@given(samples)
def test_quantiles_are_ordered_for_any_samples(values):
    stats = latency_stats(values)
    assert min(values) <= stats["p50"] <= stats["p90"] <= stats["p95"] <= stats["p99"] <= stats["max"] == max(values)
    assert stats["mean"] == pytest.approx(math.fsum(values) / len(values))
    for method in ("linear", "nearest_rank"):
        p50, p90, p95, p99 = percentiles(values, (50, 90, 95, 99), method=method)
        assert p50 <= p90 <= p95 <= p99


def test_p95_of_a_hundred_values_sits_between_p90_and_p99():
    stats = latency_stats([i / 100 for i in range(1, 101)])  # 10 ms .. 1 s
    assert stats["p95"] == pytest.approx(0.9505)
    assert list(stats) == ["mean", "p50", "p90", "p95", "p99", "max"]
    assert latency_stats([]) == dict.fromkeys(["mean", "p50", "p90", "p95", "p99", "max"])


@pytest.mark.parametrize("name", ["ttft_p95", "tpot_p95", "e2e_p95", "itl_p95", "itl_p90", "itl_p99"])
def test_p95_thresholds_compile_and_judge_from_summary_json(name):
    stat = name.split("_")[0]
    key = "itl_p50_s" if stat == "itl" else f"{stat}_s"
    q = name.split("_")[1]
    (threshold,) = compile_thresholds({name: {"threshold": ("< 2s",)}})
    summary = {"latency": {key: {q: 7.46}}}
    (result,) = evaluate_run([threshold], summary)
    assert result.outcome is Outcome.BREACHED and result.observed == 7.46
    assert "7.46 s" in result.reason


def test_every_latency_has_the_same_quantiles_as_thresholds():
    for stat in ("ttft", "tpot", "e2e", "itl"):
        for q in LATENCY_QUANTILES:
            assert RUN_METRICS[f"{stat}_{q}"].thresholdable


def test_a_window_has_p95_too():
    requests = [{"outcome": "ok", "ended_at": i, "ttft_s": i / 100, "tpot_s": 0.01, "e2e_s": 1.0, "itl_p50_s": 0.01}
                for i in range(1, 101)]
    values = window_values(requests, [], span_s=100)
    assert values["ttft_p90"] <= values["ttft_p95"] <= values["ttft_p99"]
    assert values["ttft_p95"] == pytest.approx(0.9505)
    assert values["itl_p95"] == pytest.approx(0.01)
