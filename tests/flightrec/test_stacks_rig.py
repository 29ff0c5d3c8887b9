"""The whole path on real processes: a two-stage gloo pipeline (gloo_stall.py) stalls,
the responder collects py-spy stacks and /proc states, writes diagnosis.json, and
the incident's summary, its diagnosis and `soak diagnose` name the faulty rank with
its stage and PID; the flight recorder's "no dump" is said, not left out.

Needs torch: ``$SOAK_TORCH_PYTHON``, else the real-vLLM tier's venv, else skipped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from ports import free_port
from soak.clock import SystemClock
from soak.records import Decision, IncidentKind
from soak.respond.config import ResponseConfig
from soak.respond.responder import Responder

REPO = Path(__file__).resolve().parents[2]
RIG = Path(__file__).with_name("gloo_stall.py")
REAL_VENV = Path(os.environ.get("REAL_VLLM_HOME", Path.home() / ".cache" / "soak" / "real-vllm")) / "venv" / "bin" / "python"


def _torch_python() -> str | None:
    for python in (os.environ.get("SOAK_TORCH_PYTHON"), str(REAL_VENV)):
        if python and os.access(python, os.X_OK):
            probe = subprocess.run([python, "-c", "import torch.distributed"], capture_output=True, timeout=300)
            if probe.returncode == 0:
                return python
    return None


@pytest.fixture(scope="module")
def torch_python() -> str:
    python = _torch_python()
    if python is None:
        pytest.skip("no torch: set SOAK_TORCH_PYTHON or run scripts/real-vllm setup")
    return python


@pytest.fixture
def stalled(torch_python, tmp_path):
    started: list[subprocess.Popen] = []

    def start(mode: str) -> tuple[subprocess.Popen, dict[int, int]]:
        state = tmp_path / f"rig-{mode}"
        state.mkdir()
        proc = subprocess.Popen([torch_python, str(RIG), "--mode", mode, "--port", str(free_port()),
                                 "--state", str(state), "--lifetime", "240"],
                                stdin=subprocess.DEVNULL, start_new_session=True)
        started.append(proc)
        deadline = time.monotonic() + 240
        while not all((state / f"rank{r}.stuck").exists() for r in (0, 1)):
            assert proc.poll() is None, "the rig exited before it stalled"
            assert time.monotonic() < deadline, "the rig did not stall in time"
            time.sleep(0.2)
        time.sleep(1.0)  # stage 1 is in its recv a moment after it wrote .stuck
        return proc, {r: int((state / f"rank{r}.pid").read_text()) for r in (0, 1)}

    yield start
    for proc in started:  # our own tree, by its process group
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


async def _respond(tmp_path: Path, root: int) -> tuple:
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    config = ResponseConfig.model_validate({
        "kill_timeout": 10.0, "gpu_release_timeout": 1.0, "tree_snapshot_interval": 0.2,
        "evidence": {"py_spy": True, "py_spy_timeout": 30.0, "flight_recorder": True,
                     "flight_recorder_wait": 1.0, "budget": 60.0, "metrics_timeout": 0.5},
    })
    responder = Responder(config, run_dir=run_dir, gpu_source=None, clock=SystemClock(), recent_samples=lambda: [],
                          # what the responder reads of a target (soak.respond.target_tree.TargetLike)
                          target=SimpleNamespace(base_url=f"http://127.0.0.1:{free_port()}", root_pid=root,
                                                 log_path=None, identity=None,
                                                 flight_recorder_pipe_stem=str(run_dir / "nccl" / "pipe_rank_")))
    now = time.time()
    decision = Decision(rule="stage_stall", kind=IncidentKind.HANG, onset_at=now - 5, decided_at=now,
                        reasons=("stage 1 idle",), evidence={})
    record = await responder.handle(decision, 1)
    await responder.aclose()
    return record, run_dir / "incidents" / "1"


def _diagnose_cli(incident: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "soak", "diagnose", str(incident)], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)


@pytest.mark.slow
async def test_a_skipped_send_names_the_stage_that_never_sent(stalled, tmp_path):
    proc, pids = stalled("skip")
    record, incident = await _respond(tmp_path, proc.pid)

    found = json.loads((incident / "diagnosis.json").read_text())
    assert found["source"] == "py-spy" and found["reason"] == "missing_send"
    assert found["faulty"] == {"rank": 0, "stage": 0, "pid": pids[0]}
    assert found["group"] == "pp"
    assert found["blocked"]["pid"] == pids[1] and found["blocked"]["call"] == "recv"
    assert found["flight_recorder"].startswith("no dump")
    expected = f"pp group: rank 0 (stage 0, PID {pids[0]}) is behind"
    assert record.diagnosis.startswith(expected)
    assert f"py-spy: {expected}" in record.summary and "flight recorder: no dump" in record.summary
    states = json.loads((incident / "process_states.json").read_text())["pids"]
    assert states[str(pids[1])]["state"] == "S"  # blocked in gloo's recv, asleep
    assert not psutil.pid_exists(pids[0]) or psutil.Process(pids[0]).status() == psutil.STATUS_ZOMBIE

    shown = _diagnose_cli(incident)
    assert shown.returncode == 1, shown.stderr
    assert shown.stdout.splitlines()[0].startswith("flight recorder: no dump")
    assert expected in shown.stdout and "<- behind" in shown.stdout


@pytest.mark.slow
async def test_a_spinning_stage_and_a_stopped_stage_are_named(stalled, tmp_path):
    proc, pids = stalled("spin")
    record, incident = await _respond(tmp_path / "spin", proc.pid)
    found = json.loads((incident / "diagnosis.json").read_text())
    assert found["reason"] == "spinning" and found["faulty"]["pid"] == pids[0], found["line"]
    assert record.diagnosis.startswith(f"pp group: rank 0 (stage 0, PID {pids[0]}) is behind: running")

    proc, pids = stalled("stop")
    os.kill(pids[0], signal.SIGSTOP)
    record, incident = await _respond(tmp_path / "stop", proc.pid)
    found = json.loads((incident / "diagnosis.json").read_text())
    assert found["reason"] == "stopped" and found["faulty"]["pid"] == pids[0], found["line"]
    assert "stopped (state T)" in record.diagnosis
