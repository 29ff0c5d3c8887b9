"""How many concurrent streams and streamed tokens/s the simulator sustains on one core.

Starts ``soak sim`` (time scale 1, pinned to one CPU where the OS allows) and
drives it from this process with N concurrent streaming chat requests for a
fixed time, counting the tokens that arrive. The client stays cheap (no JSON
parsing: each simulated output token is one space-led word, so a chunk's token
count is its number of spaces). Prints the figures and the simulator's CPU use;
the target is >= 64 streams and >= 20,000 tokens/s.

    .venv/bin/python bench/sim_throughput.py [--streams 128] [--duration 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil

SIM_FLAGS = [
    # a big batch and cheap steps: what is measured is the simulator's own cost
    "--max-num-seqs", "256", "--max-num-batched-tokens", "8192", "--num-speculative-tokens", "7",
    "--spec-acceptance", "0.9", "--stage-time", "0.0015", "--stage-time-per-token", "0",
    "--log-stats-interval", "0", "--no-processes", "--kv-cache-blocks", "400000",
]


async def _stream_loop(session, url, body, deadline, counts):
    while time.monotonic() < deadline:
        async with session.post(url, json=body) as r:
            counts["open"] += 1
            async for line in r.content:
                if line.startswith(b"data: {"):
                    counts["chunks"] += 1
                    counts["tokens"] += line.count(b" ") - 1  # "data: " has one
                if time.monotonic() >= deadline:
                    break
            counts["open"] -= 1
        counts["requests"] += 1


async def _drive(base, streams, duration, max_tokens):
    body = {"model": "deepseek-v4-flash", "messages": [{"role": "user", "content": "stream please"}],
            "max_tokens": max_tokens, "stream": True}
    counts = {"tokens": 0, "chunks": 0, "requests": 0, "open": 0}
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=duration + 30)) as s:
        warm_deadline = time.monotonic() + 1.0
        await asyncio.gather(*(_stream_loop(s, base + "/v1/chat/completions", body, warm_deadline, dict(counts)) for _ in range(4)))
        ramp = 1.0  # let every stream open before measuring
        start = time.monotonic()
        deadline = start + ramp + duration
        loops = asyncio.gather(*(_stream_loop(s, base + "/v1/chat/completions", body, deadline, counts) for _ in range(streams)))
        await asyncio.sleep(ramp)
        t0, tokens0, chunks0 = time.monotonic(), counts["tokens"], counts["chunks"]
        sampler = asyncio.create_task(_sample_open(counts, deadline))
        low_open = await sampler
        t1, tokens1, chunks1 = time.monotonic(), counts["tokens"], counts["chunks"]
        await loops
    measured = {"tokens": tokens1 - tokens0, "chunks": chunks1 - chunks0, "requests": counts["requests"]}
    return measured, t1 - t0, low_open


async def _sample_open(counts, deadline):
    low = counts["open"]
    while time.monotonic() < deadline - 0.3:
        await asyncio.sleep(0.25)
        low = min(low, counts["open"])
    return low


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=128)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--max-tokens", type=int, default=300_000, help="long enough that every stream stays open the whole time")
    ap.add_argument("--cpu", type=int, default=0, help="CPU to pin the simulator to")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        cmd = [sys.executable, "-m", "soak", "sim", "--port", "0", "--port-file", str(port_file), "--time-scale", "1", *SIM_FLAGS]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            try:
                os.sched_setaffinity(proc.pid, {a.cpu})
                pinned = f"pinned to CPU {a.cpu}"
            except (AttributeError, OSError):
                pinned = "not pinned"
            deadline = time.monotonic() + 30
            while not port_file.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    print("soak sim did not start", file=sys.stderr)
                    return 1
                time.sleep(0.05)
            base = f"http://127.0.0.1:{int(port_file.read_text())}"
            ps = psutil.Process(proc.pid)
            cpu0 = ps.cpu_times()
            counts, elapsed, low_open = asyncio.run(_drive(base, a.streams, a.duration, a.max_tokens))
            cpu1 = ps.cpu_times()
        finally:
            proc.kill()
            proc.wait()
    sim_cpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / elapsed
    tps = counts["tokens"] / elapsed
    print(f"sim_throughput: streams={a.streams} (fewest open at once: {low_open}) duration={elapsed:.1f}s simulator {pinned}")
    print(f"sim_throughput: streamed tokens/s={tps:,.0f} chunks/s={counts['chunks'] / elapsed:,.0f} "
          f"tokens/chunk={counts['tokens'] / max(1, counts['chunks']):.2f} requests={counts['requests']}")
    print(f"sim_throughput: simulator CPU={sim_cpu:.2f} cores; tokens/s per simulator core={tps / max(sim_cpu, 1e-9):,.0f}")
    ok = a.streams >= 64 and (low_open or 0) >= 64 and tps >= 20_000
    print(f"sim_throughput: target >=64 streams and >=20,000 tokens/s: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
