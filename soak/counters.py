"""Counter increases as Prometheus ``increase()`` reads them: the one place.

Invariant: the increase of a counter over a span is the sum of its rises
between consecutive readings, and a reading below the one before (a reset or
any decrease) splits the span there: the counter is taken to have counted
again from 0, so the new reading itself is the rise, and the split is counted
(``resets``). A reading that is not a finite, non-negative number is no reading.

Every reader of server counters uses this: ``soak.store.summary``
(summary.json's server tokens and hit ratio), ``soak.export.live``,
``soak.thresholds.metrics`` (windowed hit ratio) and ``soak.report.plots``
(per-bin rates, via ``increases``).
"""

from __future__ import annotations

import math
from typing import Any, Iterable


def counter_value(value: Any) -> float | None:
    """A counter reading, or None for what cannot be one (NaN, inf, negative, not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    if not math.isfinite(value) or value < 0:
        return None
    return value


def step(previous: float | None, value: float) -> tuple[float, bool]:
    """The increase from ``previous`` to ``value`` and whether the span splits there."""
    if previous is None:
        return 0.0, False
    if value >= previous:
        return value - previous, False
    return value, True


class CounterDelta:
    """The increase of a counter across readings, through resets (see the module)."""

    __slots__ = ("total", "resets", "readings", "_last")

    def __init__(self) -> None:
        self.total = 0.0
        self.resets = 0
        self.readings = 0
        self._last: float | None = None

    def add(self, value: Any) -> bool:
        """Fold one reading in; True when it split the span (a reset or a decrease)."""
        reading = counter_value(value)
        if reading is None:
            return False
        rise, split = step(self._last, reading)
        self.total += rise
        self.resets += split
        self.readings += 1
        self._last = reading
        return split

    @property
    def seen(self) -> bool:
        return self._last is not None


def increases(values: Iterable[Any]) -> list[float]:
    """The per-step increases of a series (0 before the first reading and for
    what is no reading), so cumulative sums give a monotone reconstruction."""
    delta = CounterDelta()
    out: list[float] = []
    for value in values:
        before = delta.total
        delta.add(value)
        out.append(delta.total - before)
    return out


def counter_increase(values: Iterable[Any]) -> CounterDelta:
    delta = CounterDelta()
    for value in values:
        delta.add(value)
    return delta
