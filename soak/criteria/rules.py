"""The failure criteria as pure constraint functions: a tally of finished
requests in, a typed decision with its reasons out (guidellm's good half).

``RequestTally`` folds request records (``RequestRecord`` or the dicts of
requests.jsonl) one at a time, in the order they finished; ``judge(config,
tally, final=...)`` reads it. The run loop feeds the tally live and judges every
detector tick (a no-success stretch can end the soak early); ``summarize`` feeds
a fresh tally from requests.jsonl at the end, so the verdict a nightly reads
and the one ``soak report`` recomputes are the same function of the same
records. No clock, no I/O.

Which records count: outcome ``ok`` is a success; ``aborted`` (cut by the
harness: the drain ran out, an incident's kill, Ctrl-C) counts neither way and
is kept apart by cause; every other outcome (HTTP status, reset, refused,
malformed stream, an error object, any timeout) is a failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Iterable, Mapping

from soak.criteria.config import CriteriaConfig

CUT_CAUSES = ("drain", "incident", "interrupt")


class CriterionState(str, Enum):
    INACTIVE = "inactive"  # switched off, or too few requests to judge
    PASS = "pass"
    AT_RISK = "at_risk"  # over its threshold now; judged at the end (the rate can recover)
    FAIL = "fail"


def _getter(record: Mapping[str, Any] | Any) -> Callable[..., Any]:
    # A plain dict first: a typing/abc isinstance check costs a microsecond, and
    # the end of a 24-hour run folds a few hundred thousand records.
    if type(record) is dict or isinstance(record, Mapping):
        return record.get
    return lambda key, default=None: getattr(record, key, default)


def cut_cause(record: Mapping[str, Any] | Any) -> str | None:
    """``drain``, ``incident`` or ``interrupt`` for a request the harness cut; None otherwise.
    Records written before ``cut_by`` existed are placed by their error text."""
    get = _getter(record)
    if get("outcome") != "aborted":
        return None
    cause = get("cut_by")
    if cause in CUT_CAUSES:
        return cause
    text = str(get("error") or "").lower()
    if "incident" in text or "restart" in text:
        return "incident"
    if "interrupt" in text or "sigint" in text or "sigterm" in text:
        return "interrupt"
    return "drain"


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

    __slots__ = ("ok", "failed", "cut", "failed_by_outcome", "_window", "_min_failures", "_current",
                 "breach", "longest")

    def __init__(self, *, window_s: float, min_failures: int) -> None:
        self.ok = 0
        self.failed = 0
        self.cut: dict[str, int] = {cause: 0 for cause in CUT_CAUSES}
        self.failed_by_outcome: dict[str, int] = {}
        self._window = window_s
        self._min_failures = min_failures
        self._current: Stretch | None = None
        self.breach: Stretch | None = None  # the first stretch past the window
        self.longest: Stretch | None = None

    @classmethod
    def for_config(cls, config: CriteriaConfig) -> "RequestTally":
        return cls(window_s=config.no_success.window, min_failures=config.no_success.min_failures)

    @classmethod
    def of(cls, config: CriteriaConfig, records: Iterable[Mapping[str, Any]]) -> "RequestTally":
        """A tally of stored records, folded in the order they ended."""
        tally = cls.for_config(config)
        rows = [r for r in records if isinstance(r, Mapping)]
        rows.sort(key=lambda r: r["ended_at"] if isinstance(r.get("ended_at"), (int, float)) else 0.0)
        for row in rows:
            tally.add(row)
        return tally

    @property
    def finished(self) -> int:
        return self.ok + self.failed

    @property
    def current(self) -> Stretch | None:
        return self._current

    def add(self, record: Mapping[str, Any] | Any) -> None:
        get = _getter(record)
        ended = get("ended_at")
        self.add_finished(get("outcome"), float(ended) if isinstance(ended, (int, float)) else 0.0, cut_cause(record))

    def add_finished(self, outcome: Any, ended: float, cause: str | None) -> None:
        """``add`` for a record already read: its outcome, end (0.0 when
        unknown) and ``cut_cause``."""
        if cause is not None:
            self.cut[cause] += 1
            return
        if outcome == "ok":
            self.ok += 1
            self._current = None
            return
        self.failed += 1
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


@dataclass(frozen=True)
class CriterionResult:
    name: str
    state: CriterionState
    value: float | None
    threshold: float | None
    reasons: tuple[str, ...]
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state.value, "value": self.value, "threshold": self.threshold,
                "reasons": list(self.reasons), "evidence": dict(self.evidence)}


@dataclass(frozen=True)
class CriteriaDecision:
    results: tuple[CriterionResult, ...]
    stop: bool  # end the soak now (a breach that cannot recover, with stop_on_breach)

    @property
    def failed(self) -> tuple[CriterionResult, ...]:
        return tuple(r for r in self.results if r.state is CriterionState.FAIL)

    @property
    def passed(self) -> bool:
        return not self.failed

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(reason for r in self.failed for reason in r.reasons[:1])

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "failed": [r.name for r in self.failed],
                "results": [r.to_json() for r in self.results]}


def _outcomes(tally: RequestTally) -> str:
    parts = sorted(tally.failed_by_outcome.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{name} {count}" for name, count in parts)


def error_rate(config: CriteriaConfig, tally: RequestTally, *, final: bool) -> CriterionResult:
    cfg = config.error_rate
    name = "error_rate"
    evidence = {"finished": tally.finished, "failed": tally.failed, "failed_by_outcome": dict(tally.failed_by_outcome),
                "cut": dict(tally.cut), "min_requests": cfg.min_requests}
    if not cfg.enabled:
        return CriterionResult(name, CriterionState.INACTIVE, None, cfg.max, ("disabled",), evidence)
    if tally.finished < cfg.min_requests:
        return CriterionResult(name, CriterionState.INACTIVE, None, cfg.max,
                               (f"{tally.finished} finished request(s), fewer than min_requests {cfg.min_requests}",),
                               evidence)
    rate = tally.failed / tally.finished
    summary = f"{tally.failed} of {tally.finished} finished requests failed"
    if tally.failed:
        summary += f" ({_outcomes(tally)})"
    if rate > cfg.max:
        state = CriterionState.FAIL if final else CriterionState.AT_RISK
        reason = f"error rate {rate:.1%} is above the {cfg.max:.1%} allowed: {summary}"
    else:
        state = CriterionState.PASS
        reason = f"error rate {rate:.1%} is within the {cfg.max:.1%} allowed: {summary}"
    return CriterionResult(name, state, rate, cfg.max, (reason,), evidence)


def no_success(config: CriteriaConfig, tally: RequestTally, *, final: bool) -> CriterionResult:
    cfg = config.no_success
    name = "no_success"
    evidence: dict[str, Any] = {"window_s": cfg.window, "min_failures": cfg.min_failures,
                                "longest": tally.longest.to_json() if tally.longest else None}
    if not cfg.enabled:
        return CriterionResult(name, CriterionState.INACTIVE, None, cfg.window, ("disabled",), evidence)
    breach = tally.breach
    if breach is not None:
        evidence["breach"] = breach.to_json()
        reason = (f"requests kept failing for {breach.length_s:.1f}s with none succeeding "
                  f"({breach.failures} failures; window {cfg.window:g}s)")
        return CriterionResult(name, CriterionState.FAIL, breach.length_s, cfg.window, (reason,), evidence)
    longest = tally.longest.length_s if tally.longest else 0.0
    return CriterionResult(name, CriterionState.PASS, longest, cfg.window,
                           (f"longest stretch of failures with no success {longest:.1f}s (window {cfg.window:g}s)",),
                           evidence)


CRITERIA = (error_rate, no_success)


def judge(config: CriteriaConfig, tally: RequestTally, *, final: bool) -> CriteriaDecision:
    """Every criterion on the tally. ``final``: the run's load is over (the error
    rate is then decided; before, a rate over its threshold is only at risk)."""
    results = tuple(rule(config, tally, final=final) for rule in CRITERIA)
    stop = config.stop_on_breach and any(
        r.state is CriterionState.FAIL and r.name == "no_success" for r in results)
    return CriteriaDecision(results=results, stop=stop)
