"""Runs each probe on its own interval and hands every sample to one callback.

A probe that raises is reported to the exception handler and runs again at its
next tick; a slow probe delays only itself (one collect in flight per probe,
missed ticks are skipped, not queued). ``close()`` is idempotent.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Iterable, Protocol, Sequence

from soak.samples import Sample

log = logging.getLogger(__name__)


class Probe(Protocol):
    name: str
    interval_s: float

    async def collect(self) -> Iterable[Sample]: ...

    async def aclose(self) -> None: ...


ExceptionHandler = Callable[[Probe, BaseException], None]


def _log_exception(probe: Probe, exc: BaseException) -> None:
    log.warning("probe %s failed: %s: %s", probe.name, type(exc).__name__, exc)


class ProbeScheduler:
    def __init__(
        self,
        probes: Sequence[Probe],
        *,
        emit: Callable[[Sample], None],
        exception_handler: ExceptionHandler | None = None,
        collect_timeout_s: float | None = 10.0,
    ) -> None:
        self.probes = tuple(probes)
        self._emit = emit
        self._on_error = exception_handler or _log_exception
        self._collect_timeout_s = collect_timeout_s
        self._tasks: list[asyncio.Task] = []
        self._closed = False
        self.errors = 0

    def start(self) -> None:
        if self._tasks or self._closed:
            return
        for probe in self.probes:
            self._tasks.append(asyncio.create_task(self._loop(probe), name=f"probe-{probe.name}"))

    async def _loop(self, probe: Probe) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not self._closed:
            try:
                samples = await asyncio.wait_for(probe.collect(), self._collect_timeout_s)
                for sample in samples:
                    self._emit(sample)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.errors += 1
                try:
                    self._on_error(probe, exc)
                except Exception:  # a broken handler must not stop the probe
                    log.exception("exception handler failed for probe %s", probe.name)
            next_at = max(next_at + probe.interval_s, loop.time())
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for probe in self.probes:
            try:
                await probe.aclose()
            except Exception as exc:
                self._on_error(probe, exc)
