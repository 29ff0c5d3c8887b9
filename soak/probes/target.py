"""Health (``GET /health`` status and latency), root-process liveness, client progress."""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Protocol

from soak.clock import Clock
from soak.proc.facts import ProcTable
from soak.proc.snapshots import ProcSnapshots
from soak.samples import ClientSample, HealthSample, ProcessSample


class HealthProbe:
    name = "health"

    def __init__(self, base_url: str, *, session, clock: Clock, interval_s: float = 1.0, timeout_s: float = 2.0):
        self.url = base_url.rstrip("/") + "/health"
        self.interval_s = interval_s
        self._session = session
        self._clock = clock
        self._timeout_s = timeout_s

    async def collect(self) -> list[HealthSample]:
        import aiohttp

        ts = self._clock.now()
        started = time.monotonic()
        from soak.bounds import InputRejected, fetch

        try:
            status = (await fetch(self._session, self.url, total_s=self._timeout_s)).status
        except (aiohttp.ClientError, TimeoutError, OSError, InputRejected) as exc:
            error = f"{type(exc).__name__}: {exc}".rstrip(": ")
            return [HealthSample(ts, False, None, time.monotonic() - started, error)]
        return [HealthSample(ts, status == 200, status, time.monotonic() - started)]

    async def aclose(self) -> None:
        pass


def process_state(pid: int, table: ProcTable) -> tuple[bool, tuple[int, ...]] | None:
    """Whether ``pid`` is alive (a zombie is not) and its descendants' PIDs, from
    one table of the shared reader; None when the table does not hold ``pid`` (it
    may predate the process: the caller asks the process itself)."""
    facts = table.procs.get(pid)
    if facts is None:
        return None
    if facts.zombie:
        return False, ()
    return True, tuple(sorted(table.descendants(pid) - {pid}))


def _state(pid: int, reader: ProcSnapshots) -> tuple[bool, tuple[int, ...]]:
    state = process_state(pid, reader.table())
    if state is None:
        state = process_state(pid, reader.fresh())
    return state if state is not None else (False, ())


class ProcessProbe:
    """Liveness of the target's root PID. ``returncode`` (the launched target's
    ``Target.returncode``) supplies the exit code when the harness is the parent.
    A root that died within the reader's staleness bound reads alive until the next
    table (the launched target's exit code is immediate)."""

    name = "process"

    def __init__(
        self,
        pid: int,
        *,
        clock: Clock,
        interval_s: float = 1.0,
        returncode: Callable[[], int | None] | None = None,
        proc: ProcSnapshots | None = None,
    ) -> None:
        self.pid = pid
        # The process's shared /proc reader: the responder's tree walk reads the same table.
        self._proc = proc if proc is not None else ProcSnapshots()
        self.interval_s = interval_s
        self._clock = clock
        self._returncode = returncode

    async def collect(self) -> list[ProcessSample]:
        ts = self._clock.now()
        code = self._returncode() if self._returncode is not None else None
        if code is not None:
            return [ProcessSample(ts, self.pid, False, code)]
        alive, tree = await asyncio.to_thread(_state, self.pid, self._proc)
        return [ProcessSample(ts, self.pid, alive, None, tree)]

    async def aclose(self) -> None:
        pass


class ProgressSource(Protocol):
    """soak.load.progress.ProgressTracker's side that the probe reads."""

    def snapshot(self, now: float, mono: float | None = None) -> ClientSample: ...


class ClientProbe:
    name = "client"

    def __init__(self, tracker: ProgressSource, *, clock: Clock, interval_s: float = 0.5):
        self.interval_s = interval_s
        self._tracker = tracker
        self._clock = clock

    async def collect(self) -> list[ClientSample]:
        return [self._tracker.snapshot(self._clock.now(), self._clock.monotonic())]

    async def aclose(self) -> None:
        pass
