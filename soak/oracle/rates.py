"""The near-tie rule's false-alarm rate, derived; and the figures that measure it.

The model (docs/oracle.md has the derivation and a worked example): a healthy
server that is not batch-invariant computes a token's logprob in two batches
with a difference ``d`` that is noise, ``d ~ N(0, sigma^2)``, independent from
token to token (``sigma`` is the s.d. of that difference, which is what the run
can measure: ``estimate_sigma``). Where the reference chose ``A`` and the
answer ``B``, the rule is wrong only if both reported gaps are past the margin:
``l_A - l_B > m`` in the reference and ``l'_B - l'_A > m`` in the answer. Adding
them, ``d_B - d_A > 2m`` with ``d_B - d_A ~ N(0, 2 sigma^2)``: per position

    P = P(|N(0, 2 sigma^2)| > 2m) = erfc(m / sigma)            (both sides' logprobs)
    P = P(|N(0, 2 sigma^2)| > m)  = erfc(m / (2 sigma))        (one side's only:
                                   an answer that ended, whose end token is not listed)

whatever the true gaps are (a bound: the absolute value covers a second
candidate token), and per canary of ``L`` compared positions ``1 - (1 - P)^L``.

Pure: numbers in, numbers out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median
from typing import Iterable

from soak.oracle.answer import Answer

# median |d| of N(0, sigma^2) is sigma * this (the MAD about zero).
_MAD_TO_SD = 0.6744897501960817
MIN_PAIRS = 8


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def logprob_pairs(reference: Answer, answer: Answer) -> list[tuple[float, float]]:
    """(reference's logprob, answer's logprob) of the same token at every
    position before the first where they differ: the noise ``estimate_sigma`` reads."""
    out = []
    for ref, ans in zip(reference.tokens, answer.tokens):
        if ref.token != ans.token:
            break
        if _finite(ref.logprob) and _finite(ans.logprob):
            out.append((float(ref.logprob), float(ans.logprob)))  # type: ignore[arg-type]
    return out


def estimate_sigma(pairs: Iterable[tuple[float, float]]) -> float | None:
    """The s.d. of the difference between two computations of one token's
    logprob, from matched positions; None with fewer than ``MIN_PAIRS`` finite pairs.

    Robust: the median absolute difference (about zero: both are the same
    token's logprob, so no bias is expected) over the differences that are not
    exactly zero. A batch-invariant step gives the same bits and an exact zero;
    the noise the rule must survive is that of the steps that are not, so the
    zeros are left out and the estimate is of the noisy steps (an upper bound
    for a mixture). All exact zeros: 0.0, a batch-invariant server."""
    diffs = []
    for pair in pairs:
        try:
            a, b = pair
        except (TypeError, ValueError):
            continue
        if _finite(a) and _finite(b):
            diffs.append(abs(float(a) - float(b)))
    if len(diffs) < MIN_PAIRS:
        return None
    noisy = [d for d in diffs if d > 0 and math.isfinite(d)]
    return median(noisy) / _MAD_TO_SD if noisy else 0.0


def per_position(*, sigma: float, tie_margin: float, sides: int = 2) -> float:
    """P(a false alarm at one compared position): ``erfc(m / sigma)`` where both
    sides' logprobs are read, ``erfc(m / (2 sigma))`` where one side's only."""
    if sides not in (1, 2):
        raise ValueError(f"sides must be 1 or 2, not {sides!r}")
    if not (sigma >= 0 and tie_margin >= 0):
        raise ValueError(f"sigma and tie_margin must be >= 0 (sigma={sigma!r}, tie_margin={tie_margin!r})")
    if sigma == 0:
        return 0.0 if tie_margin > 0 else 1.0
    return math.erfc(tie_margin / (sigma * (1 if sides == 2 else 2)))


def false_alarm_rate(*, sigma: float, tie_margin: float, positions: int, sides: int = 2) -> float:
    """P(a healthy server's canary of ``positions`` compared tokens is flagged):
    ``1 - (1 - P)^positions``."""
    if positions < 0:
        raise ValueError(f"positions must be >= 0, not {positions!r}")
    p = per_position(sigma=sigma, tie_margin=tie_margin, sides=sides)
    return 1.0 if p >= 1 else -math.expm1(positions * math.log1p(-p))


def tie_margin_for(*, sigma: float, positions: int, rate: float, sides: int = 2) -> float:
    """The smallest margin whose derived false-alarm rate per canary is at most ``rate``."""
    if not 0 < rate < 1:
        raise ValueError(f"rate must be between 0 and 1, not {rate!r}")
    lo, hi = 0.0, max(sigma, 1e-12) * 64
    for _ in range(200):
        mid = (lo + hi) / 2
        if false_alarm_rate(sigma=sigma, tie_margin=mid, positions=positions, sides=sides) > rate:
            lo = mid
        else:
            hi = mid
    return hi


def detection_probability(*, alternatives: int, vocabulary: int, canaries: int = 1, corrupt_share: float = 1.0,
                          sides: int = 2) -> float:
    """P(at least one of ``canaries`` canaries is flagged) when a share
    ``corrupt_share`` of answers is corrupted with tokens from another context.

    A corrupted answer escapes only if, at its first divergence, the other
    side's token happens to be among the ``alternatives`` a side lists (and then
    within the margin, which this leaves out: an upper bound on escaping): about
    ``alternatives / vocabulary`` per side for a token unrelated to the context,
    so ``q = sides * k / V`` per corrupted canary. Real text favours common
    tokens, so the measured escape rate is the figure to trust (bench)."""
    if alternatives < 0 or vocabulary < 1 or canaries < 0 or not 0 <= corrupt_share <= 1:
        raise ValueError("alternatives >= 0, vocabulary >= 1, canaries >= 0, 0 <= corrupt_share <= 1")
    escape = min(1.0, sides * alternatives / vocabulary)
    caught = corrupt_share * (1 - escape)
    return 1.0 - (1.0 - caught) ** canaries


@dataclass(frozen=True)
class MeasuredRate:
    """False alarms counted on a healthy run: the share, and its one-sided upper
    confidence bound (Clopper-Pearson; with none in ``n``, ``1 - alpha^(1/n)``, about 3/n)."""

    flagged: int
    judged: int
    rate: float | None
    upper: float | None
    confidence: float


def _binom_cdf(k: int, n: int, p: float) -> float:
    if p <= 0:
        return 1.0
    if p >= 1:
        return 1.0 if k >= n else 0.0
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p)
            + (n - i) * math.log1p(-p) for i in range(k + 1)]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(x - top) for x in logs))


def measured_rate(*, flagged: int, judged: int, confidence: float = 0.95) -> MeasuredRate:
    """The measured false-alarm rate per judged canary of a healthy run, with its upper bound."""
    if judged < 0 or not 0 <= flagged <= max(judged, 0) or not 0 < confidence < 1:
        raise ValueError(f"0 <= flagged <= judged and 0 < confidence < 1 ({flagged}, {judged}, {confidence})")
    if judged == 0:
        return MeasuredRate(flagged, judged, None, None, confidence)
    alpha = 1 - confidence
    if flagged == 0:
        upper = 1 - alpha ** (1 / judged)
    elif flagged == judged:
        upper = 1.0
    else:
        lo, hi = flagged / judged, 1.0
        for _ in range(100):  # the p at which seeing <= flagged has probability alpha
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _binom_cdf(flagged, judged, mid) > alpha else (lo, mid)
        upper = hi
    return MeasuredRate(flagged, judged, flagged / judged, upper, confidence)


__all__ = ["MIN_PAIRS", "MeasuredRate", "detection_probability", "estimate_sigma", "false_alarm_rate",
           "logprob_pairs", "measured_rate", "per_position", "tie_margin_for"]
