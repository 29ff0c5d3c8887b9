"""The posterior over the first bad build (soak/bisect/posterior.py): against a
plain-Python integration of the stated model, replayable (order and splitting
of segments change nothing), the choice's information gain bounded, and the
stopping rules."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.bisect.posterior import BisectState, Segment, choose, model, posterior, replay, step

MIN = 60.0
SETTINGS = settings(max_examples=100, deadline=None)


def brute_force(segments, *, builds, prior, mtbf_min_s, mtbf_max_s, grid, min_ratio, max_ratio):
    """The docstring's model written out: p(K) Σ over the log grid of (good,
    bad) MTBF pairs with min_ratio <= bad rate / good rate <= max_ratio, of Π λ^h e^(-λ e)."""
    mtbfs = [mtbf_min_s * (mtbf_max_s / mtbf_min_s) ** (i / (grid - 1)) for i in range(grid)]
    out = []
    for k in range(builds):
        total = 0.0
        for g in mtbfs:
            for b in mtbfs:
                lam_g, lam_b = 1 / g, 1 / b
                if not min_ratio * lam_g * (1 - 1e-12) <= lam_b <= max_ratio * lam_g * (1 + 1e-12):
                    continue
                like = 1.0
                for s in segments:
                    lam = lam_b if s.build >= k else lam_g
                    like *= lam ** s.hangs * math.exp(-lam * s.exposure_s)
                total += like
        out.append(prior[k] * total)
    z = sum(out)
    return [x / z for x in out]


def test_matches_the_model_written_out() -> None:
    segments = [Segment(1, 40 * MIN, 0), Segment(3, 12 * MIN, 1), Segment(2, 30 * MIN, 1), Segment(1, 20 * MIN, 0)]
    options = dict(builds=4, prior=[0.1, 0.2, 0.3, 0.4], mtbf_min_s=5 * MIN, mtbf_max_s=2000 * MIN,
                   grid=7, min_ratio=2.0, max_ratio=100.0)
    got = posterior(segments, model=model(**options)).first_bad
    want = brute_force(segments, **options)
    assert got == pytest.approx(want, rel=1e-9)


def test_no_segments_give_the_prior() -> None:
    assert posterior([], model=model(builds=4)).first_bad == pytest.approx([0.25] * 4)
    given_prior = posterior([Segment(2, 600.0, 1)], model=model(builds=4, prior=[0, 1, 1, 2]))
    assert given_prior.first_bad[0] == 0.0  # a build known good stays good


def test_clean_hours_move_the_first_bad_later_and_a_hang_earlier() -> None:
    m = model(builds=8)
    clean = posterior([Segment(3, 6 * 60 * MIN, 0)], model=m)
    assert sum(clean.first_bad[:4]) < 0.5 < sum(clean.first_bad[4:])
    hung = posterior([Segment(3, 5 * MIN, 1)], model=m)
    assert sum(hung.first_bad[:4]) > 0.5


def test_evidence_for_one_build_finds_it() -> None:
    # builds 0-2 clean for hours, 3-7 hang within minutes, again and again
    segments = [Segment(j, 6 * 60 * MIN, 0) for j in range(3) for _ in range(2)]
    segments += [Segment(j, 15 * MIN, 1) for j in range(3, 8) for _ in range(3)]
    now = step(segments, model=model(builds=8), segment_s=30 * MIN)
    assert now.state is BisectState.FOUND and now.posterior.best == 3 and now.choice is None
    assert now.reasons[0].startswith("build 3 is the first bad build (")
    assert 10 * MIN < now.posterior.bad_mtbf_s < 40 * MIN  # 15 hangs in 225 minutes


def test_the_first_choice_halves_the_builds() -> None:
    first = choose([], model=model(builds=8), segment_s=30 * MIN)
    assert first.build in (3, 4)
    assert all(0 <= g <= 1 for g in first.gain_bits)


def test_stopping_at_the_budget() -> None:
    segments = [Segment(0, 2 * 3600.0, 0)]
    over = step(segments, model=model(builds=8), segment_s=30 * MIN, budget_s=3600.0)
    assert over.state is BisectState.OUT_OF_BUDGET and over.choice is None
    assert over.reasons[0].startswith("budget of 1.0 h spent below 95%")
    going = step(segments, model=model(builds=8), segment_s=30 * MIN, budget_s=3 * 3600.0)
    assert going.state is BisectState.SEARCHING and going.choice is not None
    doc = going.to_json()
    assert doc["state"] == "searching" and doc["next"]["build"] == going.choice.build
    assert len(doc["posterior"]["first_bad"]) == 8


def test_replay_gives_the_posterior_after_every_segment() -> None:
    segments = [Segment(4, 30 * MIN, 0), Segment(6, 10 * MIN, 1), Segment(5, 30 * MIN, 0)]
    m = model(builds=8)
    steps = replay(segments, model=m)
    assert len(steps) == 3 and steps[-1] == posterior(segments, model=m)
    assert steps[0] == posterior(segments[:1], model=m)


def test_model_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="at least 2 builds"):
        model(builds=1)
    with pytest.raises(ValueError, match="prior needs 3 weights"):
        model(builds=3, prior=[1, 1])
    with pytest.raises(ValueError, match="outside the model"):
        posterior([Segment(5, 1.0, 0)], model=model(builds=3))


segment_lists = st.lists(st.builds(Segment, st.integers(0, 5), st.floats(0.0, 600 * MIN), st.integers(0, 3)),
                         max_size=8)


@SETTINGS
@given(segment_lists, st.randoms(use_true_random=False))
def test_order_of_segments_changes_nothing(segments, rnd) -> None:
    m = model(builds=6, grid=12)
    shuffled = list(segments)
    rnd.shuffle(shuffled)
    a, b = posterior(segments, model=m), posterior(shuffled, model=m)
    assert a.first_bad == pytest.approx(b.first_bad, abs=1e-9)
    assert sum(a.first_bad) == pytest.approx(1.0)


@SETTINGS
@given(segment_lists, st.floats(0.0, 1.0))
def test_splitting_a_segment_changes_nothing(segments, cut) -> None:
    # a run directory may hold one build's soak as several segments (a restart,
    # a resumed bisect): only the build's total exposure and hangs count
    if not segments:
        return
    m = model(builds=6, grid=12)
    head, rest = segments[0], segments[1:]
    split = [Segment(head.build, head.exposure_s * cut, head.hangs // 2),
             Segment(head.build, head.exposure_s * (1 - cut), head.hangs - head.hangs // 2), *rest]
    assert posterior(split, model=m).first_bad == pytest.approx(posterior(segments, model=m).first_bad, abs=1e-9)


@SETTINGS
@given(segment_lists, st.floats(1 * MIN, 600 * MIN))
def test_a_choice_gains_at_most_one_bit(segments, segment_s) -> None:
    # one segment's outcome is binary (a hang within it or none): at most 1 bit,
    # and never more than the uncertainty left
    m = model(builds=6, grid=12)
    c = choose(segments, model=m, segment_s=segment_s)
    left = posterior(segments, model=m).entropy_bits
    assert all(-1e-12 <= g <= min(1.0, left) + 1e-9 for g in c.gain_bits)
    assert c.gain_bits[c.build] == pytest.approx(max(c.gain_bits))
    assert all(0.0 <= p <= 1.0 for p in c.p_hang)
