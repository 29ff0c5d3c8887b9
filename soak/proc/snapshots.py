"""One /proc reader for a whole process: the users in it share a pass.

The process probe (liveness and descendants of the root, every second), the
responder's tree tracking (every ``tree_snapshot_interval``) and the launched
target each used to walk /proc on their own schedule. ``ProcSnapshots`` keeps
the latest light table and hands it to whoever asks within ``max_age_s`` of
that pass; a caller that must see the box as it is now (a kill, a stop) asks
with ``max_age_s=0`` or for ``full()``, which never comes from the cache.

Thread-safe: the users call it from worker threads (``asyncio.to_thread``).
"""

from __future__ import annotations

import threading
from typing import Callable

from soak.clock import Clock, SystemClock
from soak.proc.facts import ProcTable
from soak.proc.read import read_table


def _light() -> ProcTable:
    return read_table(full=False)


class ProcSnapshots:
    def __init__(self, *, max_age_s: float = 1.0, clock: Clock | None = None,
                 read_light: Callable[[], ProcTable] = _light,
                 read_full: Callable[[], ProcTable] = read_table) -> None:
        self._max_age_s = max_age_s
        self._clock = clock or SystemClock()
        self._read_light = read_light
        self._read_full = read_full
        self._lock = threading.Lock()
        self._latest: tuple[float, ProcTable] | None = None
        # Passes over /proc made through this reader (light and full): what sharing saves.
        self.passes = 0

    def table(self, *, max_age_s: float | None = None) -> ProcTable:
        """A light table no older than ``max_age_s`` (default: the reader's bound)."""
        bound = self._max_age_s if max_age_s is None else max_age_s
        with self._lock:
            now = self._clock.monotonic()
            if self._latest is not None and bound > 0 and now - self._latest[0] <= bound:
                return self._latest[1]
            table = self._read_light()
            self.passes += 1
            self._latest = (now, table)
            return table

    def fresh(self) -> ProcTable:
        """A light table read now (and kept for the others)."""
        return self.table(max_age_s=0)

    def full(self) -> ProcTable:
        """The full table (environment, sockets, cgroups) read now: what ``decide`` judges."""
        with self._lock:
            self.passes += 1
        return self._read_full()

    __call__ = full  # a ProcReader


__all__ = ["ProcSnapshots"]
