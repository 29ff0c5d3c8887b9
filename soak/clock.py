"""Clocks are injected, never read from deep inside pure logic.

``Clock.now()`` is unix seconds (what records carry); ``Clock.monotonic()`` is
for measuring intervals. ``ManualClock`` drives tests and trace replays.

Invariant (CONTRACTS.md, "Time is monotonic"): every duration, rate, window and
exposure comes from the monotonic clock; the wall clock only labels. A run
reads its time through a ``RunClock``: its ``now()`` is the wall clock read once
at the run's start plus the monotonic time since, so a step of the system's
wall clock (NTP, an operator's ``date -s``) moves no record's ``ts`` relative to
another, and ``ts`` differences are monotonic differences everywhere (the
detector's windows, the summary, history). ``RunClock.wall()`` is the raw wall
clock; ``wall_step`` (the one place a step is recognised) compares the two, and
the run loop records each step as a ``wall_clock_step`` event.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

# A wall clock that moved this much more or less than the monotonic clock between
# two observations was stepped. NTP slews both clocks alike, so between readings
# a second apart the two agree to microseconds; 2 s is far above jitter from a
# descheduled reader and far below any step worth reporting.
WALL_STEP_TOLERANCE_S = 2.0


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

    def step_wall(self, seconds: float) -> None:
        """The wall clock jumps (either way); the monotonic clock does not move."""
        self._now += seconds


class RunClock:
    """A run's clock: labels that never step, on the monotonic time line.

    ``now()`` = the base clock's wall time at construction + monotonic seconds
    since; ``monotonic()`` is the base's; ``elapsed()`` is monotonic seconds since
    the run's clock started (what ``mono`` fields in the run directory carry);
    ``wall()`` is the base's wall clock as it is now, stepped or not."""

    def __init__(self, base: Clock) -> None:
        self.base = base
        self.origin_mono = base.monotonic()
        self.origin_wall = base.now()

    def now(self) -> float:
        return self.origin_wall + (self.base.monotonic() - self.origin_mono)

    def monotonic(self) -> float:
        return self.base.monotonic()

    def elapsed(self) -> float:
        return self.base.monotonic() - self.origin_mono

    def wall(self) -> float:
        return self.base.now()


def run_clock(clock: Clock | None) -> RunClock:
    """The run's clock over ``clock`` (the system's when None); a RunClock as it is."""
    if isinstance(clock, RunClock):
        return clock
    return RunClock(clock if clock is not None else SystemClock())


def raw_wall(clock: Clock) -> float:
    """The wall clock behind ``clock``, unsmoothed."""
    return clock.wall() if isinstance(clock, RunClock) else clock.now()


@dataclass(frozen=True)
class WallStep:
    """The wall clock moved ``step_s`` more than the monotonic clock between two
    observations (negative: it went back)."""

    step_s: float
    wall_before: float
    wall_after: float
    mono_before: float
    mono_after: float

    def to_json(self) -> dict[str, float]:
        return {"step_s": round(self.step_s, 3), "wall_before": self.wall_before, "wall_after": self.wall_after,
                "mono_before": round(self.mono_before, 6), "mono_after": round(self.mono_after, 6)}


def wall_step(before: tuple[float, float], after: tuple[float, float], *,
              tolerance_s: float = WALL_STEP_TOLERANCE_S) -> WallStep | None:
    """The step of the wall clock between two (wall, mono) observations, or None
    within ``tolerance_s``. The one place a step is recognised."""
    wall0, mono0 = before
    wall1, mono1 = after
    step = (wall1 - wall0) - (mono1 - mono0)
    if abs(step) <= tolerance_s:
        return None
    return WallStep(step, wall0, wall1, mono0, mono1)


class WallStepWatch:
    """Consecutive (wall, mono) observations in, each step beyond the tolerance
    out once: the reference moves with every observation, so a step is seen in
    the one interval it happened in."""

    def __init__(self, *, tolerance_s: float = WALL_STEP_TOLERANCE_S) -> None:
        self.tolerance_s = tolerance_s
        self._last: tuple[float, float] | None = None

    def observe(self, wall: float, mono: float) -> WallStep | None:
        last, self._last = self._last, (wall, mono)
        if last is None:
            return None
        return wall_step(last, (wall, mono), tolerance_s=self.tolerance_s)
