"""Acceptance, end to end through ``soak run`` as a real subprocess, against the
simulator's real process tree (API server -> engine core -> one worker a stage).

- launched: pp_deadlock gives a pp_tail_stall incident with the CONTRACTS.md
  fields and the evidence files; every server PID is gone (they all ignore
  SIGTERM once hung; one worker runs in its own session); a decoy titled like a
  worker survives; exit 1.
- attached: the same tree, started outside the harness, given by URL and PID.
- on_hang: restart: two deadlocks (injected through POST /sim/fault), two
  incidents, two restarts, the full duration.

The simulator runs 20x faster than the wall clock; the fault's own log lines
(NCCL watchdog, shm broadcast) are pushed past the test so the GPU pattern is
what decides, within the short detector window set here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from respond_helpers import SoakRunWatcher, is_alive

TIME_SCALE = 20.0
CONTRACT_FIELDS = ("kind", "rule", "onset_at", "detected_at", "killed_pids", "gpus_released", "evidence")


# Watchdog and shm lines far beyond the test: the GPUs must give the hang away.
DEADLOCK = {"kind": "pp_deadlock", "watchdog_timeout": "3000s", "ringbuffer_warning_interval": "3000s",
            "execute_timeout": "6000s"}


def run_config(tmp_path: Path, *, duration: str, target: dict[str, Any], response: dict[str, Any] | None = None,
               probes: dict[str, Any] | None = None) -> Path:
    config = {
        "name": "respond-e2e",
        "duration": duration,
        "target": target,
        "workload": {
            "kind": "synthetic_agentic",
            "min_context_tokens": 2000,
            "max_context_tokens": 5000,
            "start_context_tokens": {"dist": "uniform", "low": 2000, "high": 2400},
            "shared_prefix_tokens": 1000,
            "tool_result_tokens": {"dist": "uniform", "low": 200, "high": 400},
            "output_tokens": 12,
            "think_time_s": 0.02,
            "context_chunks": 16,
            "context_chunk_tokens": 1000,
        },
        "load": {"concurrency": 3, "drain": "3s"},
        "detector": {"pp_tail_stall": {"window": "1s", "progress_grace": "1s"}},
        "response": {"evidence": {"flight_recorder_wait": "1s", "py_spy_timeout": "5s"},
                     "tree_snapshot_interval": "0.5s", **(response or {})},
        "probes": probes or {},
        "exporter": {"enabled": False},
        "view": {"mode": "plain", "plain_interval": "1s"},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def sim_target(**sim: Any) -> dict[str, Any]:
    return {"kind": "simulator", "sim": {"time_scale": TIME_SCALE, "pp_size": 4, "worker_own_session": 1, **sim}}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_incident(run_dir: Path, incident: dict[str, Any], number: int) -> None:
    for key in CONTRACT_FIELDS:
        assert key in incident, key
    assert incident["kind"] == "hang" and incident["rule"] == "pp_tail_stall"
    assert incident["onset_at"] <= incident["detected_at"]
    # The simulator's GPUs die with the simulated server: its GPU source cannot
    # confirm the release, and "every PID I killed is gone" is never taken for it.
    assert incident["gpus_released"] is None
    assert incident["evidence"] == f"incidents/{number}"
    bundle = run_dir / incident["evidence"]
    for name in ("incident.json", "samples.jsonl", "gpus.json", "processes.json", "metrics.txt",
                 "log_tail.txt", "watchdog.json"):
        assert (bundle / name).is_file(), name
    record = json.loads((bundle / "incident.json").read_text())
    assert record["status"] == "done" and record["decision"]["rule"] == "pp_tail_stall"
    assert record["decision"]["reasons"], "a decision carries its reasons"
    kinds = {s["kind"] for s in read_jsonl(bundle / "samples.jsonl")}
    assert {"gpu", "server", "client"} <= kinds
    gpus = json.loads((bundle / "gpus.json").read_text())["gpus"]
    utils = [g["util_pct"] for g in sorted(gpus, key=lambda g: g["index"])]
    assert utils[-1] <= 10.0 and min(utils[:-1]) >= 90.0, utils  # the tail stall itself
    assert "vllm:" in (bundle / "metrics.txt").read_text()
    py_spy = record["steps"]["py_spy"]
    if "not installed" not in (py_spy.get("note") or ""):
        assert list(bundle.glob("py-spy-*.txt")), "py-spy was there: a dump per server process"
    for pid in incident["killed_pids"]:
        assert not is_alive(pid), pid


def inject_deadlocks(run_dir: Path, after: list[tuple[str, int]], *, ok_requests: int = 2,
                     timeout_s: float = 90.0):
    """In a thread: POST a pp_deadlock to the simulator once ``ok_requests``
    requests have finished well after each (event type, occurrence) of
    events.jsonl, so the test, not the clock, decides how many deadlocks a run
    meets, and each one lands on a server that is serving load (not a fixed
    delay, which a loaded machine can outrun)."""
    import threading
    import time
    import urllib.request

    injected: list[float] = []

    def load_flowing_since(ts: float) -> bool:
        try:
            records = read_jsonl(run_dir / "requests.jsonl")
        except (OSError, ValueError):
            return False
        return sum(r["outcome"] == "ok" and r["ended_at"] > ts for r in records) >= ok_requests

    def run() -> None:
        deadline = time.monotonic() + timeout_s
        for event_type, nth in after:
            while time.monotonic() < deadline:
                try:
                    events = read_jsonl(run_dir / "events.jsonl")
                except (OSError, ValueError):
                    events = []
                matches = [e for e in events if e["type"] == event_type]
                ready = [e for e in events if e["type"] == "target_ready"]
                if len(matches) >= nth and ready and load_flowing_since(matches[nth - 1]["ts"]):
                    break
                time.sleep(0.05)
            else:
                return
            body = json.dumps(DEADLOCK).encode()
            req = urllib.request.Request(ready[0]["base_url"] + "/sim/fault", data=body,
                                         headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=5).read()
                injected.append(time.time())
            except OSError:
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return injected


async def test_launched_pp_deadlock_is_a_pp_tail_stall_and_the_whole_tree_dies(tmp_path, reaper, start_decoy):
    decoy = start_decoy("VLLM::Worker_PP1")
    run_dir = tmp_path / "run"
    config = run_config(tmp_path, duration="40s", target=sim_target())
    watcher = SoakRunWatcher(reaper, config, run_dir)
    injected = inject_deadlocks(run_dir, [("load_started", 1)])
    seen = watcher.wait(timeout_s=90)
    assert len(injected) == 1

    assert seen.returncode == 1, seen.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "fail" and len(summary["incidents"]) == 1
    incident = summary["incidents"][0]
    check_incident(run_dir, incident, 1)
    # The tree the watcher saw: API server, engine core, 4 workers, one in its own session.
    assert len(seen.pids) >= 6, seen.pids
    root = seen.roots[0]
    assert any(sid != seen.sessions[root] for pid, sid in seen.sessions.items()), "a worker in its own session"
    assert seen.hung_ignoring_sigterm, "the tree was hung and ignoring SIGTERM before the kill"
    assert {p for p in seen.pids if is_alive(p)} == set(), "every server PID gone"
    assert seen.pids <= set(incident["killed_pids"])
    assert is_alive(decoy), "a process titled like a worker but outside the tree survives"
    assert is_alive(os.getpid())
    assert summary["duration_s"] < 30  # on_hang: stop ends the soak at the incident


async def test_attached_server_given_by_url_and_pid_is_killed_the_same_way(tmp_path, reaper, sim_process, start_decoy):
    sim = sim_process("--pipeline-parallel-size", "4", "--worker-own-session", "1", time_scale=TIME_SCALE)
    decoy = start_decoy("VLLM::Worker_PP0")
    outside_tree = set(sim.remember_tree())
    run_dir = tmp_path / "run"
    config = run_config(tmp_path, duration="40s",
                        target={"kind": "attached", "base_url": sim.base_url, "pid": sim.pid,
                                "log_path": str(sim.log_path), "pp_size": 4, "block_size": 256},
                        probes={"gpu": {"kind": "sim"}})
    watcher = SoakRunWatcher(reaper, config, run_dir, base_url=sim.base_url, root_pid=sim.pid)
    injected = inject_deadlocks(run_dir, [("load_started", 1)])
    seen = watcher.wait(timeout_s=90)
    assert len(injected) == 1

    assert seen.returncode == 1, seen.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["incidents"]) == 1
    incident = summary["incidents"][0]
    check_incident(run_dir, incident, 1)
    tree = outside_tree | seen.pids
    assert len(tree) >= 6
    assert seen.hung_ignoring_sigterm
    assert {p for p in tree if is_alive(p)} == set(), "every server PID gone"
    assert tree <= set(incident["killed_pids"])
    assert is_alive(decoy)
    assert "failure detected" not in (run_dir / "incidents" / "1" / "log_tail.txt").read_text()


@pytest.mark.slow
async def test_on_hang_restart_two_deadlocks_two_incidents_two_restarts_full_duration(tmp_path, reaper):
    # Two deadlocks, injected once requests flow after the load starts and after
    # the first restart is done; nothing else would hang, so exactly two incidents.
    run_dir = tmp_path / "run"
    config = run_config(tmp_path, duration="20s", target=sim_target(),
                        response={"on_hang": "restart", "max_restarts": 3})
    watcher = SoakRunWatcher(reaper, config, run_dir)
    injected = inject_deadlocks(run_dir, [("load_started", 1), ("restart_done", 1)])
    seen = watcher.wait(timeout_s=120)

    assert len(injected) == 2
    assert seen.returncode == 1, seen.stderr  # incidents make the verdict fail, restarts or not
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "fail"
    incidents = summary["incidents"]
    assert len(incidents) == 2, [i["rule"] for i in incidents]
    for number, incident in enumerate(incidents, 1):
        check_incident(run_dir, incident, number)
    assert not set(incidents[0]["killed_pids"]) & set(incidents[1]["killed_pids"]), "two different trees"
    events = read_jsonl(run_dir / "events.jsonl")
    restarts = [e for e in events if e["type"] == "restart_done"]
    assert len(restarts) == 2
    assert len(set(seen.roots)) == 3, seen.roots  # the first server and two relaunched ones
    ended = [e for e in events if e["type"] == "run_ended"][0]
    assert ended["restarts"] == 2 and ended["incidents"] == 2
    assert ended["reason"] == "duration", ended["reason"]
    assert summary["duration_s"] >= 19.5, summary["duration_s"]  # the soak ran its whole duration
    # Load went on after each restart: requests finished after the second one.
    last_restart = restarts[-1]["ts"]
    assert any(r["ended_at"] > last_restart and r["outcome"] == "ok" for r in read_jsonl(run_dir / "requests.jsonl"))
    # The third server is stopped at the end like any healthy target.
    assert {p for p in seen.pids if is_alive(p)} == set()
