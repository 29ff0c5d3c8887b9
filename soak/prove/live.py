"""The sequential test as a run goes, pure: the run's events in, where the test
stands out.

Exposure is the run's time at risk as ``soak.exposure`` counts it (the one
definition the judge, the report and history use): from the start of load or a
restart to a hang's onset, or to ``now`` while the load runs. Hangs are
incidents of kind ``hang``. The path is walked (``sprt.walk``), so the answer is
the first line the run crossed; once crossed it stays (the test has decided),
which is what a run that stops at the decision acts on.

A hang is recorded only once the detector decides it, up to ``horizon_s`` after
its onset (soak.run.proving.detection_horizon_s). So an accept (or a truncation
by exposure) is final only once the clean time up to ``now - horizon_s`` reaches
it: before that a hang already under way could still land before the line, and a
run stopped at the decision would never record it. A reject is final at once: it
comes at a recorded hang.

Labels here are the run's own (its clock's labels lie on the monotonic line),
so a step of the wall clock moves no exposure.
"""

from __future__ import annotations

import math
from array import array
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from soak.work import finite_number, generated_tokens
from soak.events import EventType
from soak.exposure import Interval, intervals_of, known_clean, time_line_offset
from soak.prove.sprt import Decision, Plan, ProofState, pending, walk

# What the time at risk is read from (soak.exposure.intervals_of), and the fields it reads:
# the tracker and the judge keep only these of a run's events.
RISK_EVENTS = frozenset({EventType.RUN_STARTED, EventType.LOAD_STARTED, EventType.LOAD_STOPPED,
                         EventType.RESTART_DONE, EventType.INCIDENT})
RISK_FIELDS = ("type", "ts", "mono", "onset_at", "detected_at", "kind")


def exposure_path(intervals: Iterable[Interval]) -> tuple[tuple[float, ...], float]:
    """(cumulative exposure at each hang, total exposure): intervals laid end to
    end, in the order given; the test's statistic is exposure and hang count only."""
    marks: list[float] = []
    total = 0.0
    for interval in intervals:
        total += interval.length_s
        if interval.hang:
            marks.append(total)
    return tuple(marks), total


def proof_of(p: Plan, intervals: Sequence[Interval]) -> tuple[Decision, tuple[float, ...], float]:
    """(the decision over this path, its hang marks, its total exposure)."""
    marks, total = exposure_path(intervals)
    return walk(p, hang_exposures_s=marks, exposure_s=total), marks, total


def decide(p: Plan, intervals: Sequence[Interval], *, now: float, horizon_s: float
           ) -> tuple[Decision, tuple[float, ...], float]:
    """The one decision rule, live (``now``: the clock) and at the run's end (``now``:
    where the load stopped): (decision, hang marks, total exposure). A reject (or a
    truncation by hangs) comes at a recorded hang and is final at once; an accept
    (or a truncation by exposure) stands only once the path as far as every hang is
    known, up to ``now - horizon_s``, crosses it: until then the test is undecided,
    with what is left to wait (a run that ends there ends undecided, exit 5)."""
    decision, marks, total = proof_of(p, intervals)
    if decision.state is ProofState.UNDECIDED:
        return decision, marks, total
    cap = p.max_hangs
    at_a_hang = decision.state is ProofState.REJECTED or (
        decision.state is ProofState.TRUNCATED and cap is not None and decision.hangs >= cap)
    if at_a_hang:
        return decision, marks, total
    # the path as far as every hang is known (up to the horizon, and up to each recorded hang):
    # a prefix, so it crosses where the whole path does, or not yet
    horizon_s = max(0.0, horizon_s)
    known = proof_of(p, known_clean(intervals, until=now - horizon_s))[0]
    if known.state is ProofState.UNDECIDED:
        # Until the horizon has passed since the run began, the known path is empty (0 s):
        # what is left is then the line plus the horizon, less the time at risk so far.
        wait = max(0.0, decision.exposure_s - known.exposure_s, decision.exposure_s + horizon_s - total)
        return pending(decision, exposure_s=total, horizon_s=horizon_s, wait_s=wait), marks, total
    return known, marks, total


class ProofTracker:
    """Fed the run's events as they happen (``on_event``); ``at(now)`` says where
    the test stands, the load counted as running up to ``now`` until it stopped.
    ``horizon_s``: the longest a hang can go undetected (see the module docstring)."""

    def __init__(self, plan: Plan, *, horizon_s: float, fed_requests: bool = False) -> None:
        self.plan = plan
        self.horizon_s = max(0.0, horizon_s)
        self._events: list[dict[str, Any]] = []
        self._stopped = False
        self.decided: Decision | None = None  # the first line crossed, kept
        # The productive requests (soak.exposure.intervals_of's evidence of work).
        # ``fed_requests``: the run feeds every finished request (``on_request``), so
        # before the first productive one there is no work, as at the end of the run
        # (a server that never answered has no time at risk, live too); else None
        # until a request is fed (a caller with events only).
        self._work: bool | None = True if fed_requests else None
        # Each productive request's end, twice (NaN: not recorded): a float pair, not the record.
        self._mono = array("d")
        self._wall = array("d")

    def on_request(self, record: Mapping[str, Any] | Any) -> None:
        """A finished request: time counts at risk only while the target is seen
        working, as at the end of the run and in ``soak history``."""
        self._work = True
        if generated_tokens(record) > 0:
            get = record.get if isinstance(record, Mapping) else lambda k: getattr(record, k, None)
            mono, wall = finite_number(get("ended_mono")), finite_number(get("ended_at"))
            if mono is not None or wall is not None:
                self._mono.append(math.nan if mono is None else mono)
                self._wall.append(math.nan if wall is None else wall)

    def _work_at(self, events: Sequence[Mapping[str, Any]]) -> np.ndarray | None:
        """The productive ends on the run's time line, as ``soak.work.record_time`` places
        them (monotonic where the run records it, else the wall label moved onto it)."""
        if self._work is None:
            return None
        offset = time_line_offset(events)
        mono, wall = np.frombuffer(self._mono, dtype=float), np.frombuffer(self._wall, dtype=float)
        if offset is None:  # no monotonic line: wall labels, as a run recorded before mono existed
            return wall[~np.isnan(wall)]
        # as soak.work.record_time: ended_mono where the record has it, else its label moved onto the line
        placed = np.where(np.isnan(mono), wall - offset, mono)
        return placed[~np.isnan(placed)]

    def on_event(self, type: str, fields: Mapping[str, Any]) -> None:
        if type not in RISK_EVENTS:
            return
        self._events.append({**{k: fields[k] for k in RISK_FIELDS if k in fields}, "type": str(type)})
        if type == EventType.LOAD_STOPPED:
            self._stopped = True

    def at(self, now: float) -> Decision:
        if self.decided is not None:
            return self.decided
        events = self._events if self._stopped else [*self._events, {"type": EventType.LOAD_STOPPED.value, "ts": now}]
        intervals = intervals_of(events, {}, work_at=self._work_at(events))
        decision = decide(self.plan, intervals, now=now, horizon_s=self.horizon_s)[0]
        if decision.state is not ProofState.UNDECIDED:
            self.decided = decision
        return decision


__all__ = ["RISK_EVENTS", "RISK_FIELDS", "ProofTracker", "decide", "exposure_path", "proof_of"]
