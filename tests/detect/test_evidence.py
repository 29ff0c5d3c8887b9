"""The sequential evidence core (soak.detect.evidence): CUSUM over fitted log-likelihood ratios."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from soak.detect import evidence as ev
from soak.detect.config import DetectorConfig
from soak.detect.evidence_table import TABLE
from soak.detect.signals import SignalTracker
from soak.records import Topology
from soak.samples import ClientSample, GpuReading, GpuSample, GpuSource, ServerSample

TAIL_BINS = tuple(TABLE.llr[ev.TAIL])
PROGRESS_BINS = (*TABLE.llr[ev.PROGRESS], ev.MOVED)
BOUND = ev.bound_for_arl0(10_000 * 3600.0, TABLE.period_s)
readings = st.lists(st.tuples(st.sampled_from(TAIL_BINS), st.sampled_from(PROGRESS_BINS)), max_size=60)


def run(seq, *, start=0.0, table=TABLE):
    state, totals = ev.Cusum(), []
    for k, (tail, progress) in enumerate(seq):
        state = ev.step(state, at=start + 0.5 * k, bins={ev.TAIL: tail, ev.PROGRESS: progress}, table=table,
                        span_s=0.5)
        totals.append(state.total)
    return state, totals


@settings(max_examples=100, deadline=None)
@given(readings)
def test_the_sum_is_never_negative_and_an_excursion_starts_from_zero(seq):
    state, totals = run(seq)
    assert all(x >= 0.0 for x in totals)
    assert (state.since is None) == (state.total == 0.0)


@settings(max_examples=100, deadline=None)
@given(readings, st.data())
def test_stronger_evidence_never_lowers_the_sum(seq, data):
    """Each reading replaced by one at least as hung-looking: the sum is at least as high at every step."""
    pairs = [(t, p) for t in TAIL_BINS for p in PROGRESS_BINS]

    def strength(pair):  # a progress move twice over ends the excursion: the weakest reading
        tail, progress = pair
        return -math.inf if progress == ev.MOVED else sum(TABLE.increment({ev.TAIL: tail, ev.PROGRESS: progress}).values())

    def stronger(tail, progress):
        return data.draw(st.sampled_from([p for p in pairs if strength(p) >= strength((tail, progress))]))

    _, weak = run(seq)
    _, strong = run([stronger(*r) for r in seq])
    assert all(s >= w - 1e-9 for s, w in zip(strong, weak))


def test_the_bound_is_set_by_the_arl0_and_lorden_gives_it_back():
    assert BOUND == math.log(10_000 * 3600 / 0.5)
    assert ev.arl0_lower_bound_s(BOUND, 0.5) == 10_000 * 3600 * (1 + 1e-12) or \
        math.isclose(ev.arl0_lower_bound_s(BOUND, 0.5), 10_000 * 3600)
    assert ev.bound_for_arl0(100 * 3600, 0.5) < BOUND  # a looser ARL0, a lower bound


def healthy_tail(progress):
    return TABLE.healthy[ev.TAIL_GIVEN_FRESH if progress in ev.FRESH else ev.TAIL]


def test_the_fitted_table_is_a_likelihood_ratio_of_its_healthy_model():
    """E_healthy[exp(increment)] <= 1 over the joint healthy model (progress, then the tail
    given it): what makes ARL0 >= exp(h) readings hold."""
    expected = 0.0
    for progress, pa in TABLE.healthy[ev.PROGRESS].items():
        for tail, pt in healthy_tail(progress).items():
            inc = sum(TABLE.increment({ev.TAIL: tail, ev.PROGRESS: progress}).values())
            expected += pa * pt * math.exp(inc)
    for model in TABLE.healthy.values():
        assert math.isclose(sum(model.values()), 1.0, rel_tol=1e-3)
    assert expected <= 1.0 + 1e-3


def test_a_healthy_stream_from_the_fitted_model_crosses_no_more_often_than_the_arl0_says():
    """Readings drawn from the table's healthy model, a bound for ARL0 = 200 readings: the
    share of 400 runs of 50 readings that cross stays under 50/200 (Wald: P <= N exp(-h))."""
    rng = random.Random(37)
    bound = ev.bound_for_arl0(200 * 0.5, 0.5)

    def draw(p0):
        return rng.choices(list(p0), weights=list(p0.values()))[0]

    crossed = 0
    for _ in range(400):
        state = ev.Cusum()
        for k in range(50):
            progress = draw(TABLE.healthy[ev.PROGRESS])
            bins = {ev.TAIL: draw(healthy_tail(progress)), ev.PROGRESS: progress}
            state = ev.step(state, at=0.5 * k, bins=bins, table=TABLE, span_s=0.5)
            if state.total >= bound:
                crossed += 1
                break
    assert crossed / 400 <= 50 / 200


def test_overwhelming_evidence_decides_in_a_few_readings_and_weak_evidence_waits():
    strong, _ = run([(ev.STALL, ev.AGE_BINS[3]), (ev.STALL, ev.AGE_BINS[3])])
    assert strong.total >= BOUND
    weak, _ = run([(ev.PARTIAL, "age<0.6")] * 3)
    assert weak.total < BOUND


def test_progress_through_a_tail_dip_clears_the_excursion():
    state, _ = run([(ev.STALL, "age<0.6"), (ev.STALL, ev.AGE_BINS[1]), (ev.STALL, "age<0.6"), (ev.STALL, ev.MOVED)])
    assert state.total == 0.0 and state.since is None


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 20), st.integers(0, 4), st.integers(3, 12), st.floats(0.0, 0.49))
def test_the_true_onset_lies_in_the_onset_interval(working, partial, stall, phase):
    """Readings every 0.5 s: the tail works until the onset, then looks stuck (a few partial
    readings first, as a real GPU's did), and the interval holds the onset."""
    onset = 0.5 * working + phase
    seq = ([(ev.WORKING, "age<0.6")] * working + [(ev.PARTIAL, "age<0.6")] * partial
           + [(ev.STALL, "age>=4")] * stall)
    # the first stuck-looking reading comes after the onset: readings at 0.5 k, onset in between
    state, _ = run(seq, start=0.5)
    earliest, latest = ev.onset_interval(state)
    assert earliest is not None and latest is not None
    assert earliest <= onset <= latest


def test_stale_gpu_readings_add_nothing():
    tracker = SignalTracker(DetectorConfig(), Topology.pipeline(2))
    tracker.observe(ServerSample(10.0, True, {"generation_tokens": 5.0, "num_requests_running": 2.0}))
    tracker.observe(ClientSample(10.0, 2, 100, 10, 0, 0.0, 2))
    tracker.observe(GpuSample(11.0, GpuSource.DCGM, (GpuReading(0, 100.0), GpuReading(1, 0.0)), fresh_at=11.0))
    before = tracker.evidence
    assert before.total > 0
    for k in range(20):  # the exporter repeats its old collection: stale past the window
        tracker.observe(GpuSample(15.0 + k, GpuSource.DCGM, (GpuReading(0, 100.0), GpuReading(1, 0.0)),
                                  fresh_at=11.0))
    assert tracker.evidence == before
