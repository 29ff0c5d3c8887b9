"""The sequential test's core at its edges (soak/prove/sprt.py): what is still
needed never names a deadline already past; the summary's boundary lines stay
small whatever the truncation; a plan out of its stated bounds is a ValueError,
never an inf, a ZeroDivisionError or an OverflowError later."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from soak.prove.sprt import ProofState, decide, plan, truncation

SETTINGS = settings(max_examples=100, deadline=None)

plans = st.builds(lambda broken, ratio, alpha, beta: plan(broken_mtbf_s=broken, ratio=ratio, alpha=alpha, beta=beta),
                  st.floats(5.0, 600.0), st.floats(1.5, 50.0), st.sampled_from([0.01, 0.05, 0.1, 0.2]),
                  st.sampled_from([0.01, 0.05, 0.1, 0.2]))


@SETTINGS
@example(plan(broken_mtbf_s=521.283157846071, target_mtbf_s=5627.515017112717, alpha=0.1, beta=0.05), 0, 2, 0)
@given(plans, st.integers(0, 6), st.integers(1, 3), st.integers(-3, 3))
def test_what_is_needed_to_reject_lies_ahead_and_is_the_fewest(p, hangs, k, ulps) -> None:
    """Standing a hair either side of where ``hangs + k`` hangs stop rejecting (the
    reviewer's case: "2 hangs before minute 24" at minute 24.004, when 3 were needed)."""
    t = (hangs + k - p.reject_intercept) / p.slope
    for _ in range(abs(ulps)):
        t = math.nextafter(t, math.inf if ulps > 0 else -math.inf)
    if t <= 0:
        return
    d = decide(p, exposure_s=t, hangs=hangs)
    if d.state is not ProofState.UNDECIDED or d.needed is None or d.needed.hangs is None:
        return
    more, by = d.needed.hangs, d.needed.by_s
    assert by is not None and by >= t  # a deadline still to come
    assert decide(p, exposure_s=t, hangs=hangs + more).state is ProofState.REJECTED  # they would reject now
    if more > 1:  # and one fewer would not
        assert decide(p, exposure_s=t, hangs=hangs + more - 1).state is not ProofState.REJECTED


@pytest.mark.parametrize("max_hangs", [3, 10**8])
def test_the_summarys_lines_are_a_few_points_whatever_the_truncation(max_hangs) -> None:
    """max_hangs 10^8 drew 2e8 points into summary.json; the lines reach two hangs past
    the reject intercept (or the truncation, where it comes first)."""
    p = plan(broken_mtbf_s=1200.0, ratio=10, max_hangs=max_hangs)
    j = decide(p, exposure_s=60.0, hangs=0).to_json()
    top = min(max_hangs, math.ceil(p.reject_intercept) + 2)
    assert [r for r, _ in j["boundaries"]["accept"]] == list(range(top + 1))
    assert j["boundaries"]["max_hangs"] == max_hangs


@pytest.mark.parametrize("field, value, said", [
    ("max_hangs", 2.5, "max_hangs must be a whole number"),
    ("max_hangs", True, "max_hangs must be a whole number"),
    ("broken_mtbf_s", 10**400, "broken_mtbf_s is out of range"),
    ("broken_mtbf_s", 1e-300, "broken_mtbf_s must be between"),
    ("broken_mtbf_s", float("nan"), "broken_mtbf_s must be finite"),
    ("target_mtbf_s", 1e300, "the ratio of the target MTBF"),
    ("target_mtbf_s", 1260.0, "the ratio of the target MTBF"),  # ratio 1.05
    ("alpha", "0.05", "alpha must be a number"),
])
def test_a_plan_out_of_bounds_is_one_value_error(field, value, said) -> None:
    given = {"broken_mtbf_s": 1200.0, "target_mtbf_s": 12000.0, "alpha": 0.05, "beta": 0.05, field: value}
    with pytest.raises(ValueError, match=said):
        plan(**given)


@SETTINGS
@given(st.floats(allow_nan=True, allow_infinity=True), st.floats(allow_nan=True, allow_infinity=True),
       st.one_of(st.none(), st.integers(-5, 10**30), st.floats()))
def test_every_plan_that_builds_walks_and_draws(broken, target, max_hangs) -> None:
    """Whatever numbers are given (a config, a recorded plan): a ValueError, or a plan
    whose lines, decisions and summary are finite numbers of a few points."""
    try:
        p = plan(broken_mtbf_s=broken, target_mtbf_s=target, max_hangs=max_hangs)  # type: ignore[arg-type]
    except ValueError:
        return
    for at in (0.0, p.accept_at_s(0), p.accept_at_s(3) * 2):
        j = decide(p, exposure_s=at, hangs=1).to_json()
        assert math.isfinite(j["log_ratio"]) and len(j["boundaries"]["accept"]) <= 10**4


def test_truncate_auto_near_the_lowest_ratio_is_quick() -> None:
    """Ratio 1.05 took 1.7 s (r0 4547, one quantile per r) and grew without bound
    toward 1; the search halves now, and the config's ratio starts at 1.1."""
    assert truncation(broken_mtbf_s=1200.0, target_mtbf_s=12000.0, alpha=0.05, beta=0.05)[1] == 3  # the handbook's
    started = time.perf_counter()  # scipy imported by now
    exposure, r0 = truncation(broken_mtbf_s=100.0, target_mtbf_s=110.0, alpha=0.01, beta=0.01)
    assert time.perf_counter() - started < 1.0
    assert r0 > 1000 and exposure > 0
    with pytest.raises(ValueError, match="too close to 1"):
        truncation(broken_mtbf_s=100.0, target_mtbf_s=100.0001, alpha=0.05, beta=0.05)
