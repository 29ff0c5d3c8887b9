"""Health (``GET /health`` status and latency), root-process liveness, client progress."""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Protocol

from soak.clock import Clock
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


def process_state(pid: int) -> tuple[bool, tuple[int, ...]]:
    """Whether ``pid`` is alive (a zombie is not) and its descendants' PIDs."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False, ()
        children = tuple(sorted(c.pid for c in proc.children(recursive=True)))
        return True, children
    except psutil.NoSuchProcess:
        return False, ()
    except psutil.AccessDenied:
        return True, ()


class ProcessProbe:
    """Liveness of the target's root PID. ``returncode`` (the launched target's
    ``Target.returncode``) supplies the exit code when the harness is the parent."""

    name = "process"

    def __init__(
        self,
        pid: int,
        *,
        clock: Clock,
        interval_s: float = 1.0,
        returncode: Callable[[], int | None] | None = None,
    ) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self._clock = clock
        self._returncode = returncode

    async def collect(self) -> list[ProcessSample]:
        ts = self._clock.now()
        code = self._returncode() if self._returncode is not None else None
        if code is not None:
            return [ProcessSample(ts, self.pid, False, code)]
        alive, tree = await asyncio.to_thread(process_state, self.pid)
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
