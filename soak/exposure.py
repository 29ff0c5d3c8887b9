"""Time at risk: one night's exposure and hangs for its MTBF, one definition for
report.html, the end of a run and ``soak history`` (issue 35: two pages once gave
two MTBFs for one night, 63 s and 59 s).

- A run's exposure is its time at risk: from the start of load (or from a
  restart's ``restart_done``) to a hang's onset, or to the end of load. Time
  between an onset and the restart is not at risk, and a run that stopped at an
  incident contributes up to the onset only.
- A cut-off run (no ``run_ended``: the harness or host died) counts up to the
  last thing it recorded; an aborted run up to where its load stopped.
- Every length is a difference on the run's monotonic time line (the
  ``mono`` of its events; CONTRACTS.md "Time is monotonic"), never of wall
  labels: a stepped wall clock changes no exposure. A run recorded before
  ``mono`` existed is read from ``ts``.
- Each restart starts a new interval, so one night can hold several
  time-to-hang intervals; only hangs (incident kind ``hang``) are failures: a
  crash or a lost server ends its interval, censored.

Pure: a run's events and its summary in, intervals out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from soak.events import EventType
from soak.summary_file import RunSummary


@dataclass(frozen=True)
class Interval:
    start: float  # unix seconds
    length_s: float
    hang: bool  # True: ended by a hang at start + length_s; False: censored
    ended_by: str  # "hang", "crash", "server_gone", "end of load", "cut off", ...



def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _timeline(events: Sequence[Mapping[str, Any]]) -> tuple[Any, Any]:
    """(time of an event, label of a time): on the monotonic line when the run
    recorded ``mono`` (run-relative seconds; CONTRACTS.md "Time is monotonic"),
    else on ``ts`` as a run recorded before ``mono`` existed."""
    for e in events:
        if e.get("type") == EventType.RUN_STARTED:
            ts, mono = _num(e.get("ts")), _num(e.get("mono"))
            if ts is not None and mono is not None:
                def when(event: Mapping[str, Any], label: float | None = None) -> float | None:
                    m, t = _num(event.get("mono")), _num(event.get("ts"))
                    if label is not None:  # a label the event carries (an onset): as far before it as its ts
                        base = m if m is not None else (None if t is None else mono + (t - ts))
                        return None if base is None or t is None else base - (t - label)
                    return m if m is not None else (None if t is None else mono + (t - ts))

                return when, lambda m: None if m is None else ts + (m - mono)
            break

    def when_wall(event: Mapping[str, Any], label: float | None = None) -> float | None:
        return label if label is not None else _num(event.get("ts"))

    return when_wall, lambda t: t


def intervals_of(events: Sequence[Mapping[str, Any]], summary: RunSummary | Mapping[str, Any]) -> tuple[Interval, ...]:
    """The run's time-at-risk intervals, from its events (see the module docstring).
    Lengths are monotonic differences; ``Interval.start`` is a label. ``summary``:
    the typed record, or summary.json as parsed (read through it)."""
    summary = RunSummary.of(summary)
    when, label = _timeline(events)
    load_started = load_stopped = None
    restarts: list[float] = []
    incidents: list[tuple[float, str]] = []
    for e in events:
        t, kind = when(e), e.get("type")
        if t is None:
            continue
        if kind == EventType.LOAD_STARTED and load_started is None:
            load_started = t
        elif kind == EventType.LOAD_STOPPED:
            load_stopped = t
        elif kind == EventType.RESTART_DONE:
            restarts.append(t)
        elif kind == EventType.INCIDENT:
            onset = _num(e.get("onset_at"))
            detected = _num(e.get("detected_at"))
            mark = onset if onset is not None else detected
            at = when(e, mark) if mark is not None else t
            incidents.append((at if at is not None else t, str(e.get("kind") or "incident")))
    # The summary's figures are labels: back onto the time line by the run_started event.
    anchor = {"ts": None, "type": "summary"}
    if load_started is None:
        started = summary.started_at
        loaded = summary.duration_s
        if not events and started is not None and loaded is not None and loaded > 0:
            # No events to place anything by: the summary's monotonic seconds of load, not a wall difference.
            reason = "cut off" if summary.cut_off else "end of load"
            return (Interval(started, loaded, False, reason),)
        load_started = None if started is None else when({**anchor, "ts": started})
    if load_started is None:
        return ()
    cut_off = bool(summary.cut_off)
    if load_stopped is not None:
        end, end_reason = load_stopped, "end of load"
    else:
        ended = summary.ended_at
        end = None if ended is None else when({**anchor, "ts": ended})
        end_reason = "cut off" if cut_off else "end of load"
    incidents.sort()
    restarts.sort()
    out: list[Interval] = []
    seg_start: float | None = load_started
    for onset, kind in incidents:
        if seg_start is None:
            # An incident with no restart before it (a second decision while the
            # first was being handled): it belongs to no interval at risk.
            continue
        stop = max(seg_start, onset)
        out.append(Interval(label(seg_start), stop - seg_start, kind == "hang", kind))
        nxt = [r for r in restarts if r >= onset]
        seg_start = nxt[0] if nxt else None
        if nxt:
            restarts.remove(nxt[0])
    if seg_start is not None and end is not None and end > seg_start:
        out.append(Interval(label(seg_start), end - seg_start, False, end_reason))
    return tuple(out)


@dataclass(frozen=True)
class AtRisk:
    """A night's hangs and exposure: what its MTBF is computed from."""
    intervals: tuple[Interval, ...]

    @property
    def exposure_s(self) -> float:
        return sum(i.length_s for i in self.intervals)

    @property
    def hangs(self) -> int:
        return sum(1 for i in self.intervals if i.hang)


def at_risk(events: Sequence[Mapping[str, Any]], summary: RunSummary | Mapping[str, Any]) -> AtRisk:
    """The night's hangs in its time at risk: pass both to ``mtbf_estimate``."""
    return AtRisk(intervals_of(events, summary))
