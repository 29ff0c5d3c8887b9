"""Clocks are injected, never read from deep inside pure logic.

``Clock.now()`` is unix seconds (what records carry); ``Clock.monotonic()`` is
for measuring intervals. ``ManualClock`` drives tests and trace replays.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def monotonic(self) -> float: ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._mono = 0.0

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._now += seconds
        self._mono += seconds

    def set(self, ts: float) -> None:
        self.advance(ts - self._now)
