"""Verdict statistics: MTBF from hang counts, and A/B differences with their uncertainty.

Hangs are modelled as a Poisson process in exposure time (seconds of load
actually applied). With ``n`` events in ``T`` the exact (Garwood) interval for
the mean time between failures comes from chi-square quantiles:

    lower = 2T / chi2(1 - alpha/2; 2n + 2)      upper = 2T / chi2(alpha/2; 2n)

and a clean run proves the one-sided bound ``MTBF > 2T / chi2(c; 2)`` =
``T / -ln(1 - c)`` (T/3.00 at 95%). Everything here is pure: numbers in,
frozen records out. scipy loads only where a figure needs it: scipy.special for
a chi-square quantile of more than 2 degrees of freedom or a t quantile,
scipy.stats for a comparison's tests; the report at a hang-free run's end needs
neither.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Sequence

import numpy as np

from soak.durations import format_duration
from soak.thresholds.metrics import Better


def _chi2_ppf(q: float, df: int) -> float:
    if df == 2:
        # chi2(2) is the exponential of mean 2: the clean run's bound, in every
        # hang-free run's report, needs no scipy import (a second of CPU).
        return -2.0 * math.log1p(-q)
    from scipy import special

    # chi2(df) is gamma(df/2, scale 2): scipy.stats.chi2.ppf computes the same.
    return float(2.0 * special.gammaincinv(df / 2.0, q))


def _t_ppf(p: float, df: int) -> float:
    from scipy import special

    return float(special.stdtrit(df, p))


@dataclass(frozen=True)
class MtbfEstimate:
    failures: int
    exposure_s: float
    confidence: float
    point_s: float | None  # T/n; None with no failure
    lower_s: float  # two-sided exact interval
    upper_s: float  # math.inf with no failure
    one_sided_lower_s: float  # "MTBF above this at `confidence`"

    def sentence(self, what: str = "hang") -> str:
        pct = f"{self.confidence * 100:g}%"
        exposure = format_duration(self.exposure_s, approx=True)
        if self.failures == 0:
            return (
                f"no {what} in {exposure}: MTBF above {format_duration(self.one_sided_lower_s, approx=True)} "
                f"at {pct} confidence"
            )
        plural = "" if self.failures == 1 else "s"
        return (
            f"{self.failures} {what}{plural} in {exposure}: MTBF {format_duration(self.point_s or 0, approx=True)} "
            f"({pct} interval {format_duration(self.lower_s, approx=True)} to {format_duration(self.upper_s, approx=True)})"
        )


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")


def mtbf_estimate(failures: int, exposure_s: float, *, confidence: float = 0.95) -> MtbfEstimate:
    """Exact chi-square MTBF interval for ``failures`` events in ``exposure_s`` seconds."""
    _check_confidence(confidence)
    if failures < 0:
        raise ValueError("failures cannot be negative")
    if exposure_s <= 0:
        raise ValueError("exposure must be positive")
    alpha = 1.0 - confidence
    two_t = 2.0 * exposure_s
    lower = two_t / _chi2_ppf(1.0 - alpha / 2.0, 2 * failures + 2)
    upper = math.inf if failures == 0 else two_t / _chi2_ppf(alpha / 2.0, 2 * failures)
    one_sided = two_t / _chi2_ppf(confidence, 2 * failures + 2)
    return MtbfEstimate(
        failures=failures,
        exposure_s=float(exposure_s),
        confidence=confidence,
        point_s=exposure_s / failures if failures else None,
        lower_s=float(lower),
        upper_s=float(upper),
        one_sided_lower_s=float(one_sided),
    )


def required_clean_exposure(baseline_mtbf_s: float, *, confidence: float = 0.95, allowed_failures: int = 0) -> float:
    """Seconds a soak must run with at most ``allowed_failures`` hangs so that the
    one-sided lower MTBF bound exceeds ``baseline_mtbf_s`` (rejecting the baseline)."""
    _check_confidence(confidence)
    if baseline_mtbf_s <= 0:
        raise ValueError("baseline MTBF must be positive")
    return float(baseline_mtbf_s * _chi2_ppf(confidence, 2 * allowed_failures + 2) / 2.0)


class Change(str, Enum):
    """What a comparison finds B's change against A to be, in the metric's good
    direction (soak.thresholds.metrics.Better); not a run's verdict (soak.records.Verdict)."""

    BETTER = "better"
    WORSE = "worse"
    SAME = "no significant difference"
    UNKNOWN = "not enough data"


@dataclass(frozen=True)
class Estimate:
    value: float | None
    lower: float | None
    upper: float | None
    n: int


@dataclass(frozen=True)
class Difference:
    """B relative to A. ``verdict`` judges B against A in the metric's good direction."""

    metric: str
    unit: str
    a: Estimate
    b: Estimate
    p_value: float | None
    verdict: Change
    method: str
    ratio: float | None = None  # b/a where that reads better than b - a (rates)
    ratio_lower: float | None = None
    ratio_upper: float | None = None
    name: str | None = None  # the metric's name in soak.thresholds.metrics.RUN_METRICS, where it has one


def _verdict(p_value: float | None, delta: float | None, better: Better, alpha: float) -> Change:
    if p_value is None or delta is None or math.isnan(p_value):
        return Change.UNKNOWN
    if p_value >= alpha or delta == 0:
        return Change.SAME
    improved = delta > 0 if better is Better.HIGHER else delta < 0
    return Change.BETTER if improved else Change.WORSE


def mean_estimate(values: Sequence[float], *, confidence: float = 0.95) -> Estimate:
    """Mean with a Student-t interval."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if x.size == 0:
        return Estimate(None, None, None, 0)
    mean = float(x.mean())
    if x.size < 2:
        return Estimate(mean, None, None, int(x.size))
    half = float(_t_ppf(0.5 + confidence / 2.0, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return Estimate(mean, mean - half, mean + half, int(x.size))


def compare_means(
    metric: str, unit: str, a: Sequence[float], b: Sequence[float], *, better: Better,
    confidence: float = 0.95,
) -> Difference:
    """Welch's t-test on two samples (per-window throughputs, hit ratios, ...)."""
    from scipy import stats

    ea, eb = mean_estimate(a, confidence=confidence), mean_estimate(b, confidence=confidence)
    p_value = None
    if ea.n >= 2 and eb.n >= 2:
        xa = np.asarray([v for v in a if v is not None and math.isfinite(v)], dtype=float)
        xb = np.asarray([v for v in b if v is not None and math.isfinite(v)], dtype=float)
        if xa.std() == 0 and xb.std() == 0:
            p_value = 1.0 if xa.mean() == xb.mean() else 0.0
        else:
            p_value = float(stats.ttest_ind(xa, xb, equal_var=False).pvalue)
    delta = None if ea.value is None or eb.value is None else eb.value - ea.value
    return Difference(metric, unit, ea, eb, p_value, _verdict(p_value, delta, better, 1 - confidence), "Welch t-test on means")


def quantile_estimate(
    values: Sequence[float], q: float, *, confidence: float = 0.95, resamples: int = 400, seed: int = 0
) -> tuple[Estimate, np.ndarray]:
    """Quantile with a percentile-bootstrap interval; also returns the bootstrap draws."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if x.size == 0:
        return Estimate(None, None, None, 0), np.empty(0)
    rng = np.random.default_rng(seed)
    draws = np.quantile(rng.choice(x, size=(resamples, x.size), replace=True), q, axis=1)
    lo, hi = np.quantile(draws, [0.5 - confidence / 2.0, 0.5 + confidence / 2.0])
    return Estimate(float(np.quantile(x, q)), float(lo), float(hi), int(x.size)), draws


def compare_quantiles(
    metric: str, unit: str, a: Sequence[float], b: Sequence[float], q: float, *, better: Better,
    confidence: float = 0.95, resamples: int = 400, seed: int = 0,
) -> Difference:
    """Bootstrap the difference of a quantile; the two-sided p-value is twice the
    share of draws on the far side of zero."""
    ea, da = quantile_estimate(a, q, confidence=confidence, resamples=resamples, seed=seed)
    eb, db = quantile_estimate(b, q, confidence=confidence, resamples=resamples, seed=seed + 1)
    p_value = None
    delta = None
    if ea.n >= 2 and eb.n >= 2:
        diff = db - da
        delta = float(eb.value - ea.value)  # type: ignore[operator]
        p_value = float(min(1.0, 2.0 * min((diff <= 0).mean(), (diff >= 0).mean())))
    return Difference(metric, unit, ea, eb, p_value, _verdict(p_value, delta, better, 1 - confidence),
                      f"bootstrap of p{q * 100:g} ({resamples} resamples)")


def compare_rates(
    metric: str, count_a: int, exposure_a_s: float, count_b: int, exposure_b_s: float, *,
    confidence: float = 0.95, per_s: float = 3600.0, unit: str = "per hour",
) -> Difference:
    """Poisson rate ratio: conditional on the total, B's count is binomial with
    p = T_b / (T_a + T_b) under equal rates (exact test, Clopper-Pearson ratio interval)."""
    from scipy import stats

    def rate_est(count: int, exposure: float) -> Estimate:
        alpha = 1 - confidence
        lo = _chi2_ppf(alpha / 2, 2 * count) / 2 if count else 0.0
        hi = _chi2_ppf(1 - alpha / 2, 2 * count + 2) / 2
        return Estimate(count / exposure * per_s, float(lo) / exposure * per_s, float(hi) / exposure * per_s, count)

    ea, eb = rate_est(count_a, exposure_a_s), rate_est(count_b, exposure_b_s)
    total = count_a + count_b
    if total == 0:
        return Difference(metric, unit, ea, eb, 1.0, Change.SAME, "exact Poisson rate-ratio test (no events)")
    p0 = exposure_b_s / (exposure_a_s + exposure_b_s)
    test = stats.binomtest(count_b, total, p0)
    ci = test.proportion_ci(confidence_level=confidence, method="exact")
    odds = exposure_a_s / exposure_b_s

    def ratio(p: float) -> float:
        return math.inf if p >= 1 else p / (1 - p) * odds

    rr = math.inf if count_a == 0 else (count_b / exposure_b_s) / (count_a / exposure_a_s)
    delta = eb.value - ea.value  # type: ignore[operator]
    return Difference(
        metric, unit, ea, eb, float(test.pvalue), _verdict(float(test.pvalue), delta, Better.LOWER, 1 - confidence),
        "exact Poisson rate-ratio test", ratio=rr, ratio_lower=ratio(ci.low), ratio_upper=ratio(ci.high),
    )


def proportion_estimate(count: int, total: int, *, confidence: float = 0.95) -> Estimate:
    """A share (failed / finished) with its exact Clopper-Pearson interval."""
    from scipy import stats

    if total <= 0:
        return Estimate(None, None, None, 0)
    ci = stats.binomtest(count, total).proportion_ci(confidence_level=confidence, method="exact")
    return Estimate(count / total, float(ci.low), float(ci.high), total)


def compare_proportions(
    metric: str, count_a: int, total_a: int, count_b: int, total_b: int, *, better: Better = Better.LOWER,
    confidence: float = 0.95,
) -> Difference:
    """Two shares (error rates): Fisher's exact test on the 2x2 table, exact intervals."""
    from scipy import stats

    ea = proportion_estimate(count_a, total_a, confidence=confidence)
    eb = proportion_estimate(count_b, total_b, confidence=confidence)
    if ea.value is None or eb.value is None:
        return Difference(metric, "", ea, eb, None, Change.UNKNOWN, "Fisher exact test (no finished requests)")
    table = [[count_a, total_a - count_a], [count_b, total_b - count_b]]
    p_value = float(stats.fisher_exact(table).pvalue)
    delta = eb.value - ea.value
    return Difference(metric, "", ea, eb, p_value, _verdict(p_value, delta, better, 1 - confidence),
                      "Fisher exact test, Clopper-Pearson intervals")
