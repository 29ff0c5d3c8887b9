"""Detection latency in words, as an interval (issue 37), pure.

The live view, the end block and report.html say how long after the onset a
hang was detected the same way: "detected 0.9-1.6 s after the onset (onset
between 21:04:05.2 and 21:04:05.9 UTC)". A rule that gives no onset interval
is said as what it is, one estimate: "detected 1.2 s after the onset (point
estimate)". Figures are rounded outwards to the tenth (the lower end down, the
upper end up), so the interval said always holds the one computed.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Sequence

from soak.records import DetectionLatency

# The responder's words for the latency (soak.respond.responder._summary), said again by readers:
# Both its words: one figure (before issue 37), and latency_words' own since.
_RESPONDER_CLAUSE = re.compile(r"detected -?\d+(?:\.\d+)?s after onset"
                               r"|detected \d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? s after the onset(?: \(point estimate\))?")
# In tenths: a tenth of a millisecond. Unix seconds carry about 2e-7 s of float error,
# so 1.5999998 s is 1.6 on the page, not 1.5 (nor 1.6000002 s 1.7).
_NUDGE = 1e-3


def _down(seconds: float) -> float:
    return math.floor(seconds * 10 + _NUDGE) / 10


def _up(seconds: float) -> float:
    return math.ceil(seconds * 10 - _NUDGE) / 10


def shown_range(latency: DetectionLatency) -> tuple[float, float]:
    """(low, high) as said, to the tenth: low <= min_s and max_s <= high."""
    if latency.point:
        figure = round(latency.min_s, 1)
        return figure, figure
    return max(0.0, _down(latency.min_s)), _up(latency.max_s)


def latency_span(latency: DetectionLatency) -> str:
    """"0.9-1.6 s after the onset"; a point estimate says so."""
    low, high = shown_range(latency)
    if latency.point:
        return f"{low:.1f} s after the onset (point estimate)"
    if low == high:
        return f"{low:.1f} s after the onset"
    return f"{low:.1f}-{high:.1f} s after the onset"


def latency_words(latency: DetectionLatency | None) -> str:
    """"detected 0.9-1.6 s after the onset"; a point estimate says so."""
    return "detection latency unknown" if latency is None else f"detected {latency_span(latency)}"


def latencies_words(latencies: Sequence[DetectionLatency]) -> str | None:
    """Several incidents' latencies together, as the report's banner groups them: "each
    detected 0.9-2.0 s after its onset"; how many are point estimates is said."""
    if not latencies:
        return None
    if len(latencies) == 1:
        return latency_words(latencies[0])
    lows, highs = zip(*(shown_range(latency) for latency in latencies))
    low, high = min(lows), max(highs)
    figure = f"{low:.1f}" if low == high else f"{low:.1f}-{high:.1f}"
    points = sum(latency.point for latency in latencies)
    note = "" if not points else " (point estimates)" if points == len(latencies) else \
        f" ({points} of them {'a point estimate' if points == 1 else 'point estimates'})"
    return f"each detected {figure} s after its onset{note}"


def clock_utc(ts: float, *, up: bool = False) -> str:
    """Unix seconds as the time of day in UTC to the tenth (``21:04:05.2``), rounded
    down (or ``up``) so an interval's ends still hold it."""
    tenths = math.ceil(ts * 10 - _NUDGE) if up else math.floor(ts * 10 + _NUDGE)
    when = dt.datetime.fromtimestamp(tenths // 10, tz=dt.timezone.utc)
    return f"{when:%H:%M:%S}.{tenths % 10}"


def onset_words(latency: DetectionLatency | None) -> str | None:
    """"onset between 21:04:05.2 and 21:04:05.9 UTC", "onset at 21:04:05.2 UTC"; None
    where the onset times are not known (a latency read from summary.json alone)."""
    if latency is None or latency.onset_earliest is None or latency.onset_latest is None:
        return None
    if latency.point:
        return f"onset at {clock_utc(latency.onset_earliest)} UTC"
    low, high = clock_utc(latency.onset_earliest), clock_utc(latency.onset_latest, up=True)
    return f"onset at {low} UTC" if low == high else f"onset between {low} and {high} UTC"


def latency_sentence(latency: DetectionLatency | None) -> str:
    """The latency with its onset: "detected 0.9-1.6 s after the onset (onset between
    21:04:05.2 and 21:04:05.9 UTC)"."""
    onset = onset_words(latency)
    words = latency_words(latency)
    if onset is None:
        return words
    if words.endswith(" (point estimate)"):
        return words.removesuffix(")") + f"; {onset})"
    return f"{words} ({onset})"


def restated(summary: str, latency: DetectionLatency | None, *, sentence: bool = False) -> str:
    """An incident summary with the responder's single figure ("detected 2.3s after
    onset") said as the interval; where the summary has no such clause (a response
    cut off), the interval is added. ``sentence``: with the onset times too."""
    if latency is None:
        return summary
    words = latency_sentence(latency) if sentence else latency_words(latency)
    said, found = _RESPONDER_CLAUSE.subn(lambda _: words, summary, count=1)
    if found:
        return said
    return f"{summary}; {words}" if summary else words


__all__ = ["clock_utc", "latencies_words", "latency_sentence", "latency_span", "latency_words", "onset_words", "restated",
           "shown_range"]
