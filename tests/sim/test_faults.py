"""Faults in-process (fast) and, for the exit path, with real processes."""

import asyncio
import io

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from soak.sim.config import SimConfig
from soak.sim.logs import SimLog

MODEL = "deepseek-v4-flash"


def _gen(text):
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "vllm:generation_tokens_total":
                return s.value


async def _poll(pred, timeout=20.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await pred():
            return True
        await asyncio.sleep(0.02)
    raise AssertionError("timed out")


async def _state(s, base):
    async with s.get(base + "/sim/state") as r:
        return await r.json()


async def test_pp_deadlock_stalls_streams_freezes_counters_then_engine_dies(sim_app):
    log = io.StringIO()
    sim = await sim_app(time_scale=200, log=SimLog(stream=log, pid=1))
    base = sim.base_url
    async with aiohttp.ClientSession() as s:
        body = {"model": MODEL, "prompt": "go\n", "max_tokens": 100000, "stream": True}
        async with s.post(base + "/v1/completions", json=body) as r:
            seen = 0
            async for line in r.content:  # mid-response
                if line.startswith(b"data: "):
                    seen += 1
                    if seen == 5:
                        break
            async with s.post(base + "/sim/fault", json={"kind": "pp_deadlock", "execute_timeout": 200,
                                                         "watchdog_timeout": 100, "ringbuffer_warning_interval": 60}) as fr:
                assert (await fr.json())["active"]
            async with s.get(base + "/metrics") as m:
                frozen = _gen(await m.text())
            st = await _state(s, base)
            assert [g["util_pct"] for g in st["gpus"]] == [100.0] * 7 + [0.0]
            async with s.get(base + "/health") as h:
                assert h.status == 200
            with pytest.raises(asyncio.TimeoutError):  # the stream stalls: nothing more arrives
                for _ in range(50):
                    await asyncio.wait_for(r.content.readline(), 0.2)
            async with s.get(base + "/metrics") as m:
                assert _gen(await m.text()) == frozen
            rest = await asyncio.wait_for(r.content.read(), 10)  # after the execute timeout: an error event
            assert b"EngineCore encountered an issue" in rest and rest.endswith(b"data: [DONE]\n\n")
        async with s.get(base + "/health") as h:
            assert h.status == 503
    text = log.getvalue()
    assert text.index("No available shared memory broadcast block found in 60 seconds") < text.index(
        "Watchdog caught collective operation timeout") < text.index("RPC call to execute_model timed out") < text.index("EngineDeadError")


async def test_after_requests_trigger_and_all_idle_deadlock(sim_app):
    cfg = SimConfig(time_scale=200, log_stats_interval=0, faults=[{"kind": "all_idle_deadlock", "after_requests": 2}])
    sim = await sim_app(cfg)
    async with aiohttp.ClientSession() as s:
        for _ in range(2):
            async with s.post(sim.base_url + "/v1/completions", json={"model": MODEL, "prompt": "x\n", "max_tokens": 3}) as r:
                assert r.status == 200
        assert not (await _state(s, sim.base_url))["fault"]["fired"]
        with pytest.raises(asyncio.TimeoutError):
            async with s.post(sim.base_url + "/v1/completions", json={"model": MODEL, "prompt": "x\n", "max_tokens": 3},
                              timeout=aiohttp.ClientTimeout(total=0.5)) as r:
                await r.read()
        st = await _state(s, sim.base_url)
        assert st["fault"]["kind"] == "all_idle_deadlock" and st["fault"]["active"] and st["fault"]["onset_at"]
        assert all(g["util_pct"] == 0 for g in st["gpus"])
        assert st["engine"]["waiting"] + st["engine"]["running"] == 1


def test_mtbf_onsets_are_deterministic_by_seed():
    from soak.sim.server import SimServer

    def due(seed):
        cfg = SimConfig(seed=seed, faults=[{"kind": "crash", "mtbf": "30m"}, {"kind": "slow", "mtbf": "10m"}])
        return [a.due_at for a in SimServer(cfg).faults.armed]

    assert due(1) == due(1) and due(1) != due(2)


async def test_metrics_stall_keeps_serving(sim_app):
    sim = await sim_app(time_scale=200)
    async with aiohttp.ClientSession() as s:
        async with s.post(sim.base_url + "/sim/fault", json={"kind": "metrics_stall"}) as r:
            assert r.status == 200
        with pytest.raises(asyncio.TimeoutError):
            async with s.get(sim.base_url + "/metrics", timeout=aiohttp.ClientTimeout(total=0.3)) as r:
                await r.read()
        async with s.post(sim.base_url + "/v1/completions", json={"model": MODEL, "prompt": "x\n", "max_tokens": 4}) as r:
            assert (await r.json())["usage"]["completion_tokens"] == 4


async def test_slow_pause_is_busy_silent_and_healthy(sim_app):
    sim = await sim_app(time_scale=100)
    async with aiohttp.ClientSession() as s:
        async with s.post(sim.base_url + "/sim/fault", json={"kind": "slow", "pause": 100}) as r:
            assert r.status == 200
        task = asyncio.create_task(s.post(sim.base_url + "/v1/completions", json={"model": MODEL, "prompt": "x\n", "max_tokens": 4}))
        await _poll(lambda: _is_paused(s, sim.base_url))
        st = await _state(s, sim.base_url)
        assert all(g["util_pct"] == 100 for g in st["gpus"])
        async with s.get(sim.base_url + "/health") as h:
            assert h.status == 200
        resp = await asyncio.wait_for(task, 20)
        assert (await resp.json())["usage"]["completion_tokens"] == 4
        assert not (await _state(s, sim.base_url))["fault"]["active"]


async def _is_paused(s, base):
    return (await _state(s, base))["activity"] == "pause"


async def test_unknown_fault_kind_names_the_known_ones(sim_app):
    sim = await sim_app()
    async with aiohttp.ClientSession() as s:
        async with s.post(sim.base_url + "/sim/fault", json={"kind": "meteor"}) as r:
            assert r.status == 400
            msg = (await r.json())["error"]["message"]
    assert "unknown kind 'meteor', known: pp_deadlock, all_idle_deadlock, crash, slow, metrics_stall" in msg


def test_crash_kills_engine_and_api_server_exits_nonzero(sim_process):
    import time

    sim = sim_process("--fault", "crash:at=20,exit_delay=10", time_scale=20)
    procs = sim.state()["processes"]
    # /health can answer before the engine core is spawned: record the tree as seen now
    sim.remember_tree()
    assert sim.popen.wait(timeout=30) == 1
    log = sim.log_text()
    assert "EngineDeadError" in log and "EngineCore encountered a fatal error." in log
    deadline = time.monotonic() + 10
    while sim.alive_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sim.alive_pids(), "the engine core and its workers die with the crash"
    assert procs["engine_core"] in sim._known


@pytest.mark.parametrize("kind, gpus", [("pp_deadlock", [100.0] * 7 + [0.0]), ("all_idle_deadlock", [0.0] * 8)])
async def test_a_deadlock_due_while_the_engine_idles_fires_with_the_next_step(sim_app, kind, gpus):
    """A deadlock happens in a forward pass: due before the load (or between an
    agent's turns), it fires when a request makes the engine step, not when due."""
    import time

    sim = await sim_app(time_scale=200, log_stats_interval=0, faults=[{"kind": kind, "at": "2s"}])
    base = sim.base_url
    async with aiohttp.ClientSession() as s:
        await asyncio.sleep(0.5)  # 100 simulated seconds: long past due, nothing to step
        st = await _state(s, base)
        assert not st["fault"]["fired"] and all(g["util_pct"] == 0 for g in st["gpus"])
        sent = time.time()
        with pytest.raises(asyncio.TimeoutError):  # the step the request starts never completes
            async with s.post(base + "/v1/completions", json={"model": MODEL, "prompt": "x\n", "max_tokens": 50},
                              timeout=aiohttp.ClientTimeout(total=1.0)) as r:
                await r.read()
        st = await _state(s, base)
        assert st["fault"]["fired"] and st["fault"]["onset_at"] >= sent
        assert [g["util_pct"] for g in st["gpus"]] == gpus
