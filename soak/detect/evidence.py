"""Sequential evidence for the pipeline-tail stall: CUSUM over log-likelihood ratios.

Each GPU reading is one observation of two signals: the tail pattern (the last
stage's GPU against the upstream ones) and progress (how long since a progress
signal moved, or whether one moved after the pattern began). Each signal's bin has
a log-likelihood ratio, log P(bin | hung) / P(bin | healthy), from distributions
fitted on healthy and hung traces (scripts/fit_evidence.py writes
soak/detect/evidence_table.py). The sum over a reading is the increment; the
CUSUM ``S = max(0, S + increment)`` decides when it reaches the bound.

The bound comes from a stated ARL0 (average run length to a false alarm): for a
CUSUM of true log-likelihood ratios, E_healthy[exp(increment)] = 1, so the
probability that an excursion from 0 ever reaches ``h`` is at most exp(-h)
(Wald's inequality) and ARL0 >= exp(h) readings (Lorden 1971). Hence
``h = ln(ARL0 / reading period)``. The bound holds under the fitted healthy model
with independent readings; bench/detection.py estimates ARL0 from replayed
healthy traces as well.

Progress counts only beside a tail that does not look working, and the tail's ratio
is taken given whether progress is fresh: under that healthy model (and the hung
tail pattern independent of progress) E[exp(increment)] <= 1, so the bound holds.
A signal moving twice after the pattern began ends the excursion (a stopped engine
cannot), which only lowers increments.

Pure: no clock, no I/O. A stale reading adds nothing (it is missing, not a 0% or
100%), and nothing here keeps a run of readings alive that the increments do not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

TAIL = "tail_pattern"
PROGRESS = "progress"
SIGNALS = (TAIL, PROGRESS)

# Tail-pattern bins: the seed's signature (tail at or under low, every upstream GPU at
# or over high); the way into it (the tail dark, upstream climbing: real NVML readings
# showed 0% beside 77% half a second after the stop); anything else (the tail working).
STALL, PARTIAL, WORKING = "stall", "partial", "working"
PARTIAL_TAIL_PCT = 50.0
PARTIAL_UP_PCT = 60.0

# Progress bins: seconds since the engine was last seen making progress (busy time only;
# SignalTracker.alive_at dates it: a client token at its arrival, a scrape's move at its
# own time until a later scrape shows the counters still, then at the scrape before). MOVED: a
# signal moved since a reading of it taken after the excursion's first stuck-looking
# GPU reading. A stopped engine is reported moving once per signal (the scrape after the
# stop carries the last tokens before it), never after that: tokens flow through a tail
# dip, and the excursion ends (the tracker clears it when the move comes).
MOVED = "moved_during_pattern"
AGE_EDGES = (0.6, 1.2, 2.0, 4.0)
AGE_BINS = ("age<0.6", "age<1.2", "age<2", "age<4", "age>=4")
FRESH = AGE_BINS[:2]
# The tail pattern beside fresh progress is weaker evidence than beside a quiet counter:
# on a loaded box GPU readings lag the tokens (a stuck-looking reading while tokens still
# come), so its healthy probability is fitted apart (scripts/fit_evidence.py).
TAIL_GIVEN_FRESH = "tail_pattern|fresh_progress"
# With nothing in flight the tail pattern is fitted apart as well: a real GPU between
# turns read partial (upstream busy, tail not) in 4 of 145 healthy idle readings on the
# device (issue 37), where busy readings almost never do. A real deadlock strikes inside
# a step, so idle readings carry little: they count only until the client sees the
# request whose first step hung.
TAIL_GIVEN_IDLE = "tail_pattern|nothing_in_flight"


def tail_bin(tail_pct: float, upstream_pct: float, *, low_pct: float, high_pct: float) -> str:
    if tail_pct <= low_pct and upstream_pct >= high_pct:
        return STALL
    if tail_pct <= PARTIAL_TAIL_PCT and upstream_pct >= PARTIAL_UP_PCT:
        return PARTIAL
    return WORKING


def progress_bin(age_s: float, *, moved_during_pattern: bool) -> str:
    if moved_during_pattern:
        return MOVED
    for edge, name in zip(AGE_EDGES, AGE_BINS):
        if age_s < edge:
            return name
    return AGE_BINS[-1]


@dataclass(frozen=True)
class EvidenceTable:
    """Per signal, per bin: the log-likelihood ratio of one reading of ``period_s``."""

    llr: Mapping[str, Mapping[str, float]]
    period_s: float = 0.5
    # P(bin | healthy) per signal: the model under which the ARL0 bound holds.
    healthy: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    provenance: str = ""

    def increment(self, bins: Mapping[str, str], weight: float = 1.0) -> dict[str, float]:
        """Each signal's contribution for one reading; a bin the table lacks adds nothing.
        Progress is read beside a tail that does not look working only: with the tail
        working, a quiet counter is generation_frozen's business, not this signature's."""
        tail, progress = bins.get(TAIL), bins.get(PROGRESS)
        out: dict[str, float] = {}
        if tail is not None:
            given = tail_given(progress, tail)
            out[TAIL] = weight * self.llr.get(given, self.llr.get(TAIL, {})).get(tail, 0.0)
        if progress is not None and tail != WORKING:
            out[PROGRESS] = weight * self.llr.get(PROGRESS, {}).get(progress, 0.0)
        return out


def tail_given(progress: str | None, tail: str | None = None) -> str:
    """The table row of the tail's ratio beside ``progress`` (None: nothing in flight)."""
    if progress is None:
        return TAIL_GIVEN_IDLE
    return TAIL_GIVEN_FRESH if progress in FRESH and tail != WORKING else TAIL


def bound_for_arl0(arl0_s: float, period_s: float) -> float:
    """The CUSUM bound h with ARL0 >= exp(h) readings >= ``arl0_s`` (Lorden)."""
    return math.log(max(arl0_s / period_s, 1.0))


def arl0_lower_bound_s(bound: float, period_s: float) -> float:
    return math.exp(bound) * period_s


@dataclass(frozen=True)
class Cusum:
    """The running sum and what the current excursion (S > 0 since ``since``) saw."""

    total: float = 0.0
    since: float | None = None  # first reading of the current excursion
    points: int = 0
    contributions: Mapping[str, float] = field(default_factory=dict)
    first_hung_at: float | None = None  # first reading of the excursion whose tail looked stuck
    last_working_at: float | None = None  # start of the span of the last reading with the tail working
    last_at: float | None = None  # the last fresh reading folded in

    def fraction(self, bound: float) -> float:
        return self.total / bound if bound > 0 else 0.0


def step(state: Cusum, *, at: float, bins: Mapping[str, str], table: EvidenceTable,
         span_s: float, weight: float = 1.0, rules_out_hang: bool | None = None) -> Cusum:
    """Fold one fresh reading at ``at`` (its readings average over ``span_s`` before it).

    ``rules_out_hang``: whether the reading shows the pipeline not hung over its span
    (None: read it from the bin). Only such a reading moves the earliest onset: a
    ``working`` bin with the tail dark beside dark upstream stages (on a shared GPU a
    spinning stage time-sliced off for the whole window) says nothing of when the
    tail last ran. signals.SignalTracker decides it."""
    working = bins.get(TAIL) == WORKING and (rules_out_hang is None or rules_out_hang)
    if bins.get(PROGRESS) == MOVED:  # tokens flowed after the pattern began: no hang
        return Cusum(last_working_at=state.last_working_at, last_at=at)
    parts = table.increment(bins, weight)
    total = state.total + sum(parts.values())
    last_working = at - span_s if working else state.last_working_at
    if total <= 0.0:
        return Cusum(last_working_at=last_working, last_at=at)
    fresh = state.since is None
    contributions = dict(parts) if fresh else {k: state.contributions.get(k, 0.0) + parts.get(k, 0.0)
                                               for k in set(state.contributions) | set(parts)}
    hung_looking = bins.get(TAIL) in (STALL, PARTIAL)
    first_hung = state.first_hung_at if not fresh else None
    if first_hung is None and hung_looking:
        first_hung = at
    return Cusum(total, at if fresh else state.since, (0 if fresh else state.points) + 1, contributions,
                 first_hung, last_working, at)


def cleared(state: Cusum) -> Cusum:
    """The excursion ends (tokens came after the pattern began); what the tail last did is kept."""
    return Cusum(last_working_at=state.last_working_at, last_at=state.last_at)


def onset_interval(state: Cusum) -> tuple[float | None, float | None]:
    """(earliest, latest) onset consistent with the excursion: the tail last worked
    inside the span of its last working reading, and was stuck by the first reading
    of the excursion that looked stuck."""
    latest = state.first_hung_at if state.first_hung_at is not None else state.since
    earliest = state.last_working_at
    if earliest is not None and latest is not None:
        earliest = min(earliest, latest)
    return earliest, latest


__all__ = [
    "AGE_BINS", "FRESH", "TAIL_GIVEN_FRESH", "TAIL_GIVEN_IDLE", "tail_given", "Cusum", "EvidenceTable", "MOVED", "PARTIAL", "PROGRESS", "SIGNALS",
    "STALL", "TAIL", "WORKING", "arl0_lower_bound_s", "bound_for_arl0", "cleared", "onset_interval", "progress_bin", "step", "tail_bin",
]
