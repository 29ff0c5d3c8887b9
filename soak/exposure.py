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

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from soak.work import generated_tokens, record_time
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


def _anchor(events: Sequence[Mapping[str, Any]]) -> tuple[float, float] | None:
    """(ts, mono) of one event that carries both: ``run_started``'s, else the
    first such event's. Every event's ``mono`` is the same run-relative line, so
    any of them places a label on it; None: the run recorded no ``mono`` at all."""
    first: tuple[float, float] | None = None
    for e in events:
        ts, mono = _num(e.get("ts")), _num(e.get("mono"))
        if ts is None or mono is None:
            continue
        if e.get("type") == EventType.RUN_STARTED:
            return ts, mono
        if first is None:
            first = ts, mono
    return first


def time_line_offset(events: Sequence[Mapping[str, Any]]) -> float | None:
    """Wall minus monotonic on the run's time line (``_timeline``'s), None where the
    run recorded no ``mono``: a request's ``ended_at`` is moved onto the line by it."""
    anchor = _anchor(events)
    return None if anchor is None else anchor[0] - anchor[1]


def _timeline(events: Sequence[Mapping[str, Any]]) -> tuple[Any, Any, float | None]:
    """(time of an event, label of a time, wall minus monotonic or None): on the
    monotonic line when the run recorded ``mono`` on any event with a ``ts``
    (run-relative seconds; CONTRACTS.md "Time is monotonic"; an event's own
    ``mono`` always wins over its label), else on ``ts`` as a run recorded before
    ``mono`` existed."""
    anchor = _anchor(events)
    if anchor is not None:
        ts, mono = anchor

        def when(event: Mapping[str, Any], label: float | None = None) -> float | None:
            m, t = _num(event.get("mono")), _num(event.get("ts"))
            if label is not None:  # a label the event carries (an onset): as far before it as its ts
                base = m if m is not None else (None if t is None else mono + (t - ts))
                return None if base is None or t is None else base - (t - label)
            return m if m is not None else (None if t is None else mono + (t - ts))

        return when, lambda m: None if m is None else ts + (m - mono), ts - mono

    def when_wall(event: Mapping[str, Any], label: float | None = None) -> float | None:
        return label if label is not None else _num(event.get("ts"))

    return when_wall, lambda t: t, None


def _work_of_summary(summary: RunSummary) -> int | None:
    """The requests with generated tokens the judge counted (``work_evidence``'s
    evidence), None where the summary does not say."""
    if summary.criteria is None:
        return None
    for row in summary.criteria.results:
        if row.get("name") == "work_evidence" and isinstance(row.get("evidence"), Mapping):
            n = row["evidence"].get("requests_with_tokens")
            return n if type(n) is int else None
    return None


def _evidenced(seg_start: float, stop: float, work: np.ndarray) -> float:
    """How much of a censored interval [seg_start, stop] the target was seen
    working: up to its last productive end, or to ``stop`` where the tail after
    that end is no longer than the longest wait the life showed for work (from
    its start to the first productive end, or between two): the cadence the
    server kept, so a steady night keeps its whole span. No work: 0. ``work``:
    the productive ends, sorted (a search, not a scan: the live proof asks
    every tick of a night of hundreds of thousands of requests)."""
    lo, hi = np.searchsorted(work, seg_start, side="right"), np.searchsorted(work, stop, side="right")
    if hi <= lo:
        return 0.0
    ends = work[lo:hi]
    longest = float(ends[0]) - seg_start
    if len(ends) > 1:
        longest = max(longest, float(np.diff(ends).max()))
    last = float(ends[-1])
    return stop - seg_start if stop - last <= longest else last - seg_start


def intervals_of(events: Sequence[Mapping[str, Any]], summary: RunSummary | Mapping[str, Any],
                 records: Iterable[Mapping[str, Any]] | None = None, *,
                 work_at: Sequence[float] | None = None,
                 clean_until: tuple[float, str] | None = None) -> tuple[Interval, ...]:
    """The run's time-at-risk intervals, from its events (see the module docstring).
    Lengths are monotonic differences; ``Interval.start`` is a label. ``summary``:
    the typed record, or summary.json as parsed (read through it). ``records``: the
    run's request records (requests.jsonl): time counts at risk only while the
    target was evidenced working (``generated_tokens``, the one definition of
    work), so each censored interval ends at its life's last productive request
    (``_evidenced``) and a life with no work has none; an interval ended by a
    hang stays whole (the hang is the event). None: the records are not at hand;
    a summary whose judge counted no request with generated tokens then has no
    censored time at risk either. ``work_at``: the productive requests' ends
    already on the run's time line (the judge's one pass over the records), in
    place of ``records``. ``clean_until``: (a time on the run's time line, why):
    from there nothing is clean (a failed criterion dates its failure there), so
    an interval past it is cut to it, censored, and none begins after it."""
    summary = RunSummary.of(summary)
    when, label, offset = _timeline(events)
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
            # An onset is never after the record of its decision.
            incidents.append((t if at is None else min(at, t), str(e.get("kind") or "incident")))
    work: Any = None if work_at is None else work_at  # a sequence of floats, or an array: not copied here
    if records is not None and work is None:
        work = []
        for record in records:
            if isinstance(record, Mapping) and generated_tokens(record) > 0:
                at = record_time(record, offset=offset)
                if at is not None:
                    work.append(at)
    elif work is None and _work_of_summary(summary) == 0:
        work = []
    # The summary's figures are labels: back onto the time line by the run's anchor.
    anchor = {"ts": None, "type": "summary"}
    loaded = summary.duration_s
    if load_started is None:
        started = summary.started_at
        if not events and started is not None and loaded is not None and loaded > 0:
            # No events to place anything by: the summary's monotonic seconds of load, not a wall difference.
            if work is not None and len(work) == 0:
                return ()
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
    if end is not None:
        # An onset past the night's end lengthens nothing: the night is at risk up to its end.
        incidents = [(min(at, max(end, load_started)), kind) for at, kind in incidents]
    incidents.sort()
    restarts.sort()
    spans: list[tuple[float, float, bool, str]] = []  # (start on the time line, length, hang, ended by)
    seg_start: float | None = load_started
    for onset, kind in incidents:
        if seg_start is None:
            # An incident with no restart before it (a second decision while the
            # first was being handled): it belongs to no interval at risk.
            continue
        stop = max(seg_start, onset)
        spans.append((seg_start, stop - seg_start, kind == "hang", kind))
        nxt = [r for r in restarts if r >= onset]
        seg_start = nxt[0] if nxt else None
        if nxt:
            restarts.remove(nxt[0])
    if seg_start is not None and end is not None and end > seg_start:
        spans.append((seg_start, end - seg_start, False, end_reason))
    if work is not None:
        # Censored time counts only while the target was seen working; a hang's interval stays whole.
        ordered = np.sort(np.asarray(work, dtype=float), kind="stable")  # O(n) on the sorted ends it is given
        spans = [(begin, length if hang else _evidenced(begin, begin + length, ordered), hang, why)
                 for begin, length, hang, why in spans]
        spans = [s for s in spans if s[2] or s[1] > 0]
    if clean_until is not None:
        # Nothing after a failure the criteria date is clean: an interval past it is cut there,
        # censored; a hang stays a hang (its time cut the same way), never erased by the failure.
        until, why = clean_until
        spans = [(begin, max(0.0, min(length, until - begin)), hang, ended if hang or begin + length <= until else why)
                 for begin, length, hang, ended in spans if hang or begin < until]
    if loaded is not None and loaded > 0:
        # Never longer than the monotonic load the summary measured: a wall label on an
        # event without ``mono`` cannot stretch a night (the judge's ``run_span``).
        left, capped = loaded, []
        for begin, length, hang, why in spans:
            take = min(length, max(0.0, left))
            left -= take
            if take > 0 or hang or length <= 0:
                capped.append((begin, take, hang, why))
        spans = capped
    return tuple(Interval(label(begin), length, hang, why) for begin, length, hang, why in spans)


def known_clean(intervals: Iterable[Interval], *, until: float) -> tuple[Interval, ...]:
    """The time at risk known clean by label ``until`` (the load's end less the
    detection horizon: a hang begun after it may not have been detected yet): a
    censored interval is cut there; a recorded hang stays whole, it is known."""
    out: list[Interval] = []
    for i in intervals:
        if i.hang or i.start + i.length_s <= until:
            out.append(i)
        elif until > i.start:
            out.append(Interval(i.start, until - i.start, False, "detection horizon"))
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


def at_risk(events: Sequence[Mapping[str, Any]], summary: RunSummary | Mapping[str, Any],
            records: Iterable[Mapping[str, Any]] | None = None) -> AtRisk:
    """The night's hangs in its time at risk, as its judge counted them
    (summary.json's ``at_risk``: one count a night, every reader reads it); a
    summary without one (written before it, or a cut-off run no judge read) is
    counted here from its events and, given them, its request records."""
    recorded = recorded_intervals(summary)
    return AtRisk(recorded if recorded is not None else intervals_of(events, summary, records))


def intervals_json(intervals: Iterable[Interval]) -> list[dict[str, Any]]:
    return [{"start": i.start, "length_s": i.length_s, "hang": i.hang, "ended_by": i.ended_by}
            for i in intervals]


MAX_INTERVALS = 100_000  # a night's restarts are bounded by max_restarts; a hostile file is not


def recorded_intervals(summary: RunSummary | Mapping[str, Any]) -> tuple[Interval, ...] | None:
    """summary.json's ``at_risk.intervals`` as the judge wrote them; None where the
    summary has none, or any entry is not one (a damaged file is counted afresh,
    never half read)."""
    raw = summary.raw if isinstance(summary, RunSummary) else summary
    entry = raw.get("at_risk") if isinstance(raw, Mapping) else None
    rows = entry.get("intervals") if isinstance(entry, Mapping) else None
    if not isinstance(rows, list) or len(rows) > MAX_INTERVALS:
        return None
    out: list[Interval] = []
    for row in rows:
        if not isinstance(row, Mapping):
            return None
        start, length = _num(row.get("start")), _num(row.get("length_s"))
        hang, why = row.get("hang"), row.get("ended_by")
        if start is None or length is None or not math.isfinite(start) or not math.isfinite(length) \
                or length < 0 or type(hang) is not bool or not isinstance(why, str):
            return None
        out.append(Interval(start, length, hang, why[:200]))
    return tuple(out)
