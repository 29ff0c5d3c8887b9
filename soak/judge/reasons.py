"""Why a run did not pass, in words a person reads the morning after. Pure.

``verdict_reasons`` is summary.json's ``verdict_reasons``: each incident, each
failed criterion, each breached threshold with its observed value ("ttft_p99
7.46 s > 2 s"), and for a run that ended without a pass for none of those (a
harness fault, an interrupt, a target never ready, a cut-off run) what ended
it. A run that did not pass always has at least one reason; the stop reason
(why the load stopped) is a separate, neutral fact.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

from soak.judge.ending import Ending, EndingSource
from soak.judge.ladder import Problem
from soak.records import Verdict
from soak.thresholds.evaluate import format_value
from soak.thresholds.expr import ThresholdSyntaxError, parse_condition
from soak.thresholds.metrics import RUN_METRICS


def value_text(metric: str, value: float | None) -> str:
    """A threshold figure in its metric's unit ("7.46 s", "651 ms", "12%")."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "no data"
    if metric in RUN_METRICS:
        return format_value(metric, value)
    return f"{value:g}"


def _relation(observed: float, limit: float) -> str:
    return ">" if observed > limit else "<" if observed < limit else "="


def threshold_text(row: Mapping[str, Any]) -> str:
    """One threshold result (summary.json's ``thresholds.results`` row, or
    ``ThresholdResult.to_json()``) as a person reads it: a breach by its observed
    value against the limit, a pass by its observed value and condition."""
    metric = str(row.get("metric") or "?")
    observed, limit = row.get("observed"), row.get("limit")
    expression = str(row.get("expression") or "")
    where = f" in the worst {row['window_s']:g} s window" if isinstance(row.get("window_s"), (int, float)) else ""
    if not _is_number(observed):
        return f"{metric}: no data{where}, so {expression} cannot be shown"
    shown = value_text(metric, observed)
    if row.get("passed") is True or not _is_number(limit):
        return f"{metric} {shown}{where} ({expression} holds)" if row.get("passed") is True \
            else f"{metric} {shown}{where} breaches {expression}"
    return f"{metric} {shown} {_relation(observed, limit)} {value_text(metric, limit)}{where}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def live_breach_text(event: Mapping[str, Any]) -> str:
    """A ``threshold_breached`` event (a live abort_on_fail stop) as a breach line."""
    name = str(event.get("threshold") or "?")
    metric, _, rest = name.partition(" ")
    expression = rest.split(" (every", 1)[0].strip()
    try:
        limit: float | None = parse_condition(metric, expression).value
    except (ThresholdSyntaxError, KeyError, ValueError):
        limit = None
    window = rest.split(" (every ", 1)[1].split(" s", 1)[0] if " (every " in rest else None
    row = {"metric": metric, "observed": event.get("observed"), "limit": limit, "expression": expression,
           "window_s": _float(window), "passed": False}
    return threshold_text(row) + " (stopped the load)"


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _ending_reason(ending: Ending, *, verdict: Verdict, stop_reason: str | None) -> str | None:
    """What ended a run that did not pass when no incident, criterion or threshold says why."""
    if ending.source is EndingSource.CUT_OFF:
        return "cut off: the run recorded no end (its harness or host died)"
    if ending.problem is Problem.ENVIRONMENT:
        return f"the environment stopped the run: {stop_reason or 'the target never became ready'}"
    if ending.problem is Problem.USAGE:
        return f"bad config, workload or arguments: {stop_reason or 'see the run log'}"
    if ending.harness_fault is not None:
        return f"harness fault {ending.harness_fault}"
    if ending.interrupted:
        return f"interrupted by the operator ({stop_reason or 'interrupted'})"
    if ending.failed_live or ending.incidents_seen:
        return "the run saw an incident or a failed response live that the record does not hold"
    if verdict is not Verdict.PASS:
        return f"the run ended without a pass ({stop_reason or 'no reason recorded'})"
    return None


def verdict_reasons(*, verdict: Verdict, ending: Ending, stop_reason: str | None,
                    incidents: Sequence[Mapping[str, Any]], criteria_reasons: Iterable[str],
                    breached_rows: Sequence[Mapping[str, Any]], live_breaches: Sequence[Mapping[str, Any]]
                    ) -> tuple[str, ...]:
    """summary.json's ``verdict_reasons``: every breach with its observed value."""
    reasons = [f"incident {i.get('number', '?')}: {i.get('kind', '?')} (rule {i.get('rule', '?')})" for i in incidents]
    reasons += criteria_reasons
    # A breach the run saw live (abort_on_fail) keeps its observed value where the
    # record's own evaluation has none for that threshold.
    live = {e.get("threshold") for e in live_breaches}
    measured = {row.get("name") for row in breached_rows if _is_number(row.get("observed"))}
    reasons += [threshold_text(row) for row in breached_rows if row.get("name") in measured or row.get("name") not in live]
    reasons += [live_breach_text(e) for e in live_breaches if e.get("threshold") not in measured]
    if verdict is not Verdict.PASS or ending.harness_fault is not None or ending.interrupted:
        said = _ending_reason(ending, verdict=verdict, stop_reason=stop_reason)
        # An incident or a breach already says why; a fault or an interrupt on top is said too.
        if said is not None and (not reasons or ending.harness_fault is not None or ending.interrupted
                                 or ending.source is EndingSource.CUT_OFF or ending.problem is not None):
            reasons.append(said)
    return tuple(reasons)


__all__ = ["live_breach_text", "threshold_text", "value_text", "verdict_reasons"]
