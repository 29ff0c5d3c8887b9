"""Pure threshold evaluation: figures in, typed decisions with their reasons out.

``compile_thresholds(section)`` turns the config section into ``Threshold``s
(raising ``ThresholdConfigError`` naming the field); ``evaluate_run`` judges each
condition on the whole run's figures; ``evaluate_windows`` on every sliding window
of recorded requests and server samples (the worst window is the reason);
``WindowBook`` keeps what a live run needs for its abort checks. Nothing here
reads a clock or a file.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, Iterable, Mapping, Sequence

from soak.durations import format_latency
from soak.thresholds.config import unknown_metric_message
from soak.thresholds.expr import Condition, ThresholdSyntaxError, parse_condition
from soak.thresholds.metrics import RUN_METRICS, Better, Quantity, run_value, window_values

WINDOWLESS = frozenset({"hangs", "hang_rate"})


class ThresholdConfigError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field, self.message = field, message


class Outcome(str, Enum):
    PASSED = "passed"
    BREACHED = "breached"
    NO_DATA = "no_data"


@dataclass(frozen=True)
class Threshold:
    metric: str
    condition: Condition
    window_s: float | None = None
    abort_on_fail: bool = False
    delay_abort_eval_s: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.metric} {self.condition.text}"


@dataclass(frozen=True)
class ThresholdResult:
    name: str  # "ttft_p99 < 90s"
    metric: str
    expression: str
    scope: str  # "run" | "window"
    outcome: Outcome
    observed: float | None
    limit: float
    reason: str
    window_s: float | None = None
    window_end: float | None = None  # the worst window's end (unix seconds)
    windows: int = 0  # windows with data

    @property
    def breached(self) -> bool:
        # A gate that could not be measured does not pass: no data counts as a breach.
        return self.outcome is not Outcome.PASSED

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["outcome"] = self.outcome.value
        out["passed"] = not self.breached
        return out


def compile_thresholds(section: Mapping[str, Any] | None) -> tuple[Threshold, ...]:
    out: list[Threshold] = []
    for name, rule in (section or {}).items():
        if name not in RUN_METRICS or not RUN_METRICS[name].thresholdable:
            raise ThresholdConfigError(f"thresholds.{name}", unknown_metric_message(name))
        if isinstance(rule, Mapping):
            rule_get = rule.get
        else:
            rule_get = lambda key, default=None, _r=rule: getattr(_r, key, default)  # noqa: E731
        window = rule_get("window")
        if window is not None and name in WINDOWLESS:
            raise ThresholdConfigError(f"thresholds.{name}.window", f"{name} is a whole-run figure, not one of a window")
        conditions = rule_get("threshold") or ()
        if not conditions:
            raise ThresholdConfigError(f"thresholds.{name}", "needs at least one expression such as \"< 90s\"")
        for i, text in enumerate(conditions):
            try:
                condition = parse_condition(name, text)
            except ThresholdSyntaxError as exc:
                field = f"thresholds.{name}" + (f"[{i}]" if len(conditions) > 1 else "")
                raise ThresholdConfigError(field, str(exc)) from None
            out.append(Threshold(name, condition, window_s=window, abort_on_fail=bool(rule_get("abort_on_fail", False)),
                                 delay_abort_eval_s=float(rule_get("delay_abort_eval", 0.0) or 0.0)))
    return tuple(out)


def format_value(metric_name: str, value: float | None) -> str:
    if value is None:
        return "no data"
    q = RUN_METRICS[metric_name].quantity
    if q is Quantity.DURATION:
        return format_latency(value)
    if q is Quantity.RATIO:
        return f"{value * 100:.4g}%"
    if q is Quantity.RATE:
        return f"{value:.4g}/s"
    return f"{value:g}"


def judge(threshold: Threshold, observed: float | None, *, scope: str, window_end: float | None = None,
          windows: int = 0) -> ThresholdResult:
    c = threshold.condition
    where = "over the run" if scope == "run" else f"in the worst {threshold.window_s:g} s window"
    if observed is None or (isinstance(observed, float) and math.isnan(observed)):
        outcome, reason = Outcome.NO_DATA, f"{threshold.metric}: no data {where}, so {c.text} cannot be shown"
    elif c.holds(observed):
        outcome = Outcome.PASSED
        reason = f"{threshold.metric} = {format_value(threshold.metric, observed)} {where}: {c.text} holds"
    else:
        outcome = Outcome.BREACHED
        reason = f"{threshold.metric} = {format_value(threshold.metric, observed)} {where}: breaches {c.text}"
    return ThresholdResult(
        name=threshold.name + ("" if scope == "run" else f" (every {threshold.window_s:g} s window)"),
        metric=threshold.metric, expression=c.text, scope=scope, outcome=outcome, observed=observed,
        limit=c.value, reason=reason, window_s=threshold.window_s if scope == "window" else None,
        window_end=window_end, windows=windows,
    )


def evaluate_run(thresholds: Sequence[Threshold], summary: Mapping[str, Any]) -> list[ThresholdResult]:
    return [judge(t, run_value(t.metric, summary), scope="run") for t in thresholds]


def _worse(metric_name: str, a: float, b: float) -> bool:
    """Is ``a`` worse than ``b`` for this metric?"""
    return a > b if RUN_METRICS[metric_name].better is Better.LOWER else a < b


def window_step(window_s: float) -> float:
    return min(30.0, max(0.5, window_s / 10.0))


def window_ends(start: float, end: float, window_s: float) -> list[float]:
    """Windows end every ``window_step`` from ``start + window_s`` to ``end``; a run
    shorter than its window is judged over what it has (one window, to its end)."""
    step = window_step(window_s)
    first = start + window_s
    if first >= end:
        return [end]
    count = int((end - first) / step + 1e-9) + 1
    return [first + i * step for i in range(count)]


def worst_window(threshold: Threshold, requests: Sequence[Mapping[str, Any]],
                 server: Sequence[tuple[float, Mapping[str, Any]]], *, start: float, end: float
                 ) -> tuple[float | None, float | None, int]:
    """(worst observed value, the end of that window, windows with data)."""
    assert threshold.window_s is not None
    width = threshold.window_s
    reqs = sorted((r for r in requests if isinstance(r.get("ended_at"), (int, float))), key=lambda r: r["ended_at"])
    srv = sorted(server, key=lambda s: s[0])
    worst: float | None = None
    worst_end: float | None = None
    counted = 0
    lo_r = hi_r = lo_s = hi_s = 0
    for w_end in window_ends(start, end, width):
        w_start = max(start, w_end - width)
        while hi_r < len(reqs) and reqs[hi_r]["ended_at"] <= w_end:
            hi_r += 1
        while lo_r < hi_r and reqs[lo_r]["ended_at"] <= w_start:
            lo_r += 1
        while hi_s < len(srv) and srv[hi_s][0] <= w_end:
            hi_s += 1
        while lo_s < hi_s and srv[lo_s][0] < w_start:
            lo_s += 1
        value = window_values(reqs[lo_r:hi_r], srv[lo_s:hi_s], span_s=w_end - w_start).get(threshold.metric)
        if value is None:
            continue
        counted += 1
        if worst is None or _worse(threshold.metric, value, worst):
            worst, worst_end = value, w_end
    return worst, worst_end, counted


def evaluate_windows(thresholds: Sequence[Threshold], requests: Sequence[Mapping[str, Any]],
                     server: Sequence[tuple[float, Mapping[str, Any]]], *, start: float | None,
                     end: float | None) -> list[ThresholdResult]:
    out = []
    for t in thresholds:
        if t.window_s is None:
            continue
        if start is None or end is None or end <= start:
            out.append(judge(t, None, scope="window"))
            continue
        worst, at, counted = worst_window(t, requests, server, start=start, end=end)
        out.append(judge(t, worst, scope="window", window_end=at, windows=counted))
    return out


class WindowBook:
    """What a live run keeps for its abort checks: requests and server samples of
    the longest window only (bounded memory however long the soak)."""

    def __init__(self, thresholds: Sequence[Threshold], *, load_started_at: float) -> None:
        self.thresholds = tuple(t for t in thresholds if t.abort_on_fail)
        self.load_started_at = load_started_at
        longest = max((t.window_s or 0.0 for t in self.thresholds), default=0.0)
        self._horizon = longest
        self._cumulative = any(t.window_s is None for t in self.thresholds)
        self._requests: deque[Mapping[str, Any]] = deque()
        self._server: deque[tuple[float, Mapping[str, Any]]] = deque()
        self._all_requests: list[Mapping[str, Any]] = []  # only for thresholds over the run so far
        self._all_server: list[tuple[float, Mapping[str, Any]]] = []

    def add_request(self, record: Mapping[str, Any]) -> None:
        self._requests.append(record)
        if self._cumulative:
            self._all_requests.append(record)

    def add_server(self, ts: float, values: Mapping[str, Any]) -> None:
        self._server.append((ts, values))
        if self._cumulative:
            self._all_server.append((ts, values))

    def _trim(self, now: float) -> None:
        horizon = now - self._horizon
        while self._requests and (self._requests[0].get("ended_at") or 0) < horizon:
            self._requests.popleft()
        while self._server and self._server[0][0] < horizon:
            self._server.popleft()

    def check(self, now: float) -> ThresholdResult | None:
        """The first abort-on-fail threshold breached now, or None."""
        self._trim(now)
        for t in self.thresholds:
            if now - self.load_started_at < max(t.delay_abort_eval_s, t.window_s or 0.0):
                continue
            if t.window_s is None:
                reqs, srv, span = self._all_requests, self._all_server, now - self.load_started_at
            else:
                reqs = [r for r in self._requests if (r.get("ended_at") or 0) > now - t.window_s]
                srv = [s for s in self._server if s[0] >= now - t.window_s]
                span = t.window_s
            value = window_values(reqs, srv, span_s=span).get(t.metric)
            if value is None:
                continue  # an empty window is not evidence of a breach while the run goes on
            result = judge(t, value, scope="run" if t.window_s is None else "window", window_end=now, windows=1)
            if result.outcome is Outcome.BREACHED:
                return result
        return None


def thresholds_entry(results: Iterable[ThresholdResult]) -> dict[str, Any]:
    """summary.json's ``thresholds``: every result, and whether all passed."""
    rows = [r.to_json() for r in results]
    return {"passed": all(r["passed"] for r in rows), "breached": [r["name"] for r in rows if not r["passed"]],
            "results": rows}
