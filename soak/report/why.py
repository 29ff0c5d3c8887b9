"""Why a run ended as it did, in the words the top of report.html leads with.

Pure: summary.json (a ``RunSummary``) and the run's events in, sentences and
rows out. ``verdict_reasons`` names what failed the run (hangs by rule and
time, and how long after the onset they were detected; restarts, breached
thresholds with the observed value, failed criteria), ``stop_line`` says
neutrally why the load stopped, ``threshold_rows`` is the
table under the verdict, and ``server_warnings`` keeps only the warnings the
server earned: a /metrics or GPU source that went quiet while the harness itself
was killing or stopping the server is the harness's doing, not a warning.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from soak.events import EventType
from soak.durations import format_latency
from soak.onset import latencies_words
from soak.summary_file import IncidentEntry, RunSummary
from soak.thresholds.evaluate import format_value
from soak.thresholds.metrics import RUN_METRICS, Quantity

def clock(seconds: float) -> str:
    """Seconds since the start as a clock: ``+2:28``, ``+1:05:03``; ``-0:04``
    before it (never ``+-0s``)."""
    if not math.isfinite(seconds):
        return "?"
    whole = round(seconds)
    sign = "-" if whole < 0 else "+"
    whole = abs(whole)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{sign}{hours}:{minutes:02d}:{secs:02d}" if hours else f"{sign}{minutes}:{secs:02d}"


def _times(word: str, n: int) -> str:
    return {1: "once", 2: "twice"}.get(n, f"{n} times") if word == "times" else f"{n} {word}{'' if n == 1 else 's'}"


def _joined(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _incident_reasons(incidents: Sequence[IncidentEntry], start: float) -> list[str]:
    out = []
    kinds: dict[str, list[IncidentEntry]] = {}
    for incident in incidents:
        kinds.setdefault(incident.kind or "incident", []).append(incident)
    nouns = {"hang": "hang", "crash": "crash", "server_gone": "server loss"}
    for kind, items in kinds.items():
        rules = list(dict.fromkeys(i.rule for i in items if i.rule))
        at = [clock(t - start) for t in (i.onset_at if i.onset_at is not None else i.detected_at for i in items)
              if t is not None]
        noun = nouns.get(kind, kind)
        plural = "es" if noun.endswith("sh") else "s"
        text = f"{len(items)} {noun}{'' if len(items) == 1 else plural}"
        if rules:
            text += f" ({', '.join(rules)})"
        if at:
            text += f" at {_joined(at)}"
        latency = latencies_words([lat for i in items if (lat := i.detection_latency) is not None])
        if latency:  # the interval each onset allows (issue 37), not one optimistic figure
            text += f", {latency}"
        out.append(text)
    return out


_NEGATION = {"<": "\u2265", "<=": ">", ">": "\u2264", ">=": "<", "==": "\u2260", "!=": "="}
_OP = re.compile(r"^\s*(<=|>=|==|!=|<|>)\s*(.*)$")


def observed_text(metric: str | None, value: Any) -> str:
    """A figure as the table shows it: latencies in us/ms/s, ratios in %, rates per second."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return "no data"
    spec = RUN_METRICS.get(metric or "")
    if spec is None:
        return f"{value:.4g}"
    if spec.quantity is Quantity.DURATION:
        return format_latency(float(value))
    return format_value(spec.name, float(value))


def breach_text(result: Mapping[str, Any]) -> str:
    """``ttft_p99 7.46 s \u2265 2s``: the observed value against the condition it broke."""
    metric = str(result.get("metric") or result.get("name") or "?")
    expression = str(result.get("expression") or "")
    observed = result.get("observed")
    if not isinstance(observed, (int, float)) or isinstance(observed, bool):
        return f"{metric}: no data to show {expression}".strip()
    match = _OP.match(expression)
    where = f" in the worst {result['window_s']:g} s window" if isinstance(result.get("window_s"), (int, float)) else ""
    if match is None:
        return f"{metric} {observed_text(metric, observed)}{where} breaches {expression}"
    return f"{metric} {observed_text(metric, observed)} {_NEGATION[match.group(1)]} {match.group(2)}{where}"


def verdict_reasons(summary: RunSummary, *, start: float) -> tuple[str, ...]:
    """What made the run fail, most telling first; empty for a pass."""
    out = _incident_reasons(summary.incidents, start)
    if summary.restarts:
        out.append(f"the server restarted {_times('times', summary.restarts)}")
    thresholds = summary.thresholds
    if thresholds is not None:
        out += [breach_text(r) for r in thresholds.results if r.get("passed") is False]
        if thresholds.error:
            out.append(f"thresholds could not be judged: {thresholds.error}")
    if summary.criteria is not None:
        for row in summary.criteria.rows:
            if row.failed:
                out.append(row.reasons[0] if row.reasons else f"failure criterion {row.name}")
    if not out and summary.verdict is not None and summary.verdict.value != "pass":
        out += list(summary.verdict_reasons) or ([summary.stop_reason] if summary.stop_reason else [])
    return tuple(out)


def pass_line(summary: RunSummary) -> str:
    """A pass in neutral words: what held."""
    held = ["no hang", "no crash"]
    thresholds = summary.thresholds.results if summary.thresholds is not None else ()
    if thresholds:
        held.append(f"all {len(thresholds)} threshold{'s' if len(thresholds) > 1 else ''} held")
    if summary.criteria is not None and summary.criteria.rows:
        held.append("failure criteria met")
    return "Passed: " + ", ".join(held) + "."


def stop_line(summary: RunSummary) -> str | None:
    """Why the load stopped, as a plain fact (the planned duration, an incident's
    policy, an interrupt); the banner says whether that is good or bad."""
    reason = summary.stop_reason
    if not reason:
        return None
    planned = summary.planned_duration_s
    if reason == "duration" and planned:
        from soak.durations import format_duration

        return f"The run ended: its planned duration ({format_duration(planned, approx=True)}) was reached."
    return f"The run ended: {reason}."


@dataclass(frozen=True)
class Window:
    """A span of unix seconds in which the harness itself had the server down."""

    start: float
    end: float
    why: str

    def holds(self, ts: float) -> bool:
        return self.start <= ts <= self.end


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def harness_windows(events: Sequence[Mapping[str, Any]], *, grace_s: float) -> tuple[Window, ...]:
    """From each incident's decision to its restart being done, and from the stop
    of the load on: the spans in which the server was down because the harness
    took it down. Each widened by ``grace_s`` (the stale mark of /metrics) either
    side: a stale span starts at the last fresh scrape, up to that long before the
    kill, and ends once a prober has seen the restarted server."""
    out: list[Window] = []
    open_kill: tuple[float, int] | None = None
    for e in events:
        kind, ts = e.get("type"), _number(e.get("ts"))
        if ts is None:
            continue
        if kind in (EventType.INCIDENT_STARTED, EventType.INCIDENT) and open_kill is None:
            open_kill = (_number(e.get("detected_at")) or ts, int(e.get("number") or 0))
        elif kind == EventType.RESTART_DONE and open_kill is not None:
            out.append(Window(open_kill[0] - grace_s, ts + grace_s, f"incident {open_kill[1]}'s kill and restart"))
            open_kill = None
        elif kind in (EventType.LOAD_STOPPED, EventType.TARGET_STOPPED, EventType.RUN_ENDED):
            out.append(Window((open_kill[0] if open_kill else ts) - grace_s, math.inf, "the harness stopping the server"))
            break
    if open_kill is not None and not any(w.end == math.inf for w in out):
        out.append(Window(open_kill[0] - grace_s, math.inf, f"incident {open_kill[1]}'s kill"))
    return tuple(out)


def _by_harness(ts: float | None, windows: Sequence[Window]) -> bool:
    return ts is not None and any(w.holds(ts) for w in windows)


def server_warnings(summary: RunSummary, events: Sequence[Mapping[str, Any]]) -> list[str]:
    """The warnings a reader should blame on the server: /metrics gone stale, a
    stale GPU source, other warnings; less those that began while the harness had
    the server down (an incident's kill and restart, the stop at the end)."""
    metrics = summary.server_metrics or {}
    grace = _number(metrics.get("stale_after_s")) or 5.0
    windows = harness_windows(events, grace_s=grace)
    out = []
    note = summary.server_metrics_note
    if note:
        spans = [s for s in (metrics.get("stale_spans") or ()) if isinstance(s, Mapping)]
        began = [_number(s.get("first_failure")) or _number(s.get("from")) for s in spans]
        tail = _number(metrics.get("stale_after"))
        if tail is not None and all(_number(s.get("from")) != tail for s in spans):
            began.append(tail)
        never = _number(metrics.get("covered_from")) is None
        if never or any(b is not None and not _by_harness(b, windows) for b in began):
            out.append(f"Server metrics: {note}.")
    for e in events:
        if e.get("type") in (EventType.GPU_SOURCE_STALE, EventType.WARNING) and e.get("message") \
                and not _by_harness(_number(e.get("ts")), windows):
            out.append(str(e["message"]))
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class ThresholdView:
    """One row of the thresholds table."""

    held: bool
    metric: str
    condition: str
    observed: str
    window: str
    breached_at: str


def threshold_rows(summary: RunSummary, *, start: float) -> tuple[ThresholdView, ...]:
    if summary.thresholds is None:
        return ()
    rows = []
    for r in summary.thresholds.results:
        held = r.get("passed") is True
        window_s = _number(r.get("window_s"))
        window = f"worst {window_s:g} s window" if window_s is not None else "whole run"
        end = _number(r.get("window_end"))
        if held:
            at = ""
        elif end is not None:
            at = f"{clock(end - window_s - start)} to {clock(end - start)}" if window_s else clock(end - start)
        elif r.get("outcome") == "no_data":
            at = "no data"
        else:
            at = "over the whole run"
        metric = str(r.get("metric") or r.get("name") or "?")
        rows.append(ThresholdView(held=held, metric=metric, condition=str(r.get("expression") or ""),
                                  observed=observed_text(metric, r.get("observed")), window=window, breached_at=at))
    return tuple(rows)
