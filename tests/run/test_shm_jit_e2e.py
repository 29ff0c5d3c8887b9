"""Server-native signals end to end, through ``soak run`` as a real subprocess and the
simulator's real process tree: the harness sets VLLM_RINGBUFFER_WARNING_INTERVAL (5 s
by default) in the simulator's environment, the simulator's pp_deadlock logs the
shm-broadcast line at that interval, and the log rule decides the hang from it. The
deadlock begins with vLLM's jit_monitor line, which becomes a timeline event, a note
of the report and a clause of the incident's summary."""

from __future__ import annotations

import json
import subprocess

import pytest

from soakrun_helpers import events, small_config, soak_cmd, write_config

pytestmark = pytest.mark.timeout(240)
KERNEL = "_topk_topp_kernel"


def deadlock_run(tmp_path, **target):
    config = small_config(duration="90s")
    config["target"] = {"kind": "simulator", **target,
                        "sim": {"time_scale": 5, "pp_size": 4, "faults": [
                            # the watchdog and RPC-timeout lines far out: the shm line must decide
                            {"kind": "pp_deadlock", "after_requests": 24, "jit_kernel": KERNEL,
                             "watchdog_timeout": "3000s", "execute_timeout": "6000s"}]}}
    config["workload"]["tokenizer"] = {"kind": "estimate"}
    # No GPU rule: the simulated GPUs would give the stall away first.
    config["probes"] = {"gpu": {"kind": "none"}}
    config["response"] = {"on_hang": "stop", "evidence": {"py_spy": False, "flight_recorder_wait": "0.5s"}}
    run_dir = tmp_path / "run"
    done = subprocess.run(soak_cmd("run", str(write_config(tmp_path / "shm.yaml", config)), "--out", str(run_dir)),
                          capture_output=True, text=True, timeout=200)
    assert done.returncode == 1, done.stderr[-3000:]
    return run_dir


def test_the_shm_broadcast_line_decides_and_the_jit_compile_is_its_precursor(tmp_path):
    run_dir = deadlock_run(tmp_path)
    log = (run_dir / "server.log").read_text()
    # The simulator read the harness's default from its environment (its own is 60 s).
    assert "No available shared memory broadcast block found in 5 seconds" in log
    assert "in 60 seconds" not in log

    summary = json.loads((run_dir / "summary.json").read_text())
    (incident,) = summary["incidents"]
    assert incident["kind"] == "hang" and incident["rule"] == "log_signature"
    record = json.loads((run_dir / incident["evidence"] / "incident.json").read_text())["record"]
    reasons = " ".join(record["reasons"])
    assert "shm-broadcast wait logged 2 times" in reasons and "VLLM_RINGBUFFER_WARNING_INTERVAL" in reasons
    # Two 5-simulated-second waits at time scale 5 (the server is warm by request 25): about 2 s of wall time, long before
    # generation_frozen's 15 s floor.
    assert incident["detected_at"] - incident["onset_at"] < 10
    assert "JIT compile during inference" in incident["summary"] and KERNEL in incident["summary"]

    jit = [e for e in events(run_dir) if e["type"] == "jit_compile"]
    assert len(jit) == 1 and jit[0]["kernel"] == KERNEL and jit[0]["worker"] == "Worker_PP3"
    assert jit[0]["ts"] <= incident["detected_at"]

    page = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "JIT compile during inference: 1 line from vLLM&#x27;s jit_monitor" in page or \
        "JIT compile during inference: 1 line from vLLM's jit_monitor" in page
    assert KERNEL in page and "shm-broadcast wait logged" in page

    # Pure and replayable: the run's recorded samples decide the same rule again.
    from soak.config import load_run_config
    from soak.detect import Detector
    from soak.detect.replay import replay
    from soak.records import Topology
    from soak.store.rundir import read_samples

    detector = Detector(load_run_config(run_dir / "config.yaml").detector, topology=Topology.pipeline(4))
    replayed = replay(read_samples(run_dir / "samples.jsonl"), detector)
    assert [d.rule for d in replayed.decisions][:1] == ["log_signature"]
    assert "shm-broadcast wait logged" in replayed.decisions[0].reasons[0]


def test_an_explicit_interval_in_the_target_reaches_the_simulator(tmp_path):
    run_dir = deadlock_run(tmp_path, ringbuffer_warning_interval="3s")
    log = (run_dir / "server.log").read_text()
    assert "broadcast block found in 3 seconds" in log and "in 5 seconds" not in log
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["incidents"][0]["rule"] == "log_signature"
