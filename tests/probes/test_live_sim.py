"""Probes and detector live against the simulator (in-process, real HTTP on loopback):
a stream runs, the detector stays healthy; a pp_deadlock injected through
POST /sim/fault is decided as pp_tail_stall by the probes' own samples."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from soak.clock import SystemClock
from soak.detect import Detector, DetectorConfig
from soak.load.progress import ProgressTracker
from soak.probes.build import build_gpu_source, build_probes
from soak.probes.config import ProbesConfig
from soak.probes.scheduler import ProbeScheduler
from soak.records import Topology


async def _stream(session, base, tracker, clock, stop: asyncio.Event):
    body = {"model": "deepseek-v4-flash", "prompt": "hello world " * 1000, "max_tokens": 200_000,
            "ignore_eos": True, "stream": True}
    sid, progress = tracker.open(clock.monotonic())
    try:
        async with session.post(base + "/v1/completions", json=body) as resp:
            async for chunk in resp.content.iter_any():
                progress.bytes += len(chunk)
                progress.tokens += chunk.count(b"data: ")
                progress.last_byte_at = clock.monotonic()
                if progress.first_token_at is None:
                    progress.first_token_at = progress.last_byte_at
                if stop.is_set():
                    return
    finally:
        tracker.close(sid)


async def test_probes_feed_the_detector_which_decides_an_injected_pp_deadlock(sim_app):
    sim = await sim_app(time_scale=5.0, pp_size=4)
    clock = SystemClock()
    cfg = ProbesConfig.model_validate({"gpu_interval": 0.1, "metrics_interval": 0.1, "health_interval": 0.2,
                                       "client_interval": 0.1})
    detector = Detector(DetectorConfig.model_validate({"pp_tail_stall": {"window": 1.0}}),
                        topology=Topology.pipeline(4))
    tracker = ProgressTracker()
    stop = asyncio.Event()
    seen = {"gpu": 0, "server": 0, "client": 0, "health": 0}

    def emit(sample):
        seen[sample.kind] = seen.get(sample.kind, 0) + 1
        detector.observe(sample)

    async with aiohttp.ClientSession() as session:
        gpu = build_gpu_source(cfg, base_url=sim.base_url, session=session, clock=clock, is_simulator=True)
        probes = build_probes(cfg, base_url=sim.base_url, session=session, clock=clock, gpu_source=gpu,
                              progress=tracker)
        scheduler = ProbeScheduler(probes, emit=emit)
        stream = asyncio.create_task(_stream(session, sim.base_url, tracker, clock, stop))
        scheduler.start()
        try:
            # healthy while the stream flows: wait (bounded) until tokens have arrived
            for _ in range(300):
                await asyncio.sleep(0.05)
                if tracker.tokens_total > 20 and seen["gpu"] > 3 and seen["server"] > 3:
                    break
            assert tracker.tokens_total > 20
            assert detector.assess(clock.now()).new_incidents == ()
            async with session.post(sim.base_url + "/sim/fault", json={"kind": "pp_deadlock"}) as resp:
                assert resp.status == 200, await resp.text()
            decision = None
            for _ in range(400):  # bounded: 20 s
                await asyncio.sleep(0.05)
                assessment = detector.assess(clock.now())
                if assessment.new_incidents:
                    decision = assessment.new_incidents[0]
                    break
            async with session.get(sim.base_url + "/sim/state") as resp:
                state = json.loads(await resp.text())
        finally:
            stop.set()
            await scheduler.close()
            stream.cancel()
            await asyncio.gather(stream, return_exceptions=True)
    assert decision is not None, "no decision within 20 s"
    assert decision.rule == "pp_tail_stall"
    assert decision.evidence["signals"]["tail_gpus"] == [3]
    onset = state["fault"]["onset_at"]
    assert decision.decided_at > onset
    assert abs(decision.onset_at - onset) < 2.0
