"""Device run: the responder against real CUDA processes and real NVML.

    python3 tests/respond/device/gpu_kill.py --trials 5 --out $OUT/gpu_kill.json

Each trial starts ``soak sim --worker-backend cuda`` (every pipeline worker a
real CUDA process holding GPU memory; one in its own session), injects
``pp_deadlock`` (ranks spin, the last holds; all ignore SIGTERM), and lets the
responder, reading the GPUs through ``soak.probes.gpu.NvmlGpuSource``, collect
evidence, SIGKILL the tree and wait for the GPUs to be free. A foreign CUDA
process (not in the tree) holds memory on the same GPU throughout and must
survive. Prints one JSON line per trial and a summary with median and max of
gpu_free_s (SIGKILL to NVML showing the GPU free) and of the whole response.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

from soak.clock import SystemClock
from soak.records import Decision, IncidentKind
from soak.probes.gpu import NvmlGpuSource
from soak.respond.config import ResponseConfig
from soak.respond.responder import Responder

FOREIGN = (
    "import torch, signal, time, sys\n"
    "x = torch.empty(1024 * 2**20, dtype=torch.uint8, device='cuda')\n"
    "print('ready', flush=True)\n"
    "time.sleep(float(sys.argv[1]))\n"
)


@dataclass
class Target:
    base_url: str
    root_pid: int | None
    log_path: Path | None
    flight_recorder_pipe_stem: str | None = None
    identity: None = None  # not checked at start: the responder takes root_pid as given


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def post_json(url: str, body: dict) -> None:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=5).read()


def wait(pred, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


async def trial(n: int, work: Path, nvml: NvmlGpuSource, pp: int, foreign_pid: int) -> dict:
    port_file = work / f"port{n}"
    log_path = work / f"sim{n}.log"
    with open(log_path, "wb") as log:
        sim = subprocess.Popen(
            [sys.executable, "-m", "soak", "sim", "--port", "0", "--port-file", str(port_file), "--time-scale", "20",
             "--worker-backend", "cuda", "--pipeline-parallel-size", str(pp), "--worker-own-session", "1"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    wait(port_file.exists, 120, "the port file")
    base = f"http://127.0.0.1:{int(port_file.read_text())}"
    wait(lambda: urllib.request.urlopen(base + "/health", timeout=2).status == 200, 180, "/health")
    state = get_json(base + "/sim/state")
    workers = state["processes"]["workers"]
    tree = {sim.pid, state["processes"]["engine_core"], *workers}

    async def on_gpu() -> set[int]:
        s = await nvml.read()
        return {p for g in s.gpus for p in g.pids}

    deadline = time.monotonic() + 180
    while not set(workers) <= await on_gpu():
        if time.monotonic() > deadline:
            raise SystemExit("workers never showed on NVML")
        await asyncio.sleep(0.2)
    before = await nvml.read()
    post_json(base + "/sim/fault", {"kind": "pp_deadlock"})
    wait(lambda: get_json(base + "/sim/state")["fault"]["active"], 30, "the deadlock")
    onset = get_json(base + "/sim/state")["fault"]["onset_at"]
    await asyncio.sleep(1.0)  # let the ranks spin
    config = ResponseConfig.model_validate({"gpu_release_timeout": 50.0, "gpu_poll_interval": 0.05,
                                            "evidence": {"flight_recorder_wait": 0.5, "py_spy_timeout": 10.0}})
    run_dir = work / f"run{n}"
    responder = Responder(config, run_dir=run_dir, target=Target(base, sim.pid, log_path), gpu_source=nvml,
                          clock=SystemClock(), recent_samples=lambda: [before])
    await responder.start()
    t0 = time.time()
    decision = Decision("pp_tail_stall", IncidentKind.HANG, onset, t0, ("device trial",), {})
    record = await responder.handle(decision, 1)
    t1 = time.time()
    await responder.aclose()
    sim.wait(timeout=10)
    after = await nvml.read()
    left = {p for g in after.gpus for p in g.pids}
    steps = json.loads((run_dir / "incidents" / "1" / "incident.json").read_text())["steps"]
    return {
        "trial": n,
        "tree": sorted(tree),
        "killed": list(record.killed_pids),
        "tree_alive_after": sorted(p for p in tree if psutil.pid_exists(p)
                                   and psutil.Process(p).status() != psutil.STATUS_ZOMBIE),
        "gpus_released": record.gpus_released,
        "gpu_free_s": record.gpu_free_s,
        "response_s": round(t1 - t0, 3),
        "evidence_steps_s": {k: v.get("elapsed_s") for k, v in steps.items()},
        "py_spy": steps.get("py_spy"),
        "mem_before_mib": [g.mem_used_mib for g in before.gpus],
        "mem_after_mib": [g.mem_used_mib for g in after.gpus],
        "nvml_pids_after": sorted(left),
        "foreign_alive": psutil.pid_exists(foreign_pid),
        "foreign_on_gpu_after": foreign_pid in left,
        "notes": list(record.notes),
    }


async def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--pp", type=int, default=4)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpu_kill_"))
    nvml = NvmlGpuSource(clock=SystemClock())
    await nvml.open()
    idle = await nvml.read()
    print(json.dumps({"idle_mem_mib": [g.mem_used_mib for g in idle.gpus], "idle_pids": [g.pids for g in idle.gpus]}))
    foreign = subprocess.Popen([sys.executable, "-c", FOREIGN, "3000"], stdout=subprocess.PIPE, text=True)
    assert foreign.stdout is not None and foreign.stdout.readline().strip() == "ready"
    results = []
    try:
        for n in range(args.trials):
            r = await trial(n, work, nvml, args.pp, foreign.pid)
            print(json.dumps(r), flush=True)
            results.append(r)
    finally:
        foreign.kill()
        foreign.wait()
        await nvml.aclose()
    free = [r["gpu_free_s"] for r in results if r["gpu_free_s"] is not None]
    resp = [r["response_s"] for r in results]
    summary = {
        "trials": len(results),
        "all_tree_pids_gone": all(not r["tree_alive_after"] for r in results),
        "all_released": all(r["gpus_released"] for r in results),
        "foreign_survived": all(r["foreign_alive"] for r in results),
        "gpu_free_s_median": statistics.median(free) if free else None,
        "gpu_free_s_max": max(free) if free else None,
        "response_s_median": statistics.median(resp) if resp else None,
        "response_s_max": max(resp) if resp else None,
    }
    print(json.dumps(summary))
    args.out.write_text(json.dumps({"summary": summary, "trials": results}, indent=1))
    return 0 if summary["all_tree_pids_gone"] and summary["all_released"] and summary["foreign_survived"] else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
