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
