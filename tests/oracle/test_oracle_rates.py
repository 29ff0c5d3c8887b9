"""The rule's false-alarm rate (soak/oracle/rates.py): the derived bound, checked
against the rule itself on a simulated batch-variant server (the rule is run,
not the formula re-derived); the noise estimate; the detection bound; the
measured rate's confidence bound."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from soak.oracle.answer import Answer, TokenChoice
from soak.oracle.compare import judge_answer
from soak.oracle.rates import (MIN_PAIRS, detection_probability, estimate_sigma, false_alarm_rate, logprob_pairs,
                               measured_rate, per_position, tie_margin_for)
from soak.samples import CanaryVerdict as V

from tests.oracle.helpers import answer, pos


def test_the_worked_example_of_docs_oracle_md() -> None:
    # sigma 0.01 nats (bf16 batch variance), margin 0.2, 32 positions.
    assert per_position(sigma=0.01, tie_margin=0.2) == pytest.approx(math.erfc(20))
    assert false_alarm_rate(sigma=0.01, tie_margin=0.2, positions=32) == pytest.approx(1.73e-174, rel=0.01)
    assert false_alarm_rate(sigma=0.01, tie_margin=0.2, positions=32, sides=1) == pytest.approx(6.68e-44, rel=0.01)
    assert false_alarm_rate(sigma=0.1, tie_margin=0.2, positions=32) == pytest.approx(0.139, rel=0.01)


def test_the_per_position_bound_is_the_normal_tail_it_claims() -> None:
    # erfc(m/sigma) = P(|N(0, 2 sigma^2)| > 2m); erfc(m/(2 sigma)) = P(|N(0, 2 sigma^2)| > m).
    rng = random.Random(7)
    sigma, m, n = 0.1, 0.15, 200_000
    draws = [abs(rng.gauss(0, sigma * math.sqrt(2))) for _ in range(n)]
    assert sum(d > 2 * m for d in draws) / n == pytest.approx(per_position(sigma=sigma, tie_margin=m), abs=0.002)
    assert sum(d > m for d in draws) / n == pytest.approx(per_position(sigma=sigma, tie_margin=m, sides=1), abs=0.004)


def _two_computations(rng: random.Random, sigma: float, positions: int) -> tuple[Answer, Answer]:
    """One greedy canary computed twice by a batch-variant server: the true
    logprobs of the two leading tokens at each position, and each computation's
    own noise, such that one token's logprob differs between the two with s.d.
    ``sigma``. Gaps are drawn small, where flips happen."""
    each = sigma / math.sqrt(2)
    sides: list[list[TokenChoice]] = [[], []]
    for _ in range(positions):
        true = {"A": -0.5, "B": -0.5 - abs(rng.gauss(0, 2 * sigma)), "C": -3.0}
        for side in sides:
            lp = {t: v + rng.gauss(0, each) for t, v in true.items()}
            chosen = max(lp, key=lp.get)
            side.append(TokenChoice(chosen, lp[chosen], tuple(sorted(lp.items(), key=lambda a: -a[1]))))
    return Answer(tuple(sides[0]), "", "length", "m"), Answer(tuple(sides[1]), "", "length", "m")


def test_the_rule_on_a_simulated_batch_variant_server_stays_under_the_derived_rate() -> None:
    rng = random.Random(11)
    sigma, margin, positions, canaries = 0.1, 0.2, 8, 4000
    flips = alarms = 0
    pairs: list[tuple[float, float]] = []
    for _ in range(canaries):
        ref, ans = _two_computations(rng, sigma, positions)
        j = judge_answer(ref, ans, tie_margin=margin)
        flips += j.verdict is not V.MATCH
        alarms += j.verdict is V.CORRUPT
        pairs += logprob_pairs(ref, ans)
    derived = false_alarm_rate(sigma=sigma, tie_margin=margin, positions=positions)
    measured = measured_rate(flagged=alarms, judged=canaries)
    assert flips > canaries / 4  # the server does flip: a string compare would cry wolf
    assert measured.rate <= derived
    # And the noise the bound needs is read from the answers themselves.
    assert estimate_sigma(pairs) == pytest.approx(sigma, rel=0.1)


def test_a_margin_of_zero_is_a_string_compare() -> None:
    rng = random.Random(3)
    results = [judge_answer(*_two_computations(rng, 0.1, 8), tie_margin=0).verdict for _ in range(500)]
    assert results.count(V.CORRUPT) > 100  # every flip is an alarm: what the margin is for


def test_estimate_sigma_is_robust_and_says_when_it_cannot_tell() -> None:
    rng = random.Random(5)
    clean = [(x := rng.uniform(-5, 0), x + rng.gauss(0, 0.02)) for _ in range(3000)]
    assert estimate_sigma(clean) == pytest.approx(0.02, rel=0.08)
    wild = clean + [(0.0, -20.0)] * 300  # a tenth of outliers moves it little
    assert estimate_sigma(wild) == pytest.approx(0.02, rel=0.2)
    invariant = [(-1.0, -1.0)] * 50  # a batch-invariant server: the same bits
    assert estimate_sigma(invariant) == 0.0
    assert estimate_sigma(clean[:MIN_PAIRS - 1]) is None
    assert estimate_sigma([(float("nan"), 1.0), (None, 1.0), "xy", (1,)] * 10) is None


@given(st.floats(1e-4, 1.0), st.floats(0, 3), st.integers(0, 4096), st.sampled_from([1, 2]))
def test_the_rate_is_a_probability_monotone_in_its_arguments(sigma, margin, positions, sides) -> None:
    r = false_alarm_rate(sigma=sigma, tie_margin=margin, positions=positions, sides=sides)
    assert 0 <= r <= 1
    assert false_alarm_rate(sigma=sigma, tie_margin=margin + 0.1, positions=positions, sides=sides) <= r
    assert false_alarm_rate(sigma=sigma * 1.5, tie_margin=margin, positions=positions, sides=sides) >= r
    assert false_alarm_rate(sigma=sigma, tie_margin=margin, positions=positions + 1, sides=sides) >= r
    assert false_alarm_rate(sigma=sigma, tie_margin=margin, positions=positions, sides=1) >= \
        false_alarm_rate(sigma=sigma, tie_margin=margin, positions=positions, sides=2)


@given(st.floats(1e-3, 0.5), st.integers(1, 1024), st.floats(1e-12, 0.5))
def test_tie_margin_for_meets_the_rate(sigma, positions, rate) -> None:
    m = tie_margin_for(sigma=sigma, positions=positions, rate=rate)
    assert false_alarm_rate(sigma=sigma, tie_margin=m, positions=positions) <= rate
    assert false_alarm_rate(sigma=sigma, tie_margin=m * 0.99, positions=positions) >= rate * 0.999 or m < 1e-9


def test_bad_arguments_are_refused() -> None:
    for kw in ({"sigma": -1, "tie_margin": 0.2}, {"sigma": float("nan"), "tie_margin": 0.2},
               {"sigma": 0.1, "tie_margin": 0.2, "sides": 3}):
        with pytest.raises(ValueError):
            per_position(**kw)
    with pytest.raises(ValueError):
        measured_rate(flagged=3, judged=2)
    assert per_position(sigma=0, tie_margin=0.2) == 0.0


def test_a_corruption_from_another_context_escapes_at_most_about_k_over_v() -> None:
    rng = random.Random(9)
    vocab = [f"t{i}" for i in range(1000)]
    k, trials, escaped = 5, 3000, 0
    for _ in range(trials):
        def position() -> TokenChoice:
            toks = rng.sample(vocab, k)
            lps = sorted((rng.uniform(-3, 0) for _ in toks), reverse=True)
            return TokenChoice(toks[0], lps[0], tuple(zip(toks, lps)))
        ref, bad = Answer((position(),), "", "length"), Answer((position(),), "", "length")
        if ref.tokens[0].token != bad.tokens[0].token:
            escaped += judge_answer(ref, bad, tie_margin=0.2).verdict is not V.CORRUPT
    bound = 1 - detection_probability(alternatives=k, vocabulary=len(vocab))
    assert escaped / trials <= bound + 3 * math.sqrt(bound / trials)
    assert detection_probability(alternatives=5, vocabulary=32000, canaries=8, corrupt_share=1 / 8) == \
        pytest.approx(1 - (1 - (1 - 10 / 32000) / 8) ** 8)


def test_the_measured_rate_and_its_bound() -> None:
    none = measured_rate(flagged=0, judged=3000)
    assert none.rate == 0 and none.upper == pytest.approx(3 / 3000, rel=0.01)  # the rule of three
    two = measured_rate(flagged=2, judged=100)
    assert two.rate == 0.02 and two.upper == pytest.approx(0.0616, abs=0.0005)  # Clopper-Pearson
    assert measured_rate(flagged=0, judged=0).upper is None
    assert measured_rate(flagged=5, judged=5).upper == 1.0


def test_logprob_pairs_stop_at_the_first_difference() -> None:
    ref = answer(pos(" a", -0.1), pos(" b", -0.2), pos(" c", -0.3))
    ans = answer(pos(" a", -0.11), pos(" x", -0.2), pos(" c", -0.3))
    assert logprob_pairs(ref, ans) == [(-0.1, -0.11)]
