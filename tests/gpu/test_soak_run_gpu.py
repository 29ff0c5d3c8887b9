"""`soak run` on a real GPU: the simulator with CUDA workers, read through NVML per process.

The device run of docs/gpu.md as a test: healthy load, then the simulator's
pp_deadlock; pp_tail_stall must decide from NVML readings, the tree (CUDA
workers ignoring SIGTERM) must be SIGKILLed and NVML must list none of it
afterwards. Skips without torch, a GPU or NVML. About 90 s on an H200.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "tests" / "gpu" / "device" / "gpu-deadlock.yaml"


@pytest.mark.gpu
@pytest.mark.timeout(400)
def test_soak_run_catches_the_deadlock_on_nvml_and_frees_the_gpu(gpu_python, tmp_path):
    pynvml = pytest.importorskip("pynvml")
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([gpu_python, "-m", "soak", "run", str(CONFIG), "--out", str(out)],
                          capture_output=True, text=True, timeout=360, env=env, cwd=REPO)
    assert proc.returncode == 1, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"] == "fail"
    (incident,) = summary["incidents"]
    assert incident["rule"] == "pp_tail_stall" and incident["kind"] == "hang"
    assert incident["gpus_released"] is True
    assert incident["detected_at"] >= incident["onset_at"]
    # The decision came from per-stage NVML readings: upstream high, the last stage idle.
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    decision = next(e for e in events if e["type"] == "decision")
    utils = decision["evidence"]["signals"]["gpu_util_pct"]
    assert [utils[k] >= 90 for k in ("0", "1", "2")] == [True] * 3 and utils["3"] <= 10
    # Every process of the tree was killed and NVML lists none of them.
    killed = set(incident["killed_pids"])
    assert len(killed) == 6  # API server, engine core, 4 CUDA workers
    tree = json.loads((out / "incidents" / "1" / "processes.json").read_text())["processes"]
    titles = {p["pid"]: p["name"] for p in tree}
    assert {titles.get(pid) for pid in killed} >= {f"VLLM::Worker_PP{r}" for r in range(4)}
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        listed = {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    finally:
        pynvml.nvmlShutdown()
    assert not listed & killed
    # The healthy minute before the onset raised nothing.
    states = [e for e in events if e["type"] == "detector_state"]
    first_bad = next(e["ts"] for e in states if e["state"] != "healthy")
    assert first_bad >= incident["onset_at"] - 5.0
