"""Device run: the responder's flight-recorder path against real PyTorch NCCL.

    python3 tests/respond/device/fr_pipe.py --out $OUT/fr_pipe.json

Launches fr_rank.py with exactly ``flight_recorder_env(dump_dir, pipe_stem)``
merged into its environment (as the run loop does for a launched target), then
has the responder handle a hang: it writes a byte to ``<stem>0.pipe``, collects
the dump PyTorch writes, summarises it with soak.flightrec.dumps, and
SIGKILLs the rank (which ignores SIGTERM), waiting for NVML to show it gone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from soak.clock import SystemClock
from soak.records import Decision, IncidentKind
from soak.probes.gpu import NvmlGpuSource
from soak.respond.config import ResponseConfig
from soak.respond.flight import default_flight_recorder_paths, flight_recorder_env
from soak.respond.responder import Responder


@dataclass
class Target:
    base_url: str
    root_pid: int | None
    log_path: Path | None
    flight_recorder_pipe_stem: str | None
    identity: None = None  # not checked at start: the responder takes root_pid as given


async def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="fr_pipe_"))
    paths = default_flight_recorder_paths(run_dir)
    dump_dir = Path(paths.dump_prefix).parent
    dump_dir.mkdir(parents=True)
    env = {**os.environ, **flight_recorder_env(dump_dir, paths.pipe_stem)}
    log_path = run_dir / "server.log"
    with open(log_path, "w") as log:
        rank = subprocess.Popen([sys.executable, str(Path(__file__).with_name("fr_rank.py")), "120"],
                                env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    assert rank.stdout is not None
    ready = rank.stdout.readline().strip()
    nvml = NvmlGpuSource(clock=SystemClock())
    await nvml.open()
    config = ResponseConfig.model_validate({"gpu_release_timeout": 30.0, "gpu_poll_interval": 0.05,
                                            "evidence": {"flight_recorder_wait": 20.0, "budget": 30.0}})
    responder = Responder(config, run_dir=run_dir, gpu_source=nvml, clock=SystemClock(), recent_samples=list,
                          target=Target("http://127.0.0.1:9", rank.pid, log_path, paths.pipe_stem),
                          flight_recorder_paths=paths)
    await responder.start()
    now = time.time()
    record = await responder.handle(Decision("pp_tail_stall", IncidentKind.HANG, now - 5, now, ("device",), {}), 1)
    await responder.aclose()
    rank.wait(timeout=10)
    bundle = run_dir / "incidents" / "1"
    incident = json.loads((bundle / "incident.json").read_text())
    summary_path = bundle / "flight_recorder_summary.json"
    result = {
        "rank_ready": ready,
        "env": flight_recorder_env(dump_dir, paths.pipe_stem),
        "flight_recorder_step": incident["steps"].get("flight_recorder"),
        "dumps": sorted(p.name for p in (bundle / "flight_recorder").iterdir()) if (bundle / "flight_recorder").exists() else [],
        "summary": json.loads(summary_path.read_text()) if summary_path.exists() else None,
        "killed": list(record.killed_pids),
        "rank_returncode": rank.returncode,
        "gpus_released": record.gpus_released,
        "gpu_free_s": record.gpu_free_s,
        "py_spy": incident["steps"].get("py_spy"),
        "notes": list(record.notes),
    }
    await nvml.aclose()
    text = json.dumps(result, indent=1)
    print(text)
    args.out.write_text(text)
    ok = result["dumps"] == ["nccl_trace_rank_0"] and result["summary"] and record.gpus_released
    return 0 if ok and rank.pid in record.killed_pids else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
