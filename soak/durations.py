"""Durations: the one parser (config values and command-line flags) and the one formatter.

``parse_duration`` reads what a config may say (``"90s"``, ``"66m"``,
``"1h30m"``, ``"250ms"``; a bare ``90`` is seconds, which the config loader warns
about); ``duration_flag`` is the same for a command-line flag, whose error names
the flag and exits 2, and which refuses a bare number. ``format_duration``
writes seconds back either exactly, in the form the parser reads (``1h6m``,
``45s``: plans, the live view), or approximately for a sentence (``66 min``,
``1.5 h``: MTBF statements, reports, history). ``format_latency`` writes a
latency in the unit that keeps it readable (``651 us``, ``12.3 ms``, ``7.46 s``),
never ``0.000651 s``.
"""

from __future__ import annotations

import math
import re
from typing import Any

from soak.errors import ArgumentError

# The longest duration anything may say: 30 days. A soak runs hours to a few
# days; a month is past any planned run, yet small enough that every sum a
# planner makes of durations (warm-up, segments, deadlines, clock steps) stays
# finite and its loops short. NaN, infinity and 1e23h would never end one.
MAX_DURATION_S = 30 * 86400.0

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any, *, maximum: float = MAX_DURATION_S) -> float:
    """Seconds from ``90``, ``90.5``, ``"90s"``, ``"66m"``, ``"1h30m"``, ``"250ms"``:
    finite, from 0 to ``maximum`` (``MAX_DURATION_S``, 30 days, for every config
    duration); anything else is a ValueError."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 90s, 66m or 1h30m")
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:  # an int past a float's range
            seconds = math.inf
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            pos, seconds = 0, 0.0
            for m in _DURATION_PART.finditer(text):
                if m.start() != pos:
                    break
                seconds += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
                pos = m.end()
            if pos != len(text) or not text:
                raise ValueError(f"{value!r} is not a duration such as 90s, 66m or 1h30m") from None
    else:
        raise ValueError("expected a duration such as 90s, 66m or 1h30m")
    if math.isnan(seconds):
        raise ValueError("a duration must be a number of seconds, not NaN")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    if math.isinf(seconds):
        raise ValueError("a duration must be finite")
    if seconds > maximum:
        raise ValueError(f"a duration can be at most {maximum / 86400:g} days ({maximum:.0f}s)")
    return seconds


def duration_flag(text: str | None, *, flag: str = "--duration", positive: bool = False) -> float | None:
    """Seconds from a command-line flag's value (``66m``), None when not given;
    a bad value, or a number without a unit (``40``), is an ArgumentError naming
    ``flag`` (exit 2). Finite, with no maximum here: ``--duration`` becomes the
    config's duration and is held to ``MAX_DURATION_S`` there; the others
    (``--window``, ``--baseline-mtbf``) are statistics' parameters, where a
    century is an answer, not a loop."""
    if text is None:
        return None
    bare = text.strip()
    try:
        float(bare)
    except ValueError:
        pass
    else:
        # As thresholds refuse "< 90": a bare number could mean seconds or minutes,
        # and `--duration 40` quietly soaking 40 s instead of 40 min wastes a night.
        raise ArgumentError(f"{flag}: {bare!r} has no unit: write {bare}s or {bare}m")
    try:
        seconds = parse_duration(text, maximum=math.inf)
    except ValueError as exc:
        raise ArgumentError(f"{flag}: {exc}") from None
    if positive and seconds <= 0:
        raise ArgumentError(f"{flag} must be positive")
    return seconds


def format_duration(seconds: float | None, *, approx: bool = False) -> str:
    """``seconds`` exactly as the parser reads it back (``1h6m``, ``45s``), or with
    ``approx`` rounded for a sentence (``66 min``, ``1.5 h``; ``infinity`` for none)."""
    if approx:
        if seconds is None or not math.isfinite(seconds):
            return "infinity"
        if seconds < 120:
            return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
        if seconds < 2 * 3600:
            return f"{seconds / 60:.0f} min" if seconds >= 600 else f"{seconds / 60:.1f} min"
        return f"{seconds / 3600:.1f} h"
    seconds = float(seconds)  # type: ignore[arg-type]
    if seconds < 60:
        return f"{seconds:g}s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    parts = [f"{hours}h"] if hours else []
    if minutes:
        parts.append(f"{minutes}m")
    if secs:
        parts.append(f"{secs}s")
    return "".join(parts)


# (unit, seconds in one) from the smallest; a value is written in the largest unit it reaches.
_LATENCY_UNITS = (("us", 1e-6), ("ms", 1e-3), ("s", 1.0))


def format_latency(seconds: float | None) -> str:
    """A latency to three significant digits (trailing zeros dropped) in us under
    a millisecond, ms under a second, else s: ``651 us``, ``12.3 ms``, ``35 ms``,
    ``7.46 s``; ``—`` for none. The threshold parser reads each back (``< 651 us``)."""
    if seconds is None or math.isnan(seconds):
        return "\u2014"
    if math.isinf(seconds):
        return "inf s" if seconds > 0 else "-inf s"
    if seconds == 0:
        return "0 s"
    sign, size = ("-" if seconds < 0 else ""), abs(seconds)
    index = 0
    while index + 1 < len(_LATENCY_UNITS) and size >= _LATENCY_UNITS[index + 1][1]:
        index += 1
    while True:
        unit, scale = _LATENCY_UNITS[index]
        text = _three_digits(size / scale)
        # 999.96 us rounds to "1000": that is 1.00 ms, written in the next unit.
        if float(text) < 1000 or index + 1 == len(_LATENCY_UNITS):
            return f"{sign}{text} {unit}"
        index += 1


def _three_digits(value: float) -> str:
    decimals = 0 if value >= 99.95 else 1 if value >= 9.995 else 2
    text = f"{value:.{decimals}f}"
    # 35 ms, 1.2 s: trailing zeros add no digit a reader needs
    return text.rstrip("0").rstrip(".") if "." in text else text


__all__ = ["MAX_DURATION_S", "duration_flag", "format_duration", "format_latency", "parse_duration"]
