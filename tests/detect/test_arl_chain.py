"""The ARL0 chain (soak.detect.arl): Brook & Evans over (S, last bin) against a direct
simulation of the CUSUM, and the properties a run length must have."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.detect import arl
from soak.detect import evidence as ev
from soak.detect.evidence_table import TABLE

# A sticky three-symbol chain: a rise that tends to repeat, a small and a large fall.
P3 = np.array([[0.55, 0.30, 0.15], [0.20, 0.60, 0.20], [0.10, 0.30, 0.60]])
X3 = (1.3, -0.6, -2.1)


def simulate(P, increments, *, bound, n=20_000, seed=1, start=None):
    """Readings until S = max(0, S + X) reaches the bound, n CUSUMs side by side."""
    rng = np.random.default_rng(seed)
    k = len(increments)
    last = rng.choice(k, size=n, p=start if start is not None else arl.stationary(P))
    s, steps, alive = np.zeros(n), np.zeros(n), np.ones(n, dtype=bool)
    cum = np.cumsum(P, axis=1)
    x = np.asarray(increments)
    while alive.any():
        idx = np.flatnonzero(alive)
        nxt = np.minimum((rng.random(idx.size)[:, None] > cum[last[idx]]).sum(axis=1), k - 1)
        last[idx] = nxt
        s[idx] = np.maximum(0.0, s[idx] + x[nxt])
        steps[idx] += 1
        alive[idx] = s[idx] < bound
    return steps.mean()


def iid_brook_evans(probs, increments, *, bound, delta):
    """The classical i.i.d. Brook & Evans chain, written out on its own (dense)."""
    m = math.ceil(bound / delta - 1e-9)
    Q = np.zeros((m, m))
    for p, x in zip(probs, increments):
        s = math.ceil(x / delta - 1e-9)
        for j in range(m):
            to = max(0, j + s)
            if to < m:
                Q[j, to] += p
    return float(np.linalg.solve(np.eye(m) - Q, np.ones(m))[0])


def test_the_chain_matches_a_direct_simulation_of_the_cusum():
    bound = 4.0
    chain, delta = arl.chain_arl(P3, X3, bound=bound, max_states=6000)
    mc = simulate(P3, X3, bound=bound)
    assert delta < 0.01
    assert abs(chain - mc) / mc < 0.03, (chain, mc)


def test_dependence_matters_an_independent_model_of_the_same_readings_runs_longer():
    """The same readings' frequencies, shuffled independent: the sticky rise reaches the
    bound sooner than independence would say (why Lorden's bound alone is not enough)."""
    pi = arl.stationary(P3)
    sticky, _ = arl.chain_arl(P3, X3, bound=6.0, max_states=3000)
    independent, _ = arl.chain_arl(np.tile(pi, (3, 1)), X3, bound=6.0, max_states=3000)
    assert sticky < independent / 2


def test_an_iid_chain_gives_the_iid_brook_evans_result():
    probs, xs = np.array([0.3, 0.5, 0.2]), (1.0, -0.5, -1.5)
    chain, delta = arl.chain_arl(np.tile(probs, (3, 1)), xs, bound=5.0, delta=0.25, start=probs)
    assert delta == 0.25
    assert math.isclose(chain, iid_brook_evans(probs, xs, bound=5.0, delta=0.25), rel_tol=1e-9)


chains = st.integers(2, 4).flatmap(lambda k: st.tuples(
    st.lists(st.lists(st.floats(0.05, 1.0), min_size=k, max_size=k), min_size=k, max_size=k),
    st.lists(st.integers(-6, 3), min_size=k, max_size=k)))


@settings(max_examples=60, deadline=None)
@given(chains, st.integers(1, 12), st.integers(1, 6))
def test_a_higher_bound_never_comes_sooner_and_a_run_is_at_least_one_reading(chain, h, more):
    rows, ints = chain
    P = np.asarray(rows) / np.sum(rows, axis=1, keepdims=True)
    xs = [0.5 * i for i in ints]  # on the grid: the chain is exact
    low, _ = arl.chain_arl(P, xs, bound=0.5 * h, delta=0.5)
    high, _ = arl.chain_arl(P, xs, bound=0.5 * (h + more), delta=0.5)
    assert low >= 1.0
    assert high >= low * (1 - 1e-9)


def test_a_bound_out_of_reach_has_an_infinite_run_length():
    P = np.array([[0.5, 0.5], [0.5, 0.5]])
    assert arl.chain_arl(P, (-1.0, -2.0), bound=3.0, max_states=200)[0] == math.inf


def test_a_progress_move_ends_the_excursion():
    """A reset symbol between two rises: the CUSUM must start over, so it runs longer."""
    P = np.full((3, 3), 1 / 3)
    reset, _ = arl.chain_arl(P, (1.0, -math.inf, -0.2), bound=3.0, delta=0.1)
    fall, _ = arl.chain_arl(P, (1.0, -0.5, -0.2), bound=3.0, delta=0.1)
    assert reset > fall


def reading(tail, progress=None, weight=1.0):
    bins = {ev.TAIL: tail} if progress is None else {ev.TAIL: tail, ev.PROGRESS: progress}
    return bins, weight


def healthy_trace(n):
    """Working tail, progress fresh, a few idle readings and one tail dip a trace."""
    fresh = ev.FRESH[0]
    seq = [reading(ev.WORKING, fresh) for _ in range(n)]
    seq[n // 2] = reading(ev.PARTIAL, fresh)
    seq[n // 3] = reading(ev.WORKING)
    return seq


def test_the_estimate_grows_with_the_healthy_readings_behind_it():
    bound = ev.bound_for_arl0(10_000 * 3600.0, TABLE.period_s)
    few = arl.estimate([healthy_trace(300)], table=TABLE, bound=bound, draws=4, max_states=1500)
    many = arl.estimate([healthy_trace(300)] * 20, table=TABLE, bound=bound, draws=4, max_states=1500)
    assert many.readings == 20 * few.readings
    assert math.isclose(few.busy_h, 299 * TABLE.period_s / 3600)
    assert many.hours > few.hours > 0
    assert few.low_h <= few.high_h
    again = arl.estimate([healthy_trace(300)], table=TABLE, bound=bound, draws=4, max_states=1500)
    assert again == few  # seeded: the same readings give the same figures


def test_every_bin_the_table_knows_is_in_the_chain():
    bins = arl.joint_bins(TABLE)
    assert {t for t, _ in bins} >= set(TABLE.llr[ev.TAIL])
    assert {p for _, p in bins} == {*ev.AGE_BINS, None}
    assert arl.increment(TABLE, (ev.WORKING, None)) == TABLE.llr[ev.tail_given(None)][ev.WORKING]  # nothing in flight: its own row
    assert arl.increment(TABLE, (ev.WORKING, ev.MOVED)) == -math.inf


def test_a_bootstrap_resample_keeps_each_rows_total_and_invents_no_transition():
    counts = arl.count([healthy_trace(400)] * 3, period_s=TABLE.period_s)
    again = arl.resample(counts, np.random.default_rng(3))
    for observed, drawn, width in ((counts.progress, again.progress, 1), (counts.tail, again.tail, 2)):
        assert set(drawn) <= set(observed)
        for row in {key[:width] for key in observed}:
            assert sum(n for key, n in drawn.items() if key[:width] == row) == \
                sum(n for key, n in observed.items() if key[:width] == row)


def tail_row(chain, last, nxt_progress):
    """P(next tail | last joint bin) at the given next progress bin, as a dict."""
    i = chain.bins.index(last)
    cells = {tb: chain.transition[i, j] for j, (tb, pb) in enumerate(chain.bins) if pb == nxt_progress}
    total = sum(cells.values())
    return {t: v / total for t, v in cells.items()}


def test_a_progress_class_never_seen_reads_like_the_sources_tail_not_a_coin():
    """Three minutes of a fast GPU run never show quiet progress. The tail beside quiet
    progress must then lean on the source's tail in general (mostly working), as the
    table scores it, not on a uniform prior that stalls one reading in three."""
    counts = arl.count([healthy_trace(400)] * 3, period_s=TABLE.period_s)
    quiet = next(p for p in ev.AGE_BINS if p not in ev.FRESH and p != ev.MOVED)
    assert not any(cls == "quiet" for _, cls, _ in counts.tail)
    point = tail_row(arl.fit(counts, TABLE), (ev.WORKING, ev.FRESH[0]), quiet)
    uniform = tail_row(arl.fit(counts, TABLE, unobserved="uniform"), (ev.WORKING, ev.FRESH[0]), quiet)
    assert point[ev.WORKING] > 0.95
    assert point[ev.STALL] < 0.01 < uniform[ev.STALL]
    floor = TABLE.healthy[ev.TAIL][ev.STALL]
    assert point[ev.STALL] >= floor * 0.99  # the table's healthy floor still holds


def sticky_chain_readings(stay: float, n: int, seed: int):
    """A two-tail healthy source: working/partial with the given persistence."""
    rng = np.random.default_rng(seed)
    tail, out = ev.WORKING, []
    for _ in range(n):
        if rng.random() > stay:
            tail = ev.PARTIAL if tail == ev.WORKING else ev.WORKING
        out.append(reading(tail, ev.FRESH[0]))
    return out


def test_homogeneity_accepts_readings_from_the_same_law_whichever_side_is_larger_and_rejects_another():
    """At 5%, the same law is rejected about one time in twenty, a different one always,
    and a small population beside a large source is no reason to reject (each side's
    sampling error counts, not just the source's)."""
    rejected = {"big population": 0, "small population": 0, "other law": 0}
    for seed in range(20):
        big = arl.count([sticky_chain_readings(0.9, 20_000, seed)], period_s=TABLE.period_s)
        small = arl.count([sticky_chain_readings(0.9, 600, seed + 100)], period_s=TABLE.period_s)
        other = arl.count([sticky_chain_readings(0.5, 600, seed + 200)], period_s=TABLE.period_s)
        same = arl.homogeneity(small, big, TABLE, draws=400, seed=seed)
        flipped = arl.homogeneity(big, small, TABLE, draws=400, seed=seed)
        differs = arl.homogeneity(other, big, TABLE, draws=400, seed=seed)
        rejected["big population"] += same.p < 0.05
        rejected["small population"] += flipped.p < 0.05
        rejected["other law"] += differs.p < 0.05
        assert flipped.g == pytest.approx(same.g)  # symmetric in the sources
        assert differs.g > same.g
        assert differs.worst.startswith("tail after")
        assert differs.by_factor["tail"][1] < 0.05 and differs.by_factor["tail"][0] > same.by_factor["tail"][0]
    assert rejected["other law"] == 20
    assert rejected["big population"] <= 3 and rejected["small population"] <= 3, rejected


@settings(max_examples=25, deadline=None)
@given(stay=st.floats(0.05, 0.99), n=st.integers(2, 400), seed=st.integers(0, 10_000))
def test_homogeneity_is_a_p_value_and_a_source_is_like_itself_not_like_an_opposite(stay, n, seed):
    counts = arl.count([sticky_chain_readings(stay, n, seed)], period_s=TABLE.period_s)
    own = arl.homogeneity(counts, counts, TABLE, draws=200, seed=seed)
    assert own.g == pytest.approx(0.0, abs=1e-9) and own.p == 1.0
    assert own.transitions == n - 1
    if n >= 200 and abs(1 - 2 * stay) >= 0.5:
        opposite = arl.count([sticky_chain_readings(1 - stay, 2_000, seed + 1)], period_s=TABLE.period_s)
        h = arl.homogeneity(counts, opposite, TABLE, draws=200, seed=seed)
        assert h.g > 0 and h.p <= 0.05 and 0 < h.p_floor <= h.p <= 1
