"""MTBF and A/B statistics against values from chi-square tables and closed forms."""

from __future__ import annotations

import math

import pytest

from soak.report.stats import (
    Change, compare_means, compare_quantiles, compare_rates, mtbf_estimate, required_clean_exposure,
)
from soak.thresholds.metrics import Better

# Chi-square quantiles from the printed tables (not from scipy).
CHI2_2DF_95 = 5.9915   # P(X <= x) = 0.95, 2 degrees of freedom
CHI2_8DF_975 = 17.5345
CHI2_6DF_025 = 1.2373


def test_clean_run_proves_exposure_over_three_at_95_percent():
    t = 66 * 60.0
    est = mtbf_estimate(0, t, confidence=0.95)
    assert est.one_sided_lower_s == pytest.approx(2 * t / CHI2_2DF_95, rel=1e-4)
    assert t / est.one_sided_lower_s == pytest.approx(3.00, abs=0.005)
    assert est.point_s is None and math.isinf(est.upper_s)
    assert est.sentence() == "no hang in 66 min: MTBF above 22 min at 95% confidence"


def test_three_hangs_in_an_hour_give_the_exact_chi_square_interval():
    t = 3600.0
    est = mtbf_estimate(3, t, confidence=0.95)
    assert est.point_s == pytest.approx(1200.0)
    assert est.lower_s == pytest.approx(2 * t / CHI2_8DF_975, rel=1e-4)  # 410.6 s
    assert est.upper_s == pytest.approx(2 * t / CHI2_6DF_025, rel=1e-3)  # 5819 s
    assert "3 hangs in 60 min" in est.sentence()


def test_plan_for_a_15_minute_baseline_is_three_baselines_long():
    assert required_clean_exposure(15 * 60, confidence=0.95) == pytest.approx(15 * 60 * CHI2_2DF_95 / 2, rel=1e-4)
    # Allowing a hang needs more exposure; more confidence needs more too.
    assert required_clean_exposure(900, allowed_failures=1) > required_clean_exposure(900)
    assert required_clean_exposure(900, confidence=0.99) > required_clean_exposure(900, confidence=0.95)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.5, 1.5])
def test_confidence_outside_zero_one_is_refused(bad):
    with pytest.raises(ValueError):
        mtbf_estimate(1, 100.0, confidence=bad)


def test_rate_ratio_test_matches_the_binomial_closed_form():
    # 10 hangs in an hour against none in an hour: p = 2 * 0.5**10 under equal rates.
    d = compare_rates("hang rate", 10, 3600, 0, 3600)
    assert d.p_value == pytest.approx(2 * 0.5**10)
    assert d.verdict is Change.BETTER
    assert d.a.value == pytest.approx(10.0) and d.b.value == 0.0
    same = compare_rates("hang rate", 1, 3600, 1, 3600)
    assert same.verdict is Change.SAME and same.p_value == pytest.approx(1.0)


def test_welch_and_bootstrap_verdicts_follow_the_metric_direction():
    base = [100.0 + (i % 7) for i in range(40)]
    slower = [80.0 + (i % 7) for i in range(40)]
    assert compare_means("tput", "tok/s", base, slower, better=Better.HIGHER).verdict is Change.WORSE
    assert compare_means("tput", "tok/s", base, list(base), better=Better.HIGHER).verdict is Change.SAME
    assert compare_quantiles("ttft", "s", base, slower, 0.5, better=Better.LOWER).verdict is Change.BETTER
    assert compare_means("tput", "tok/s", [], slower, better=Better.HIGHER).verdict is Change.UNKNOWN
