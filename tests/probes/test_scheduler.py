"""The probe scheduler: own intervals, errors survived, idempotent close."""

from __future__ import annotations

import asyncio

import pytest

from soak.clock import ManualClock
from soak.load.progress import ProgressTracker
from soak.probes.scheduler import ProbeScheduler
from soak.probes.target import ClientProbe
from soak.samples import HealthSample


class CountingProbe:
    def __init__(self, name, interval_s, *, fail_every=0, hang=False):
        self.name = name
        self.interval_s = interval_s
        self.calls = 0
        self.fail_every = fail_every
        self.hang = hang
        self.closed = 0
        self.reached = asyncio.Event()

    async def collect(self):
        self.calls += 1
        if self.calls >= 3:
            self.reached.set()
        if self.hang:
            await asyncio.sleep(3600)
        if self.fail_every and self.calls % self.fail_every == 0:
            raise RuntimeError(f"{self.name} failed on call {self.calls}")
        return [HealthSample(float(self.calls), True, 200)]

    async def aclose(self):
        self.closed += 1


@pytest.fixture
async def scheduler():
    made = []

    def make(probes, **kw):
        s = ProbeScheduler(probes, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        await s.close()


async def test_each_probe_runs_on_its_own_schedule_and_errors_are_survived(scheduler):
    fast = CountingProbe("fast", 0.01, fail_every=2)
    slow = CountingProbe("slow", 0.05)
    stuck = CountingProbe("stuck", 0.01, hang=True)
    emitted, errors = [], []
    s = scheduler([fast, slow, stuck], emit=emitted.append,
                  exception_handler=lambda probe, exc: errors.append((probe.name, str(exc))),
                  collect_timeout_s=0.05)
    s.start()
    await asyncio.wait_for(asyncio.gather(fast.reached.wait(), slow.reached.wait()), 20)
    await s.close()
    # the failing probe kept running after its failures; the stuck one timed out, repeatedly,
    # without holding up the others
    assert fast.calls >= 3 and slow.calls >= 3
    assert ("fast", "fast failed on call 2") in errors
    assert any(name == "stuck" for name, _ in errors)
    assert all(isinstance(x, HealthSample) for x in emitted)
    assert len(emitted) == fast.calls - fast.calls // 2 + slow.calls


async def test_close_is_idempotent_and_closes_probes(scheduler):
    probe = CountingProbe("p", 0.01)
    s = scheduler([probe], emit=lambda sample: None)
    s.start()
    await asyncio.wait_for(probe.reached.wait(), 20)
    await s.close()
    await s.close()
    calls = probe.calls
    await asyncio.sleep(0.05)
    assert probe.calls == calls and probe.closed == 1


async def test_a_failing_emit_or_handler_does_not_stop_the_probe(scheduler):
    probe = CountingProbe("p", 0.01)

    def emit(sample):
        raise ValueError("sink full")

    def handler(probe, exc):
        raise RuntimeError("handler broken too")

    s = scheduler([probe], emit=emit, exception_handler=handler)
    s.start()
    await asyncio.wait_for(probe.reached.wait(), 20)
    assert s.errors >= 2


async def test_client_probe_reads_the_progress_tracker():
    tracker = ProgressTracker()
    clock = ManualClock(1_800_000_000.0)
    sid, stream = tracker.open(clock.monotonic())
    stream.bytes, stream.tokens, stream.first_token_at = 1200, 30, clock.monotonic()
    clock.advance(2.5)
    (sample,) = await ClientProbe(tracker, clock=clock).collect()
    assert (sample.ts, sample.in_flight, sample.streaming, sample.bytes_total) == (1_800_000_002.5, 1, 1, 1200)
    assert sample.max_silence_s == pytest.approx(2.5)
    tracker.close(sid)
    (after,) = await ClientProbe(tracker, clock=clock).collect()
    assert (after.in_flight, after.requests_done, after.bytes_total) == (0, 1, 1200)
