"""The load generator: drives a workload through the streaming client.

Three shapes, one bound: every loop that sends stops at the deadline or the
request cap, whichever comes first, then drains for at most ``drain`` seconds
and cuts what is still in flight (each cut request still gets its record).

- closed: ``concurrency`` session slots; each slot takes the next session,
  sends its turns one after another with the think time before each, and
  takes a new session when one ends.
- open: arrivals with gamma gaps (shape ``burstiness``, mean ``1/rate``); each
  arrival sends the next turn of a round robin over ``concurrency`` sessions,
  with at most ``concurrency`` requests in flight.
- replay: the workload's own timestamped arrivals (``Workload.arrivals()``).

``pause()`` holds new requests (a restart is under way); ``resume()`` lets them go.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from soak.clock import Clock, SystemClock
from soak.load.client import StreamingClient
from soak.load.config import LoadConfig
from soak.samples import CutCause, RequestRecord


@dataclass(frozen=True)
class LoadResult:
    started_mono: float
    stopped_mono: float  # when sending stopped (deadline, cap, stop(), workload exhausted)
    drained_mono: float
    requests_sent: int
    aborted_at_drain: int
    stop_reason: str


class LoadGenerator:
    def __init__(
        self,
        *,
        workload: Any,
        client: StreamingClient,
        config: LoadConfig,
        duration_s: float,
        warmup_s: float,
        on_record: Callable[[RequestRecord], None],
        seed: int = 0,
        clock: Clock | None = None,
    ) -> None:
        self._workload = workload
        self._client = client
        self._config = config
        self._duration_s = duration_s
        self._warmup_s = warmup_s
        self._on_record = on_record
        self._rng = random.Random(seed)
        self._clock = clock or SystemClock()
        self._stop = asyncio.Event()
        self._stop_reason = "duration"
        self._open = asyncio.Event()
        self._open.set()
        self._sent = 0
        self._session_index = 0
        self._in_flight: set[asyncio.Task[None]] = set()
        self._started: float | None = None

    # -- control -------------------------------------------------------------
    def stop(self, reason: str) -> None:
        if not self._stop.is_set():
            self._stop_reason = reason
            self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def pause(self) -> None:
        self._open.clear()

    def resume(self) -> None:
        self._open.set()

    @property
    def requests_sent(self) -> int:
        return self._sent

    # -- the run -------------------------------------------------------------
    async def run(self) -> LoadResult:
        mono = self._clock.monotonic
        self._started = mono()
        deadline = asyncio.get_running_loop().call_later(self._duration_s, self.stop, "duration")
        mode = "replay" if getattr(self._workload, "mode", "sessions") == "arrivals" else self._config.mode
        try:
            if mode == "closed":
                workers = [
                    asyncio.create_task(self._session_slot(), name=f"soak-session-slot-{i}")
                    for i in range(self._config.concurrency)
                ]
                self._in_flight.update(workers)
                await self._until_stopped_or_done(workers)
            elif mode == "open":
                await self._schedule(self._open_arrivals())
            else:
                await self._schedule(self._replay_arrivals())
        finally:
            deadline.cancel()
        if not self._stop.is_set():
            self._stop_reason = "workload exhausted"
            self._stop.set()
        stopped = mono()
        aborted = await self._drain()
        return LoadResult(
            started_mono=self._started,
            stopped_mono=stopped,
            drained_mono=mono(),
            requests_sent=self._sent,
            aborted_at_drain=aborted,
            stop_reason=self._stop_reason,
        )

    async def _until_stopped_or_done(self, workers: list[asyncio.Task[None]]) -> None:
        stop_wait = asyncio.create_task(self._stop.wait())
        try:
            pending = set(workers)
            while pending and not self._stop.is_set():
                done, pending = await asyncio.wait(pending | {stop_wait}, return_when=asyncio.FIRST_COMPLETED)
                pending.discard(stop_wait)
                for task in done:
                    if task is not stop_wait and not task.cancelled() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
        finally:
            stop_wait.cancel()

    async def _drain(self) -> int:
        """Let in-flight requests finish for up to ``drain`` seconds, then cut them."""
        tasks = {t for t in self._in_flight if not t.done()}
        if not tasks:
            return 0
        done, pending = await asyncio.wait(tasks, timeout=self._config.drain)
        aborted = 0
        if pending:
            aborted = self._client.abort_in_flight("drain time ran out", cut_by=CutCause.DRAIN)
            # Closed-loop slots sleeping in think time hold no request: end them.
            done2, still = await asyncio.wait(pending, timeout=5.0)
            for task in still:
                task.cancel()
            if still:
                await asyncio.wait(still)
        return aborted

    # -- sending -------------------------------------------------------------
    def _take_slot(self) -> bool:
        """Count one request against the cap; stop once it is reached."""
        cap = self._config.max_requests
        if cap is not None and self._sent >= cap:
            self.stop("request cap")
            return False
        self._sent += 1
        if cap is not None and self._sent >= cap:
            self.stop("request cap")  # this last one still goes out, and drains
        return True

    async def _send(self, turn: Any, request_number: int) -> None:
        assert self._started is not None
        warmup = self._clock.monotonic() - self._started < self._warmup_s
        record = await self._client.send(turn, request_id=f"r{request_number:06d}", warmup=warmup)
        self._on_record(record)

    async def _wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True if the run is stopping."""
        if seconds > 0:
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=seconds)
            except asyncio.TimeoutError:
                pass
        return self._stop.is_set()

    async def _gate(self) -> bool:
        """Wait while paused; True if the run is stopping."""
        if not self._open.is_set():
            stop_wait = asyncio.create_task(self._stop.wait())
            open_wait = asyncio.create_task(self._open.wait())
            try:
                await asyncio.wait({stop_wait, open_wait}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop_wait.cancel()
                open_wait.cancel()
        return self._stop.is_set()

    def _new_session(self) -> Any:
        session = self._workload.new_session(self._session_index)
        self._session_index += 1
        return session

    async def _session_slot(self) -> None:
        while not self._stop.is_set():
            session = self._new_session()
            if session is None:
                return
            while True:
                turn = session.next_turn()
                if turn is None:
                    break
                if await self._wait(turn.think_time_s) or await self._gate():
                    return
                if not self._take_slot():
                    return
                await self._send(turn, self._sent)

    def _round_robin_turns(self) -> Iterator[Any]:
        """Turns from up to ``concurrency`` live sessions, one from each in turn."""
        live: list[Any] = []
        exhausted = False
        while True:
            while not exhausted and len(live) < self._config.concurrency:
                session = self._new_session()
                if session is None:
                    exhausted = True
                    break
                live.append(session)
            if not live:
                return
            session = live.pop(0)
            turn = session.next_turn()
            if turn is None:
                continue
            live.append(session)
            yield turn

    def _open_arrivals(self) -> Iterator[tuple[float, Any]]:
        rate = self._config.rate or 1.0
        shape = self._config.burstiness
        offset = 0.0
        for turn in self._round_robin_turns():
            offset += self._rng.gammavariate(shape, 1.0 / (rate * shape))
            yield offset, turn

    def _replay_arrivals(self) -> Iterator[tuple[float, Any]]:
        for arrival in self._workload.arrivals():
            yield arrival.offset_s, arrival.request

    async def _schedule(self, arrivals: Iterator[tuple[float, Any]]) -> None:
        """Send each arrival at its offset, at most ``concurrency`` in flight."""
        assert self._started is not None
        slots = asyncio.Semaphore(self._config.concurrency)
        for offset, turn in arrivals:
            delay = self._started + offset - self._clock.monotonic()
            if await self._wait(delay) or await self._gate():
                return
            if not await self._acquire(slots):
                return
            if not self._take_slot():
                slots.release()
                return
            task = asyncio.create_task(self._send_released(turn, self._sent, slots))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)
            if self._stop.is_set():
                return

    async def _acquire(self, slots: asyncio.Semaphore) -> bool:
        if not slots.locked():
            await slots.acquire()
            return not self._stop.is_set()
        acquire = asyncio.create_task(slots.acquire())
        stop_wait = asyncio.create_task(self._stop.wait())
        await asyncio.wait({acquire, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        stop_wait.cancel()
        if self._stop.is_set():
            if acquire.done() and not acquire.cancelled():
                slots.release()
            else:
                acquire.cancel()
            return False
        return True

    async def _send_released(self, turn: Any, number: int, slots: asyncio.Semaphore) -> None:
        try:
            await self._send(turn, number)
        finally:
            slots.release()
