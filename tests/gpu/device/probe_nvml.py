"""Device script: what NVML reports for soak.rigs.cuda_worker processes sharing one GPU.

Run on the GPU machine: ``python3 tests/gpu/device/probe_nvml.py OUT.json``.
Three workers (ranks 0..2 of a 3-stage pipeline) go through healthy (busy
0.8), mixed (spin / busy 0.5 / hold) and deadlocked (spin / spin / hold)
phases; each phase records the device reading, NVML's 200 ms samples, the
per-process utilization entries and the per-stage readings of
soak.probes.process_source. Then SIGTERM (ignored), SIGKILL, and the time until
NVML lists no process and the memory is back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pynvml

from soak.clock import SystemClock
from soak.probes.process_source import NvmlProcessGpuSource

STAGES = 3


def start_workers():
    procs = []
    for rank in range(STAGES):
        p = subprocess.Popen(
            [sys.executable, "-m", "soak.rigs.cuda_worker", "--rank", str(rank), "--pp-size", str(STAGES),
             "--gpu-index", str(rank), "--mem-mib", "2048"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
        )
        procs.append(p)
    ready = [json.loads(p.stdout.readline()) for p in procs]
    return procs, ready


def send(p, **cmd):
    p.stdin.write(json.dumps(cmd) + "\n")
    p.stdin.flush()
    return json.loads(p.stdout.readline())


def raw_phase(handle, source, seconds):
    out = {"device_util": [], "samples": [], "proc_util": [], "stage_readings": [], "proc_info": None}
    last_ts = int(time.time() * 1e6)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(1.0)
        out["device_util"].append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        try:
            _, s = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last_ts)
            out["samples"].append([(int(x.timeStamp), int(x.sampleValue.uiVal)) for x in s][-8:])
        except pynvml.NVMLError as exc:
            out["samples"].append(str(exc))
        try:
            entries = pynvml.nvmlDeviceGetProcessUtilization(handle, last_ts)
            out["proc_util"].append([(int(e.pid), int(e.timeStamp), int(e.smUtil), int(e.memUtil)) for e in entries])
        except pynvml.NVMLError as exc:
            out["proc_util"].append(str(exc))
        last_ts = int(time.time() * 1e6) - 1_000_000
        readings = source.read_blocking()
        out["stage_readings"].append([(r.index, r.util_pct, r.mem_used_mib, list(r.pids)) for r in readings])
    try:
        info = pynvml.nvmlDeviceGetProcessesUtilizationInfo(handle, 0)
        out["proc_info"] = str(info)[:2000]
    except Exception as exc:  # newer call; may be absent
        out["proc_info"] = f"{type(exc).__name__}: {exc}"
    return out


def main():
    result = {}
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    result["driver"] = str(pynvml.nvmlSystemGetDriverVersion())
    result["name"] = str(pynvml.nvmlDeviceGetName(handle))
    mem0 = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
    result["mem_used_mib_before"] = mem0
    source = NvmlProcessGpuSource(stages=STAGES, clock=SystemClock())
    t0 = time.monotonic()
    procs, ready = start_workers()
    result["ready"] = ready
    result["start_s"] = time.monotonic() - t0
    result["cmdlines"] = {p.pid: open(f"/proc/{p.pid}/cmdline").read().replace("\0", " ") for p in procs}
    result["nvml_pids"] = [int(x.pid) for x in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    phases = {
        "healthy": [dict(state="busy", util=0.8)] * STAGES,
        "half": [dict(state="busy", util=0.5)] * STAGES,
        "mixed": [dict(state="spin"), dict(state="busy", util=0.5), dict(state="hold")],
        "deadlock": [dict(state="spin", ignore_sigterm=True), dict(state="spin", ignore_sigterm=True),
                     dict(state="hold", ignore_sigterm=True)],
    }
    for name, cmds in phases.items():
        for p, c in zip(procs, cmds):
            send(p, **c)
        time.sleep(0.5)
        result[name] = raw_phase(handle, source, 4.0)
        print(name, result[name]["device_util"], result[name]["stage_readings"][-1], flush=True)
    for p in procs:
        os.kill(p.pid, signal.SIGTERM)
    time.sleep(1.0)
    result["alive_after_sigterm"] = [p.poll() is None for p in procs]
    t_kill = time.monotonic()
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()
    t_dead = time.monotonic()
    free_at = None
    while time.monotonic() - t_kill < 30:
        listed = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        used = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
        if not listed and used <= mem0 + 512:
            free_at = time.monotonic()
            break
        time.sleep(0.01)
    result["reaped_s"] = t_dead - t_kill
    result["gpu_free_s"] = None if free_at is None else free_at - t_kill
    result["mem_used_mib_after"] = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
    print("sigterm alive", result["alive_after_sigterm"], "free_s", result["gpu_free_s"], flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
