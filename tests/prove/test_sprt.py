"""The sequential test against published figures and the textbook formulas,
computed here by hand with the numbers written out, and its properties over
any plan and any path (soak/prove/sprt.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.prove.sprt import ProofState, boundaries, decide, needed, plan, walk

MIN = 60.0
SETTINGS = settings(max_examples=200, deadline=None)

# The issue's figures: θ1 = 20 min, θ0 = 200 min, α = β = 0.05.
ISSUE = plan(broken_mtbf_s=20 * MIN, target_mtbf_s=200 * MIN, alpha=0.05, beta=0.05)


def test_the_issue_figures_by_hand() -> None:
    # 1/θ1 - 1/θ0 = 1/20 - 1/200 = 0.045 per minute; ln d = ln 10 = 2.302585
    # accept with 0 hangs: ln((1 - β)/β) / 0.045 = ln 19 / 0.045 = 2.944439 / 0.045 = 65.43 min
    assert ISSUE.accept_at_s(0) / MIN == pytest.approx(2.944439 / 0.045, abs=1e-4)
    assert round(ISSUE.accept_at_s(0) / MIN, 1) == 65.4
    # with one hang: (ln 19 + ln 10) / 0.045 = 5.247024 / 0.045 = 116.60 min
    assert round(ISSUE.accept_at_s(1) / MIN, 1) == 116.6
    # reject: c = ln 19 / ln 10 = 1.278754 hangs, b = 0.045 / 2.302585 = 0.019543 per minute;
    # 2 hangs reject by (2 - 1.278754) / 0.019543 = 36.91 min
    assert ISSUE.reject_intercept == pytest.approx(1.278754, abs=1e-6)
    assert ISSUE.slope * MIN == pytest.approx(0.019543, abs=1e-6)
    assert round(ISSUE.reject_by_s(2) / MIN, 1) == 36.9
    assert ISSUE.reject_by_s(1) is None  # one hang never rejects (1 < c)


def test_the_issue_sentences() -> None:
    fixed = walk(ISSUE, hang_exposures_s=[], exposure_s=90 * MIN)
    assert fixed.state is ProofState.ACCEPTED
    assert fixed.sentence == "fixed (α 5%, β 5%) after 65.4 clean minutes"
    standing = decide(ISSUE, exposure_s=24.4 * MIN, hangs=0)
    assert standing.state is ProofState.UNDECIDED
    assert standing.sentence == "41 more clean minutes to accept; 2 hangs before minute 37 reject"
    broke = walk(ISSUE, hang_exposures_s=[10 * MIN, 30 * MIN], exposure_s=200 * MIN)
    assert broke.state is ProofState.REJECTED and broke.exposure_s == 30 * MIN
    assert broke.sentence == "not fixed (α 5%, β 5%): 2 hangs within 30.0 minutes"
    late = walk(ISSUE, hang_exposures_s=[10 * MIN, 40 * MIN], exposure_s=40 * MIN)
    assert late.state is ProofState.UNDECIDED  # the second hang came after minute 36.9
    assert late.sentence == "128 more clean minutes to accept; 1 more hang before minute 88 reject"
    one = walk(ISSUE, hang_exposures_s=[50 * MIN], exposure_s=300 * MIN)
    assert one.state is ProofState.ACCEPTED and round(one.exposure_s / MIN, 1) == 116.6
    assert one.sentence == "fixed (α 5%, β 5%) after 116.6 minutes with 1 hang"


def test_ties_on_the_lines() -> None:
    # a hang landing exactly at the accept time: the clean time before it already accepted
    at = ISSUE.accept_at_s(0)
    tie = walk(ISSUE, hang_exposures_s=[at], exposure_s=at)
    assert tie.state is ProofState.ACCEPTED and tie.hangs == 0
    # a second hang exactly on the reject deadline rejects (the line is inclusive)
    by = ISSUE.reject_by_s(2)
    edge = walk(ISSUE, hang_exposures_s=[1.0, by], exposure_s=by)
    assert edge.state is ProofState.REJECTED and edge.exposure_s == by
    with pytest.raises(ValueError, match="within the exposure"):
        walk(ISSUE, hang_exposures_s=[10.0], exposure_s=5.0)
    with pytest.raises(ValueError, match="not negative"):
        decide(ISSUE, exposure_s=-1.0, hangs=0)


def test_a_ratio_gives_the_same_plan() -> None:
    assert plan(broken_mtbf_s=20 * MIN, ratio=10, alpha=0.05, beta=0.05) == ISSUE


# Two MIL-HDBK-781A plans (the handbook's I-D and III-D families, and IV-D).
# The handbook's tables could not be read here, so the plans' lines are computed
# by hand from their stated discrimination ratio and risks with Wald's bounds
# (section 5.9's a + bt < r < c + bt), in units of θ1 (θ1 = 1, θ0 = d). With
# k = 1/θ1 - 1/θ0 = 1 - 1/d and L = ln((1 - risk)/risk) (α = β = risk):
#   accept with r hangs at (r ln d + L) / k;  r hangs reject by (r ln d - L) / k.
#
# "III-D": d = 2.0, α = β = 10%: ln d = 0.693147, k = 0.5, L = ln 9 = 2.197225
#   (b = 0.5 / 0.693147 = 0.721348, a = -2.197225 / 0.693147 = -3.169925)
#   accept: r=0 2.197225/0.5 = 4.394449; r=1 2.890372/0.5 = 5.780744; r=2 3.583519/0.5 = 7.167038
#   reject: r=4 (2.772589-2.197225)/0.5 = 1.150728; r=5 (3.465736-2.197225)/0.5 = 2.537023
#   (the handbook's own tables are truncated and may correct A by (d+1)/2d, so
#   they differ slightly; they could not be read here to compare)
# "I-D": d = 1.5, α = β = 10%: ln d = 0.405465, k = 0.333333, L = 2.197225
#   accept: r=0 2.197225*3 = 6.591674; r=1 2.602690*3 = 7.808069
#   reject: r=6 (2.432791-2.197225)*3 = 0.706698; r=7 (2.838256-2.197225)*3 = 1.923094
# "IV-D": d = 2.0, α = β = 20%: L = ln 4 = 1.386294 (a = -2, c = +2)
#   accept: r=0 1.386294/0.5 = 2.772589; reject: r=3 (2.079442-1.386294)/0.5 = 1.386294
MIL_PLANS = [
    (2.0, 0.10, {0: 4.394449, 1: 5.780744, 2: 7.167038}, {4: 1.150728, 5: 2.537023}),
    (1.5, 0.10, {0: 6.591674, 1: 7.808069}, {6: 0.706698, 7: 1.923094}),
    (2.0, 0.20, {0: 2.772589}, {3: 1.386294}),
]


@pytest.mark.parametrize("ratio, risk, accepts, rejects", MIL_PLANS)
def test_mil_hdbk_781a_plans_by_hand(ratio, risk, accepts, rejects) -> None:
    p = plan(broken_mtbf_s=1.0, ratio=ratio, alpha=risk, beta=risk)
    for r, t in accepts.items():
        assert p.accept_at_s(r) == pytest.approx(t, abs=1e-5), (ratio, risk, r)
    for r, t in rejects.items():
        assert p.reject_by_s(r) == pytest.approx(t, abs=1e-5), (ratio, risk, r)
    for r in range(1, min(rejects)):
        by = p.reject_by_s(r)
        assert by is None or by < min(rejects.values())


def test_plan_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        plan(broken_mtbf_s=60)
    with pytest.raises(ValueError, match="above the broken"):
        plan(broken_mtbf_s=60, target_mtbf_s=30)
    with pytest.raises(ValueError, match="alpha"):
        plan(broken_mtbf_s=60, ratio=2, alpha=0.5)
    with pytest.raises(ValueError, match="max_hangs"):
        plan(broken_mtbf_s=60, ratio=2, max_hangs=0)


def test_truncation_is_its_own_outcome() -> None:
    p = plan(broken_mtbf_s=20 * MIN, ratio=10, max_exposure_s=100 * MIN, max_hangs=3)
    # one hang at minute 50: the accept time is 116.6, past the 100-minute cap
    cut = walk(p, hang_exposures_s=[50 * MIN], exposure_s=150 * MIN)
    assert cut.state is ProofState.TRUNCATED and cut.exposure_s == 100 * MIN
    assert cut.sentence.startswith("undecided at the truncation (α 5%, β 5%): 1 hang in 100.0 minutes")
    assert "leaning fixed" in cut.sentence  # ln 10 - 0.045 * 100 < 0
    # three hangs spread out (none within the reject line) reach the hang cap
    spread = walk(p, hang_exposures_s=[20 * MIN, 60 * MIN, 95 * MIN], exposure_s=95 * MIN)
    assert spread.state is ProofState.TRUNCATED and spread.hangs == 3
    # what is still needed stops at the truncation
    # (at minute 50 the reject line stands at 1.279 + 0.019543 * 50 = 2.256 hangs: 2 more,
    # by (3 - 1.278754) / 0.019543 = 88.1 minutes)
    need = needed(p, exposure_s=50 * MIN, hangs=1)
    assert need.clean_s is None and need.hangs == 2 and round(need.by_s / MIN, 1) == 88.1


def test_boundaries_and_json() -> None:
    b = boundaries(ISSUE, up_to_hangs=3)
    assert [pt.hangs for pt in b.accept] == [0, 1, 2, 3]
    assert [pt.hangs for pt in b.reject] == [2, 3]
    doc = decide(ISSUE, exposure_s=10 * MIN, hangs=0).to_json()
    assert doc["decision"] == "undecided" and doc["needed"]["hangs"] == 2
    assert doc["boundaries"]["accept"][0] == [0, ISSUE.accept_at_s(0)]
    assert doc["sentence"].startswith("55 more clean minutes")


plans = st.builds(
    lambda broken, ratio, alpha, beta: plan(broken_mtbf_s=broken, ratio=ratio, alpha=alpha, beta=beta),
    st.floats(1.0, 1e5), st.floats(1.2, 50.0), st.floats(0.01, 0.3), st.floats(0.01, 0.3))


@SETTINGS
@given(plans, st.integers(0, 30))
def test_lines_are_monotone_and_apart(p, r) -> None:
    assert p.accept_at_s(r + 1) > p.accept_at_s(r) > 0
    by, by_next = p.reject_by_s(r), p.reject_by_s(r + 1)
    assert by_next is not None or by is None
    if by is not None:
        assert by_next > by
        assert by < p.accept_at_s(r)  # the lines never meet: c > 0 > a


paths = st.lists(st.floats(0.0, 1.0), max_size=12)


@SETTINGS
@given(plans, paths, st.floats(0.0, 20.0))
def test_decisions_consistent_along_any_path(p, gaps, tail) -> None:
    # a path: hangs at cumulative exposure marks (gaps in units of θ1), then clean time
    marks, t = [], 0.0
    for g in gaps:
        t += g * p.broken_mtbf_s
        marks.append(t)
    end = t + tail * p.broken_mtbf_s
    result = walk(p, hang_exposures_s=marks, exposure_s=end)
    # the point where the walk stopped decides the same when asked alone
    assert decide(p, exposure_s=result.exposure_s, hangs=result.hangs).state is result.state
    # every hang the walk passed before deciding stood undecided
    for i, m in enumerate(marks[:result.hangs - (result.state is ProofState.REJECTED)]):
        if m < result.exposure_s:
            assert decide(p, exposure_s=m, hangs=i + 1).state is ProofState.UNDECIDED
    # a longer path decides the same once this one decided
    if result.state is not ProofState.UNDECIDED:
        longer = walk(p, hang_exposures_s=marks + [end + 1.0], exposure_s=end + 2.0)
        assert (longer.state, longer.hangs) == (result.state, result.hangs)
        assert longer.exposure_s == pytest.approx(result.exposure_s)


@SETTINGS
@given(plans, st.floats(0.0, 1e6), st.integers(0, 20))
def test_undecided_needs_lead_to_the_lines(p, t, r) -> None:
    d = decide(p, exposure_s=t, hangs=r)
    if d.state is not ProofState.UNDECIDED:
        return
    need = d.needed
    assert need is not None and need.clean_s is not None and need.clean_s > 0
    assert decide(p, exposure_s=t + need.clean_s, hangs=r).state is ProofState.ACCEPTED
    assert need.hangs is not None and need.by_s is not None and need.by_s >= t
    # that many more hangs at the deadline reject, one fewer does not (now)
    assert decide(p, exposure_s=need.by_s, hangs=r + need.hangs).state is ProofState.REJECTED
    assert math.isclose(need.by_s, p.reject_by_s(r + need.hangs))
    if need.hangs > 1:
        assert decide(p, exposure_s=t, hangs=r + need.hangs - 1).state is not ProofState.REJECTED
