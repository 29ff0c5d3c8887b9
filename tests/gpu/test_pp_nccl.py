"""soak.rigs.pp_nccl: a real torch.distributed pipeline that deadlocks like vLLM #53402.

On CPU over gloo wherever torch is installed (the protocol, the frozen counter,
the flight-recorder dumps through the pipe files naming the rank behind,
SIGTERM ignored); over NCCL with one process per GPU where two or more GPUs
exist (the NVML signature: ranks 0..n-2 busy, the last idle).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

import aiohttp
import pytest

from soak.respond.flight import flight_recorder_env, request_dumps

from .conftest import gpu_count, kill_tree


async def _wait_port(proc: subprocess.Popen, port_file: Path, *, tries: int = 600) -> int:
    for _ in range(tries):  # bounded: 120 s for torch to import and the group to form
        if port_file.exists() and port_file.read_text().strip():
            return int(port_file.read_text())
        assert proc.poll() is None, f"pp_nccl exited with {proc.returncode}"
        await asyncio.sleep(0.2)
    raise AssertionError("pp_nccl never wrote its port")


async def _counter(session, base: str, name: str = "vllm:generation_tokens_total") -> float:
    async with session.get(f"{base}/metrics") as response:
        text = await response.text()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))


def _children(pid: int) -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


async def _start(spawn, python: str, tmp_path: Path, backend: str, pp_size: int, **extra: str):
    dumps = tmp_path / "fr"
    dumps.mkdir()
    stem = str(dumps / "pipe_rank_")
    env = {**os.environ, **flight_recorder_env(dumps, stem),
           "PYTHONPATH": f"{Path(__file__).resolve().parents[2]}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    port_file = tmp_path / "port"
    argv = [python, "-m", "soak.rigs.pp_nccl", "--pp-size", str(pp_size), "--backend", backend, "--port", "0",
            "--port-file", str(port_file), "--min-step-ms", "5"]
    for key, value in extra.items():
        argv += [f"--{key.replace('_', '-')}", value]
    log = open(tmp_path / "server.log", "w")
    proc = spawn(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    port = await _wait_port(proc, port_file)
    return proc, f"http://127.0.0.1:{port}", dumps, stem


async def _stream_until_stall(session, base, tokens: list[str]):
    body = {"model": "pp-nccl", "prompt": "a b c d", "max_tokens": 100000, "stream": True}
    async with session.post(f"{base}/v1/completions", json=body) as response:
        assert response.status == 200
        async for line in response.content:
            if line.startswith(b"data: {"):
                tokens.append(json.loads(line[6:])["choices"][0]["text"])


async def _serves_then_hangs(session, base, proc, tokens, dumps, stem):
    async with session.post(f"{base}/v1/completions", json={"prompt": "x y", "max_tokens": 4}) as response:
        reply = await response.json()
    assert reply["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
    stream = asyncio.create_task(_stream_until_stall(session, base, tokens))
    for _ in range(200):
        if len(tokens) >= 5:
            break
        await asyncio.sleep(0.05)
    assert len(tokens) >= 5, "the stream never got going"
    async with session.post(f"{base}/sim/fault", json={"kind": "pp_deadlock"}) as response:
        assert response.status == 200
    # Frozen: the counter stops, the stream stalls, /health stays 200.
    frozen = None
    for _ in range(100):
        before = await _counter(session, base)
        await asyncio.sleep(0.5)
        if await _counter(session, base) == before:
            frozen = before
            break
    assert frozen is not None, "the generation counter never froze"
    seen = len(tokens)
    await asyncio.sleep(1.0)
    assert len(tokens) == seen and await _counter(session, base) == frozen
    async with session.get(f"{base}/health") as response:
        assert response.status == 200
    return stream


@pytest.mark.timeout(240)
async def test_gloo_pipeline_serves_then_deadlocks_with_the_last_rank_behind(torch_python, spawn, tmp_path):
    from soak.flightrec.dumps import summarize_dumps

    proc, base, dumps, stem = await _start(spawn, torch_python, tmp_path, "gloo", 3, hidden="64", layers="2")
    tokens: list[str] = []
    async with aiohttp.ClientSession() as session:
        stream = await _serves_then_hangs(session, base, proc, tokens, dumps, stem)
        written, notes = request_dumps(stem)
        assert len(written) == 3, notes
        summary = None
        for _ in range(100):
            summary = summarize_dumps(dumps)
            if len(summary.ranks) == 3:
                break
            await asyncio.sleep(0.1)
        pp = next(g for g in summary.groups if g.desc == "pp_broadcast")
        assert pp.behind_ranks == (2,)
        assert "rank 2 never enqueued" in pp.note
        # SIGTERM ends nothing while hung; SIGKILL to the tree ends everything.
        tree = [proc.pid, *_children(proc.pid)]
        assert len(tree) == 4
        for pid in tree:
            os.kill(pid, signal.SIGTERM)
        await asyncio.sleep(1.0)
        assert proc.poll() is None and all(_alive(pid) for pid in tree)
        stream.cancel()
    kill_tree(proc)
    for _ in range(50):  # orphans are reaped by whoever adopts them
        if not any(_alive(pid) for pid in tree):
            break
        await asyncio.sleep(0.1)
    assert not any(_alive(pid) for pid in tree)
    log = (tmp_path / "server.log").read_text()
    assert "skipping the sampled-token broadcast" in log


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.multigpu
@pytest.mark.timeout(300)
async def test_nccl_pipeline_deadlock_signature_on_nvml(gpu_python, spawn, tmp_path):
    if gpu_count() < 2:
        pytest.skip("needs two or more GPUs (one NCCL rank per GPU)")
    pynvml = pytest.importorskip("pynvml")
    pp_size = gpu_count()
    proc, base, dumps, stem = await _start(spawn, gpu_python, tmp_path, "nccl", pp_size)
    tokens: list[str] = []
    async with aiohttp.ClientSession() as session:
        stream = await _serves_then_hangs(session, base, proc, tokens, dumps, stem)
        pynvml.nvmlInit()
        try:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pp_size)]
            utils = None
            for _ in range(40):
                await asyncio.sleep(0.5)
                utils = [pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles]
                if all(u >= 90 for u in utils[:-1]) and utils[-1] <= 10:
                    break
            assert all(u >= 90 for u in utils[:-1]) and utils[-1] <= 10, utils
        finally:
            pynvml.nvmlShutdown()
        written, notes = request_dumps(stem)
        assert len(written) == pp_size, notes
        stream.cancel()
    kill_tree(proc)
