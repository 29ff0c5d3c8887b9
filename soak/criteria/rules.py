"""What the failure criteria read: a tally of finished requests (the criteria
themselves, pure constraint functions with a typed decision and its reasons out,
are ``soak.criteria.constraints``: guidellm's good half).

``RequestTally`` folds request records (``RequestRecord`` or the dicts of
requests.jsonl) one at a time, in the order they finished; ``judge(config,
tally, final=...)`` reads it. The run loop feeds the tally live and judges every
detector tick (a no-success stretch can end the soak early); ``summarize`` feeds
a fresh tally from requests.jsonl at the end, so the verdict a nightly reads
and the one ``soak report`` recomputes are the same function of the same
records. No clock, no I/O.

Which records count: outcome ``ok`` with generated tokens (``generated_tokens``)
is a success; ``aborted`` (cut by the harness: the drain ran out, an incident's
kill, Ctrl-C) counts neither way and is kept apart by cause; every other outcome
(HTTP status, reset, refused, malformed stream, an error object, any timeout) is
a failure, and so is an ``ok`` that generated nothing (an empty or
whitespace-only answer, a usage count with no content): it is tallied as the
failed outcome ``no_output`` (``NO_OUTPUT``), for the error rate and the
failure stretches alike, while requests.jsonl keeps the ``ok`` the client saw.
A server answering nothing then fails; a rare legitimate empty completion
costs only its share of the error-rate budget.

Work (``work_evidence``): a success is not yet work. What counts as work is
decided in one place (``soak.work.generated_tokens``, which the time at risk
shares): a request that ended ``ok`` having streamed content (its ``ttft_s`` is set) and reporting
``output_tokens`` > 0. Bytes, SSE comments, a usage count with no content, and
requests still streaming when the harness cut them are not. The tally keeps
where that work fell in time against the load's span (``LoadSpan``): the first
and last productive end, the longest gap between two, and the per-window
counts, in O(1) state (windows close in time order).

Time: a record's end is read through ``record_time`` only (the run's monotonic
clock when the run recorded one, else ``ended_at``); the live loop passes its
injected clock's ``monotonic()`` instead, for the record's end, the load's
start and ``watch(now)`` alike.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable, Mapping

from soak.criteria.claims import ClaimsTally
from soak.criteria.config import CriteriaConfig, WorkEvidenceCriterion
from soak.samples import CutCause, server_accepted
from soak.work import finite_number as _number
from soak.work import generated_tokens, record_time
from soak.work import getter as _getter

_CUT_CAUSES = frozenset(cause.value for cause in CutCause)
# The tally's name for a request that ended ``ok`` with no generated tokens: a
# failure (see the module's docstring), never an outcome the client records.
NO_OUTPUT = "no_output"


class CriterionState(str, Enum):
    INACTIVE = "inactive"  # switched off, or too few requests to judge
    PASS = "pass"
    AT_RISK = "at_risk"  # over its threshold now; judged at the end (the rate can recover)
    FAIL = "fail"


def cut_cause(record: Mapping[str, Any] | Any) -> CutCause | None:
    """``drain``, ``incident`` or ``interrupt`` for a request the harness cut; None otherwise.
    Records written before ``cut_by`` existed are placed by their error text."""
    get = _getter(record)
    if get("outcome") != "aborted":
        return None
    cause = get("cut_by")
    if cause in _CUT_CAUSES:
        return CutCause(cause)
    text = str(get("error") or "").lower()
    if "incident" in text or "restart" in text:
        return CutCause.INCIDENT
    if "interrupt" in text or "sigint" in text or "sigterm" in text:
        return CutCause.INTERRUPT
    return CutCause.DRAIN


@dataclass(frozen=True)
class LoadSpan:
    """When the load ran, on the clock records are read on (``record_time``).

    ``started``: the ``load_started`` event; ``ended``: ``load_stopped`` (None for
    a run cut off before it); ``offset``: wall minus monotonic when the events
    carry ``mono`` (then the span and the records are on the monotonic clock),
    None for runs that recorded the wall clock only; ``cut_short``: the harness
    itself ended the load (Ctrl-C / SIGTERM, its own fault), so a load with no
    work yet is judged on the time it had, not as a finished night; ``restarts``:
    for each restart, when the load paused for the incident (``incident_started``)
    and when the new server life began (``restart_done``): the time between is not
    owed work, and each life gets its start-up allowance."""

    started: float | None
    ended: float | None = None
    offset: float | None = None
    cut_short: bool = False
    restarts: tuple[tuple[float, float], ...] = ()
    stopped_sending: float | None = None  # the drain began (``load_stopped``'s mono less its drain_s)

    @classmethod
    def of_events(cls, started: Mapping[str, Any] | None, stopped: Mapping[str, Any] | None, *,
                  cut_short: bool = False,
                  restarts: Iterable[tuple[Mapping[str, Any] | None, Mapping[str, Any]]] = ()) -> "LoadSpan":
        """``restarts``: (``incident_started`` or None, ``restart_done``) event pairs."""
        if started is None:
            return cls(None, cut_short=cut_short)
        ts, mono = _number(started.get("ts")), _number(started.get("mono"))
        offset = ts - mono if ts is not None and mono is not None else None

        def at(event: Mapping[str, Any] | None) -> float | None:
            if event is None:
                return None
            if offset is not None:
                m = _number(event.get("mono"))
                if m is not None:
                    return m
                t = _number(event.get("ts"))
                return None if t is None else t - offset
            return _number(event.get("ts"))

        lives = []
        for paused, resumed in restarts:
            back = at(resumed)
            if back is not None:
                down = at(paused)
                lives.append((min(down, back) if down is not None else back, back))
        end = at(stopped)
        drain = _number(stopped.get("drain_s")) if stopped is not None else None
        sending = end - drain if end is not None and drain is not None and drain >= 0 else None
        return cls(at(started), end, offset, cut_short, tuple(sorted(lives)), sending)


@dataclass(frozen=True)
class Gap:
    """Load time with no request finishing with generated tokens: ``start`` to ``end``."""

    start: float
    end: float

    @property
    def length_s(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class WindowCount:
    start: float
    requests: int
    tokens: int


@dataclass(frozen=True)
class Windows:
    """The full windows judged: how many, how many met the floor, the first that did not."""

    judged: int
    short: int
    first_short: WindowCount | None


@dataclass(frozen=True)
class Stretch:
    """Failures with no success between: ends of the first and latest failure."""

    first_end: float
    last_end: float
    failures: int

    @property
    def length_s(self) -> float:
        return self.last_end - self.first_end

    def to_json(self) -> dict[str, Any]:
        return {"from": self.first_end, "to": self.last_end, "length_s": round(self.length_s, 3),
                "failures": self.failures}


class RequestTally:
    """Counts and the failing stretches of the records folded in so far.

    ``window_s`` and ``min_failures`` (the no-success criterion's) decide which
    stretch is remembered as the breach; the tally keeps O(1) state whatever the
    run's length.
    """

    __slots__ = ("ok", "failed", "cut", "failed_by_outcome", "first_failed", "_window", "_min_failures", "_current",
                 "breach", "longest", "work", "offset", "load_started", "load_ended", "watched", "latest",
                 "cut_short", "work_requests", "work_tokens", "ok_without_tokens", "first_work", "last_work",
                 "longest_gap", "life_started", "life_first", "life_last", "slow_start", "restarts", "_pending",
                 "_judged_before", "_win", "_win_end", "_win_requests", "_win_tokens", "_short", "_first_short",
                 "claims")

    def __init__(self, *, window_s: float, min_failures: int, work: WorkEvidenceCriterion | None = None,
                 span: LoadSpan | None = None, config: CriteriaConfig | None = None) -> None:
        self.ok = 0
        self.failed = 0
        self.cut: dict[str, int] = {cause.value: 0 for cause in CutCause}
        self.failed_by_outcome: dict[str, int] = {}
        self.first_failed: float | None = None  # the earliest failed request's end: where an error rate dates from
        self._window = window_s
        self._min_failures = min_failures
        self._current: Stretch | None = None
        self.breach: Stretch | None = None  # the first stretch past the window
        self.longest: Stretch | None = None
        # Work evidence, on the span's clock (see the module's docstring).
        self.work = work if work is not None else WorkEvidenceCriterion()
        span = span or LoadSpan(None)
        self.offset = span.offset
        self.load_started: float | None = span.started
        self.load_ended: float | None = span.ended
        self.cut_short = span.cut_short
        self.watched: float | None = None  # live: the latest ``watch(now)``
        self.latest: float | None = None  # the latest record end folded in
        self.work_requests = 0
        self.work_tokens = 0
        self.ok_without_tokens = 0
        self.first_work: float | None = None
        self.last_work: float | None = None
        self.longest_gap: Gap | None = None  # between two productive requests of one server life
        # The current server life (a restart starts another): its start, first and last work.
        self.life_started: float | None = span.started
        self.life_first: float | None = None
        self.life_last: float | None = None
        self.slow_start: Gap | None = None  # the slowest life start to its first work
        self.restarts = 0
        self._pending = list(span.restarts)  # restarts not folded in yet (stored runs)
        self._judged_before = 0  # full windows of earlier lives
        self._win = 0  # the window records now fall in, when it ends, and its counts
        self._win_end = -math.inf  # unknown until a record is placed
        self._win_requests = 0
        self._win_tokens = 0
        self._short = 0  # closed windows below the floor
        self._first_short: WindowCount | None = None
        # The work claims (model, usage, work rate, the client's work for the server's counters).
        self.claims = ClaimsTally(config if config is not None else CriteriaConfig())
        self.claims.origin = span.started
        self.claims.rate.stopped = span.stopped_sending

    @classmethod
    def for_config(cls, config: CriteriaConfig, *, span: LoadSpan | None = None) -> "RequestTally":
        return cls(window_s=config.no_success.window, min_failures=config.no_success.min_failures,
                   work=config.work_evidence, span=span, config=config)

    @classmethod
    def of(cls, config: CriteriaConfig, records: Iterable[Mapping[str, Any]], *,
           span: LoadSpan | None = None) -> "RequestTally":
        """A tally of stored records, folded in the order they ended."""
        tally = cls.for_config(config, span=span)
        rows = [r for r in records if isinstance(r, Mapping)]
        offset = tally.offset
        timed = [(record_time(r, offset=offset), r) for r in rows]
        timed.sort(key=lambda tr: tr[0] if tr[0] is not None else 0.0)
        for t, row in timed:
            tally.add(row, at=t)
        return tally

    # -- the load's span (live: the run loop, on its monotonic clock) -------------
    def open_load(self, at: float) -> None:
        """The load started at ``at``: work is owed from here."""
        if self.load_started is None:
            self.load_started = self.life_started = at
            self.claims.origin = at

    def stop_sending(self, at: float) -> None:
        """The load stopped sending at ``at`` (live: the drain began): the work rate is judged up to here."""
        if self.claims.rate.stopped is None:
            self.claims.rate.stopped = at

    def restart(self, paused: float, at: float) -> None:
        """The load paused at ``paused`` for an incident and a new server life
        began at ``at``: windows and gaps start again, with a new start-up
        allowance; the windows the old life completed before the pause stay
        judged, the rest of it (the hang, the kill, the relaunch) is not owed."""
        if self.life_started is None:
            return
        full = max(0, math.floor((min(paused, at) - self.life_started) / self.work.window))
        self._short, self._first_short = self._closed(full)
        self._judged_before += full
        self.life_started, self.life_first, self.life_last = at, None, None
        self._win, self._win_end, self._win_requests, self._win_tokens = 0, -math.inf, 0, 0
        self.restarts += 1
        self.claims.rate.restart(paused, at)

    def _restarts_until(self, t: float) -> None:
        while self._pending and self._pending[0][1] <= t:
            self.restart(*self._pending.pop(0))

    def settled(self, until: float) -> "RequestTally":
        """This tally with the recorded restarts up to ``until`` folded in (a copy
        when any is left: judging never changes the tally)."""
        if not self._pending or self._pending[0][1] > until:
            return self
        other = copy.copy(self)
        other.claims = copy.deepcopy(self.claims)
        other._pending = list(self._pending)
        other._restarts_until(until)
        return other

    def close_load(self, at: float) -> None:
        """The load is over (drained) at ``at``."""
        self.load_ended = at

    def watch(self, now: float) -> None:
        """The run has been watched up to ``now`` (live: every detector tick)."""
        if self.watched is None or now > self.watched:
            self.watched = now

    @property
    def finished(self) -> int:
        return self.ok + self.failed

    @property
    def current(self) -> Stretch | None:
        return self._current

    def add(self, record: Mapping[str, Any] | Any, *, at: float | None = None) -> None:
        """Fold one record in. ``at``: when it ended on the span's clock (the live
        loop's ``monotonic()``); else ``record_time`` reads it."""
        get = _getter(record)
        ended = at if at is not None else record_time(record, offset=self.offset)
        self.add_finished(get("outcome"), ended if ended is not None else 0.0, cut_cause(record),
                          tokens=generated_tokens(record), record=get,
                          accepted=server_accepted(record if isinstance(record, Mapping) else {
                              "http_status": get("http_status"), "outcome": get("outcome")}))

    def add_finished(self, outcome: Any, ended: float, cause: str | None, *, tokens: int = 0,
                     record: Any = None, accepted: bool = True) -> None:
        """``add`` for a record already read: its outcome, end (0.0 when
        unknown), ``cut_cause`` and ``generated_tokens``; ``record``: a getter of
        its fields for the work claims (None: none kept), ``accepted``: ``server_accepted``."""
        if cause is not None:
            if record is not None:  # streamed tokens the server generated, then cut: the client's total only
                self.claims.add(record, at=ended, tokens=0, accepted=accepted)
            self.cut[cause] += 1
            return
        if self.latest is None or ended > self.latest:
            self.latest = ended
        if self._pending:
            self._restarts_until(ended)
        if record is not None:
            self.claims.add(record, at=ended, tokens=tokens, accepted=accepted)
        if outcome == "ok":
            if tokens > 0:
                self.ok += 1
                self._current = None
                # An end before its life's start (an unreadable time, a skewed clock) counts at the start.
                origin = self.life_started
                self._worked(ended if origin is None or ended >= origin else origin, tokens)
                return
            # Answered with nothing: not a success (the module's docstring).
            self.ok_without_tokens += 1
            outcome = NO_OUTPUT
        self.failed += 1
        if self.first_failed is None or ended < self.first_failed:
            self.first_failed = ended
        key = str(outcome)
        self.failed_by_outcome[key] = self.failed_by_outcome.get(key, 0) + 1
        cur = self._current
        cur = Stretch(ended, ended, 1) if cur is None else Stretch(cur.first_end, max(cur.last_end, ended),
                                                                    cur.failures + 1)
        self._current = cur
        if self.longest is None or cur.length_s > self.longest.length_s:
            self.longest = cur
        if (self.breach is None or self.breach.first_end == cur.first_end) and \
                cur.length_s >= self._window and cur.failures >= self._min_failures:
            self.breach = cur

    # -- work evidence -------------------------------------------------------------
    def _window_of(self, t: float) -> int:
        assert self.life_started is not None
        return max(0, math.floor((t - self.life_started) / self.work.window))

    def _worked(self, t: float, tokens: int) -> None:
        self.work_requests += 1
        self.work_tokens += tokens
        if self.first_work is None:
            self.first_work = t
        if self.last_work is None or t > self.last_work:
            self.last_work = t
        if self.life_first is None:
            self.life_first = t
            if self.life_started is not None:
                start = Gap(self.life_started, t)
                if self.slow_start is None or start.length_s > self.slow_start.length_s:
                    self.slow_start = start
        elif self.life_last is not None and t > self.life_last:
            gap = Gap(self.life_last, t)
            if self.longest_gap is None or gap.length_s > self.longest_gap.length_s:
                self.longest_gap = gap
        if self.life_last is None or t > self.life_last:
            self.life_last = t
        if self.life_started is None:
            return
        if t >= self._win_end:  # past the current window (or the first record): place it
            index = self._window_of(t)
            if index > self._win:
                self._short, self._first_short = self._closed(index)
                self._win, self._win_requests, self._win_tokens = index, 0, 0
            self._win_end = self.life_started + (self._win + 1) * self.work.window
        self._win_requests += 1
        self._win_tokens += tokens

    def _met(self, requests: int, tokens: int) -> bool:
        return requests >= self.work.min_requests and tokens >= self.work.min_tokens

    def _closed(self, upto: int) -> tuple[int, WindowCount | None]:
        """Short windows and the first of them once every window before ``upto``
        is closed: the current one with its counts, those after it empty."""
        short, first = self._short, self._first_short
        if upto <= self._win or self.life_started is None:
            return short, first
        window = self.work.window
        if not self._met(self._win_requests, self._win_tokens):
            short += 1
            first = first or WindowCount(self.life_started + self._win * window, self._win_requests, self._win_tokens)
        empties = upto - self._win - 1
        if empties > 0 and not self._met(0, 0):
            short += empties
            first = first or WindowCount(self.life_started + (self._win + 1) * window, 0, 0)
        return short, first

    def until(self, *, final: bool) -> float | None:
        """The time the work is judged up to: the load's end once it is over (and
        recorded), else the latest time the run was watched or a record ended."""
        if final and self.load_ended is not None:
            return self.load_ended
        known = [t for t in (self.watched, self.latest, self.load_ended) if t is not None]
        return max(known) if known else self.load_started

    def windows(self, until: float) -> Windows:
        """The full windows of the load (every server life's) up to ``until``, judged against the floor."""
        if self.life_started is None or until <= self.life_started:
            return Windows(self._judged_before, self._short, self._first_short)
        full = math.floor((until - self.life_started) / self.work.window)
        short, first = self._closed(full)
        return Windows(self._judged_before + full, short, first)
