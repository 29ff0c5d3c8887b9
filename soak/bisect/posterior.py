"""The posterior over the first bad build among N ordered builds, from soak
segments, and the next build to soak. Pure: segments in, posterior and choice
out; the same segments give the same answer (a killed bisect resumes by
replaying its run directories' segments).

The model
---------
Builds 0..N-1 are ordered (oldest first). K, the first bad build, is one of
them: builds before K are good, K and every later build are bad (K = 0: all
bad). A segment soaks one build: ``exposure_s`` of time at risk with ``hangs``
hangs. Hangs come as a Poisson process, at the good rate λg on a good build and
the bad rate λb on a bad one, so a segment's likelihood is λ^h e^(-λ e). That
holds whether a segment stops at its first hang or restarts and goes on: the
stopping rule depends on the data only, and the likelihood is the same.

Neither rate is known; both are integrated out on a grid, under this prior:

- each MTBF (1/λ) log-uniform on [``mtbf_min_s``, ``mtbf_max_s``] (default
  1 minute to 30 days): scale-free, no preferred MTBF within the range;
- the bad rate at least ``min_ratio`` (default 2) times the good rate: a "bad"
  build is one that hangs clearly more often, else a good build's unlucky night
  and a bad build could not be told apart, and "first bad" would not be defined;
- and at most ``max_ratio`` (default 100) times: the case bisection is for is
  a good build that also hangs now and then. Without the cap most of the prior's
  mass lies on easy pairs (a good build that never hangs), and a posterior
  calibrated on average over them was overconfident on a hard pair: over 1000
  replays of bench/bisect_sim.py (good 200 min, bad 20 min) it was right 93.8%
  of the time when it said 95% or more (mean confidence 96.1%); with the cap,
  96.6% and 97.0% over 500 replays each of two seeds. A pair past the cap (a good build that never
  hangs) is only easier: its clean segments fit the lowest good rate allowed;
- optionally narrower ranges for either MTBF (``good_mtbf_s``, ``bad_mtbf_s``),
  what the user knows: "it hangs every 20 minutes or so now; it used to run
  for hours". The prior is the same log-uniform one, restricted;
- the grid: ``grid`` log-spaced MTBFs per rate (default 40, neighbours 31% apart),
  every (good, bad) pair that keeps the ratio.

The prior over K is uniform, or the one given (from history: a build known good
gets 0). The posterior over K is p(K) Σ_grid prior(λg, λb) Π segments' likelihood.

The next build
--------------
For each build j, a segment of ``segment_s`` (stopped at its first hang, as the
bisect runs one) has two outcomes, a hang within it or none; their predictive
probabilities and the posterior after each come from the same grid. The choice
is the build with the largest expected information gain about K, in bits:
H(K) - E[H(K | outcome)]. The actual segment then updates with its exact
exposure and hang count.

Stopping: the most probable build at or above ``threshold`` (default 0.95) is
found; spent exposure at or past ``budget_s`` ends the search undecided.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, Sequence

import numpy as np

MIN = 60.0


class BisectState(str, Enum):
    SEARCHING = "searching"  # soak the chosen build next
    FOUND = "found"  # the most probable first bad build passed the threshold
    OUT_OF_BUDGET = "out_of_budget"  # the budget spent below the threshold


@dataclass(frozen=True)
class Segment:
    build: int  # index into the ordered builds
    exposure_s: float  # time at risk (soak.exposure's definition)
    hangs: int

    def to_json(self) -> dict[str, Any]:
        return {"build": self.build, "exposure_s": self.exposure_s, "hangs": self.hangs}


@dataclass(frozen=True)
class Model:
    builds: int
    prior: tuple[float, ...]  # over K, normalized
    mtbf_min_s: float
    mtbf_max_s: float
    grid: int
    min_ratio: float
    max_ratio: float | None = None  # the bad rate at most this many times the good one, if stated
    good_mtbf_s: tuple[float, float] | None = None  # a narrower range for the good MTBF, if known
    bad_mtbf_s: tuple[float, float] | None = None  # and for the bad one


def _range(name: str, value: Sequence[float] | None) -> tuple[float, float] | None:
    if value is None:
        return None
    lo, hi = (float(x) for x in value)
    if not 0 < lo < hi or not math.isfinite(hi):
        raise ValueError(f"{name} must be a range (low, high) of positive seconds")
    return lo, hi


def model(*, builds: int, prior: Sequence[float] | None = None, mtbf_min_s: float = MIN,
          mtbf_max_s: float = 30 * 86400.0, grid: int = 40, min_ratio: float = 2.0,
          max_ratio: float | None = 100.0, good_mtbf_s: Sequence[float] | None = None,
          bad_mtbf_s: Sequence[float] | None = None) -> Model:
    """A checked model (ValueError names the bad option)."""
    if builds < 2:
        raise ValueError(f"bisection needs at least 2 builds, not {builds}")
    weights = [1.0] * builds if prior is None else [float(w) for w in prior]
    if len(weights) != builds or any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"the prior needs {builds} weights, none negative, not all 0")
    if not 0 < mtbf_min_s < mtbf_max_s or not math.isfinite(mtbf_max_s):
        raise ValueError("mtbf_min_s must be positive and below mtbf_max_s")
    if grid < 4 or min_ratio < 1 or (max_ratio is not None and max_ratio <= min_ratio):
        raise ValueError("grid must be at least 4, min_ratio at least 1 and max_ratio above it")
    total = sum(weights)
    return Model(builds, tuple(w / total for w in weights), float(mtbf_min_s), float(mtbf_max_s), grid,
                 float(min_ratio), None if max_ratio is None else float(max_ratio),
                 _range("good_mtbf_s", good_mtbf_s), _range("bad_mtbf_s", bad_mtbf_s))


def _rates(m: Model) -> tuple[np.ndarray, np.ndarray]:
    """The grid's (good rate, bad rate) pairs, per second, every pair keeping the
    ratio; the log-uniform prior on each MTBF is uniform over the log grid."""
    mtbf = np.geomspace(m.mtbf_min_s, m.mtbf_max_s, m.grid)
    good, bad = np.meshgrid(1.0 / mtbf, 1.0 / mtbf, indexing="ij")
    keep = bad >= m.min_ratio * good * (1 - 1e-12)
    if m.max_ratio is not None:
        keep &= bad <= m.max_ratio * good * (1 + 1e-12)
    for rate, span in ((good, m.good_mtbf_s), (bad, m.bad_mtbf_s)):
        if span is not None:  # a stated range: the log-uniform prior restricted to it
            keep &= (1.0 / rate >= span[0] * (1 - 1e-12)) & (1.0 / rate <= span[1] * (1 + 1e-12))
    if not keep.any():
        raise ValueError("no (good, bad) MTBF pair on the grid fits the stated ranges and ratio")
    return good[keep], bad[keep]


def _log_joint(segments: Sequence[Segment], m: Model) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """log p(K = k, rates | segments) up to a constant, shape (builds, pairs), with the rates."""
    exposure = np.zeros(m.builds)
    hangs = np.zeros(m.builds)
    for s in segments:
        if not 0 <= s.build < m.builds or s.exposure_s < 0 or s.hangs < 0:
            raise ValueError(f"a segment outside the model: {s}")
        exposure[s.build] += s.exposure_s
        hangs[s.build] += s.hangs
    good, bad = _rates(m)
    # K = k: builds before k good (prefix sums), k on bad
    e_good = np.concatenate(([0.0], np.cumsum(exposure)[:-1]))
    h_good = np.concatenate(([0.0], np.cumsum(hangs)[:-1]))
    e_bad, h_bad = exposure.sum() - e_good, hangs.sum() - h_good
    log_lik = (h_good[:, None] * np.log(good)[None, :] - e_good[:, None] * good[None, :]
               + h_bad[:, None] * np.log(bad)[None, :] - e_bad[:, None] * bad[None, :])
    with np.errstate(divide="ignore"):  # a prior weight of 0 rules K out
        log_prior = np.log(np.asarray(m.prior))
    return log_lik + log_prior[:, None], good, bad


def _normalized(log_w: np.ndarray) -> np.ndarray:
    top = np.max(log_w)
    w = np.exp(log_w - top)
    return w / w.sum()


def _entropy_bits(p: np.ndarray) -> float:
    q = p[p > 0]
    return float(-(q * np.log2(q)).sum())


@dataclass(frozen=True)
class Posterior:
    first_bad: tuple[float, ...]  # P(K = k) per build
    exposure_s: tuple[float, ...]  # per build, summed over its segments
    hangs: tuple[int, ...]
    segments: int
    good_mtbf_s: float  # posterior geometric means of the two MTBFs
    bad_mtbf_s: float

    @property
    def best(self) -> int:
        return int(max(range(len(self.first_bad)), key=lambda k: (self.first_bad[k], -k)))

    @property
    def confidence(self) -> float:
        return self.first_bad[self.best]

    @property
    def entropy_bits(self) -> float:
        return _entropy_bits(np.asarray(self.first_bad))

    def to_json(self) -> dict[str, Any]:
        return {"first_bad": list(self.first_bad), "best": self.best, "confidence": self.confidence,
                "exposure_s": list(self.exposure_s), "hangs": list(self.hangs), "segments": self.segments,
                "good_mtbf_s": self.good_mtbf_s, "bad_mtbf_s": self.bad_mtbf_s}


def posterior(segments: Sequence[Segment], *, model: Model) -> Posterior:
    m = model
    log_w, good, bad = _log_joint(segments, m)
    w = _normalized(log_w)
    exposure = [0.0] * m.builds
    hangs = [0] * m.builds
    for s in segments:
        exposure[s.build] += s.exposure_s
        hangs[s.build] += s.hangs
    over_rates = w.sum(axis=0)
    return Posterior(
        first_bad=tuple(float(x) for x in w.sum(axis=1)), exposure_s=tuple(exposure), hangs=tuple(hangs),
        segments=len(segments),
        good_mtbf_s=float(np.exp(-(over_rates * np.log(good)).sum())),
        bad_mtbf_s=float(np.exp(-(over_rates * np.log(bad)).sum())))


@dataclass(frozen=True)
class Choice:
    build: int
    segment_s: float
    gain_bits: tuple[float, ...]  # expected information gain of soaking each build next
    p_hang: tuple[float, ...]  # predictive probability of a hang within the segment, per build
    reason: str


def choose(segments: Sequence[Segment], *, model: Model, segment_s: float) -> Choice:
    """The build whose next segment (``segment_s``, stopped at a hang) has the
    largest expected information gain about the first bad build."""
    if not segment_s > 0:
        raise ValueError("segment_s must be positive")
    m = model
    log_w, good, bad = _log_joint(segments, m)
    w = _normalized(log_w)  # (K, pairs)
    now = _entropy_bits(w.sum(axis=1))
    clean_good, clean_bad = np.exp(-good * segment_s), np.exp(-bad * segment_s)
    ks = np.arange(m.builds)
    gains, hang_p = [], []
    for j in range(m.builds):
        # build j is bad under K = k when j >= k
        clean = np.where((j >= ks)[:, None], clean_bad[None, :], clean_good[None, :])
        p_clean_k = (w * clean).sum(axis=1)
        p_clean = float(p_clean_k.sum())
        p_hang_k = w.sum(axis=1) - p_clean_k
        expected = 0.0
        for p_out, joint in ((p_clean, p_clean_k), (1.0 - p_clean, p_hang_k)):
            if p_out > 1e-15:
                expected += p_out * _entropy_bits(np.clip(joint, 0, None) / p_out)
        gains.append(max(0.0, now - expected))
        hang_p.append(1.0 - p_clean)
    # ties (all gains nil, or equal) go to the build nearest the posterior median
    cdf = np.cumsum(w.sum(axis=1))
    median = int(np.searchsorted(cdf, 0.5))
    best = max(range(m.builds), key=lambda j: (round(gains[j], 12), -abs(j - median), -j))
    reason = (f"build {best}: a {segment_s / MIN:.0f}-minute segment is expected to teach "
              f"{gains[best]:.2f} bits (P(hang) {hang_p[best]:.2f})")
    return Choice(best, float(segment_s), tuple(gains), tuple(hang_p), reason)


@dataclass(frozen=True)
class Step:
    state: BisectState
    posterior: Posterior
    choice: Choice | None  # None once found or out of budget
    spent_s: float
    reasons: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state.value, "posterior": self.posterior.to_json(), "spent_s": self.spent_s,
                "next": None if self.choice is None else {"build": self.choice.build,
                                                          "segment_s": self.choice.segment_s,
                                                          "gain_bits": list(self.choice.gain_bits)},
                "reasons": list(self.reasons)}


def step(segments: Sequence[Segment], *, model: Model, segment_s: float, threshold: float = 0.95,
         budget_s: float | None = None) -> Step:
    """Where the bisect stands after these segments: found, out of budget, or the
    build to soak next."""
    if not 0 < threshold < 1:
        raise ValueError("threshold must be between 0 and 1")
    post = posterior(segments, model=model)
    spent = float(sum(s.exposure_s for s in segments))
    stand = (f"build {post.best} first bad at {post.confidence:.1%} after {len(segments)} segments, "
             f"{spent / 3600:.1f} h of soak (good MTBF ~{post.good_mtbf_s / MIN:.0f} min, "
             f"bad ~{post.bad_mtbf_s / MIN:.0f} min)")
    if post.confidence >= threshold:
        return Step(BisectState.FOUND, post, None, spent,
                    (f"build {post.best} is the first bad build ({post.confidence:.1%} ≥ {threshold:.0%})", stand))
    if budget_s is not None and spent >= budget_s:
        return Step(BisectState.OUT_OF_BUDGET, post, None, spent,
                    (f"budget of {budget_s / 3600:.1f} h spent below {threshold:.0%}: most likely build "
                     f"{post.best} at {post.confidence:.1%}", stand))
    pick = choose(segments, model=model, segment_s=segment_s)
    return Step(BisectState.SEARCHING, post, pick, spent, (pick.reason, stand))


def replay(segments: Sequence[Segment], *, model: Model) -> tuple[Posterior, ...]:
    """The posterior after every segment, in order (bisect.json, bisect.html)."""
    return tuple(posterior(segments[:i + 1], model=model) for i in range(len(segments)))
