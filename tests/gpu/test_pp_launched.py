"""`soak run` launching soak.rigs.pp_nccl (3 ranks over gloo on CPU): the whole
evidence path against a real torch.distributed pipeline.

The hang is caught from the frozen counter (no GPU source on CPU), the
responder asks every rank for a flight-recorder dump through the pipe files,
the reader names rank 2 as behind in pp_broadcast, and the tree is killed.
Skips without torch; about a minute on two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from ports import free_port as _free_port  # per-worker ports: tests/ports.py

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "tests" / "gpu" / "device" / "pp-gloo-launched.yaml"


@pytest.mark.timeout(300)
def test_soak_run_on_the_gloo_pipeline_collects_dumps_naming_the_rank_behind(torch_python, tmp_path):
    config = yaml.safe_load(CONFIG.read_text())
    port = _free_port()
    config["target"]["command"] = config["target"]["command"].replace("--port 8431", f"--port {port}")
    config["target"]["base_url"] = f"http://127.0.0.1:{port}"
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "run"
    bin_dir = str(Path(torch_python).parent)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([torch_python, "-m", "soak", "run", str(path), "--out", str(out)],
                          capture_output=True, text=True, timeout=280, env=env, cwd=REPO)
    assert proc.returncode == 1, proc.stderr[-2000:]
    run_summary = json.loads((out / "summary.json").read_text())
    assert len(run_summary["incidents"]) == 1, run_summary
    (incident,) = run_summary["incidents"]
    assert incident["kind"] == "hang", incident
    assert len(incident["killed_pids"]) == 4  # the front and its three ranks
    evidence = out / incident["evidence"]
    assert sorted(p.name for p in (evidence / "flight_recorder").iterdir()) == [
        "nccl_trace_rank_0", "nccl_trace_rank_1", "nccl_trace_rank_2"]
    summary = json.loads((evidence / "flight_recorder_summary.json").read_text())
    pp = next(g for g in summary["groups"] if g["desc"] == "pp_broadcast")
    assert pp["behind_ranks"] == [2], summary
    assert "rank 2 never enqueued" in pp["note"]
    import psutil

    assert not [pid for pid in incident["killed_pids"] if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
