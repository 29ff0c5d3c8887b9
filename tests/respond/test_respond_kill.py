"""The kill path with real process trees: evidence, SIGKILL of every member, GPUs free.

No simulator here: tree_app.py builds a vLLM-shaped tree (SIGTERM ignored, a
worker in its own session, a helper orphaned by its parent).
"""

from __future__ import annotations

from dataclasses import replace

import json
import os
import pickle
import time

import psutil
import pytest

from respond_helpers import Decision, FakeTarget, ListedGpus, is_alive
from soak.clock import SystemClock
from soak.proc.belonging import Pin, Proof, TargetIdentity
from soak.proc.kill import kill_processes
from soak.proc.read import protected_pids
from soak.proc.tree import ProcessTree
from soak.respond.config import ResponseConfig
from soak.respond.flight import ownership_env
from soak.respond.responder import Responder
from soak.samples import ClientSample, GpuReading, GpuSample, GpuSource, LogSample


def fast_config(**overrides) -> ResponseConfig:
    evidence = {"py_spy": False, "flight_recorder_wait": 3.0, "budget": 10.0, **overrides.pop("evidence", {})}
    return ResponseConfig.model_validate({
        "kill_timeout": 5.0, "gpu_release_timeout": 5.0, "gpu_poll_interval": 0.05,
        "tree_snapshot_interval": 0.1, "evidence": evidence, **overrides,
    })


def decision(now: float) -> Decision:
    return Decision(
        rule="pp_tail_stall", kind="hang", onset_at=now - 6.0, decided_at=now,
        reasons=("gpu 2 at 0% for 6.0s while gpus 0-1 at 100%",),
        evidence={"window_s": 5.0, "low_pct": 5.0, "high_pct": 90.0},
    )


def make_responder(tmp_path, tree, *, config=None, gpus=None, root_pid="tree", samples=(), **kw) -> Responder:
    target = FakeTarget(
        base_url=f"http://127.0.0.1:{tree.port}",
        root_pid=tree.pids["api"] if root_pid == "tree" else root_pid,
        log_path=tree.log_path,
        flight_recorder_pipe_stem=tree.pipe_stem,
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    return Responder(
        config or fast_config(evidence={"flight_recorder_dump_prefix": tree.dump_prefix}),
        run_dir=run_dir, target=target, gpu_source=gpus, clock=SystemClock(),
        recent_samples=lambda: list(samples), **kw,
    )


async def test_hang_response_kills_the_whole_tree_keeps_evidence_and_spares_the_decoy(tmp_path, start_tree, start_decoy):
    tree = start_tree()
    decoy = start_decoy("VLLM::Worker_PP0")
    workers = [tree.pids[r] for r in ("worker0", "worker1", "worker2")]
    gpus = ListedGpus({0: [workers[0]], 1: [workers[1]], 2: [workers[2], tree.pids["helper"]]})
    now = time.time()
    samples = [
        ClientSample(now - 1000, in_flight=1, bytes_total=1, tokens_total=1, requests_done=0),  # outside the window
        ClientSample(now - 2, in_flight=3, bytes_total=10, tokens_total=5, requests_done=1),
        LogSample(now - 1, signature="watchdog_failure", line="[PG ID 8 ...]", fatal=False, fields={"seq": 40427}),
    ]
    responder = make_responder(tmp_path, tree, gpus=gpus, samples=samples)
    # worker 1 really is in a session and process group of its own
    assert os.getsid(tree.pids["worker1"]) != os.getsid(tree.pids["api"])
    assert os.getpgid(tree.pids["worker1"]) != os.getpgid(tree.pids["api"])
    await responder.start()
    try:
        record = await responder.handle(decision(now), 1)
    finally:
        await responder.aclose()

    assert tree.alive() == set(), f"survivors: {tree.alive()}"
    assert set(record.killed_pids) == tree.all_pids
    assert is_alive(decoy), "the decoy titled like a worker must survive"
    assert is_alive(os.getpid())
    assert record.kind == "hang" and record.rule == "pp_tail_stall"
    assert record.onset_at == pytest.approx(now - 6.0, abs=1e-3) and record.detected_at == pytest.approx(now, abs=1e-3)
    assert record.gpus_released is True and record.gpu_free_s is not None and record.gpu_free_s >= 0
    assert record.evidence == "incidents/1" and record.survivors == ()

    bundle = tmp_path / "run" / "incidents" / "1"
    incident = json.loads((bundle / "incident.json").read_text())
    assert incident["status"] == "done"
    assert incident["decision"]["reasons"] == list(record.reasons)
    assert incident["decision"]["evidence"]["window_s"] == 5.0
    for key in ("kind", "rule", "onset_at", "detected_at", "killed_pids", "gpus_released", "evidence"):
        assert key in incident["record"], key
    lines = (bundle / "samples.jsonl").read_text().splitlines()
    assert [json.loads(x)["kind"] for x in lines] == ["client", "log"]
    gpus_json = json.loads((bundle / "gpus.json").read_text())
    assert sorted(p for g in gpus_json["gpus"] for p in g["pids"]) == sorted(workers + [tree.pids["helper"]])
    assert "vllm:generation_tokens_total" in (bundle / "metrics.txt").read_text()
    assert "failure detected by watchdog" in (bundle / "log_tail.txt").read_text()
    watchdog = json.loads((bundle / "watchdog.json").read_text())
    assert watchdog["from_samples"][0]["fields"]["seq"] == 40427
    assert any(e["line"].startswith("[PG ID 8") for e in watchdog["from_log_tail"])
    procs = json.loads((bundle / "processes.json").read_text())
    assert {p["pid"] for p in procs["processes"]} == tree.all_pids
    # the flight recorder: one byte down each rank's pipe, one dump back from each
    dumps = sorted(p.name for p in (bundle / "flight_recorder").iterdir())
    assert dumps == [f"nccl_trace_rank_{r}" for r in range(3)]
    dump = pickle.loads((bundle / "flight_recorder" / "nccl_trace_rank_0").read_bytes())
    assert dump["entries"][0]["profiling_name"] == "nccl:broadcast"
    assert incident["steps"]["flight_recorder"]["pipes_written"] == 3
    summary = json.loads((bundle / "flight_recorder_summary.json").read_text())
    assert sorted(summary["ranks"]) == [0, 1, 2]
    # soak diagnose's line reaches the record (incident.json), whatever these dumps say
    assert summary.get("diagnosis") and record.diagnosis == summary["diagnosis"]
    assert incident["record"]["diagnosis"] == record.diagnosis and record.diagnosis in record.summary


async def test_a_worker_orphaned_before_the_kill_is_still_killed(tmp_path, start_tree, start_decoy):
    tree = start_tree(pipes=False)
    responder = make_responder(tmp_path, tree, config=fast_config(evidence={"enabled": False}))
    await responder.start()  # the periodic snapshot sees the helper while it is still a grandchild
    try:
        tree.release_helper()
        helper = tree.pids["helper"]
        # A walk from the root alone no longer finds it (vllm#55510).
        assert helper not in {p.pid for p in psutil.Process(tree.pids["api"]).children(recursive=True)}
        assert is_alive(helper)
        record = await responder.handle(decision(time.time()), 1)
    finally:
        await responder.aclose()
    assert not is_alive(helper)
    assert helper in record.killed_pids
    assert tree.alive() == set()


async def test_attached_by_url_only_finds_the_root_by_its_listening_port(tmp_path, start_tree):
    tree = start_tree(pipes=False)
    responder = make_responder(tmp_path, tree, root_pid=None, config=fast_config(evidence={"enabled": False}))
    record = await responder.handle(decision(time.time()), 1)
    assert tree.alive() == set()
    assert set(record.killed_pids) == tree.all_pids
    assert any("listening on the target's port" in n for n in record.notes)


async def test_gpu_processes_are_killed_only_when_they_belong_to_the_target(tmp_path, start_tree, start_decoy):
    tree = start_tree(pipes=False)
    token = "run-1234"
    # Left the tree before any snapshot saw it; it carries the launch's marker.
    marked = start_decoy(None, env=ownership_env(token))
    stranger = start_decoy("VLLM::Worker_PP3")                           # somebody else's job on our GPU
    gpus = ListedGpus({0: [tree.pids["worker0"], marked], 1: [stranger]}, mib_per_pid={stranger: 100.0})
    responder = make_responder(tmp_path, tree, gpus=gpus, config=fast_config(evidence={"enabled": False}),
                               ownership_token=token)
    record = await responder.handle(decision(time.time()), 1)
    assert not is_alive(marked) and marked in record.killed_pids, record
    assert is_alive(stranger) and stranger not in record.killed_pids
    assert any(f"left alone: [{stranger}]" in n for n in record.notes)
    # the stranger's 100 MiB is within tolerance: the GPUs count as released
    assert record.gpus_released


async def test_evidence_failures_are_noted_and_never_stop_the_kill(tmp_path, start_tree):
    tree = start_tree(pipes=False)
    gpus = ListedGpus({0: [tree.pids["worker0"]]})
    responder = Responder(
        fast_config(evidence={"metrics_timeout": 1.0}),
        run_dir=tmp_path, clock=SystemClock(), gpu_source=gpus, recent_samples=lambda: [],
        target=FakeTarget(base_url="http://127.0.0.1:9/", root_pid=tree.pids["api"],
                          log_path=tmp_path / "no-such.log", flight_recorder_pipe_stem=str(tmp_path / "none_")),
    )
    record = await responder.handle(decision(time.time()), 2)
    assert tree.alive() == set()
    steps = json.loads((tmp_path / "incidents" / "2" / "incident.json").read_text())["steps"]
    assert steps["metrics"]["ok"] is False and steps["log_tail"]["ok"] is False
    assert "no rank pipe open" in steps["flight_recorder"]["note"]
    assert any(n.startswith("metrics:") for n in record.notes)


async def test_py_spy_dumps_each_server_process(tmp_path, start_tree):
    from soak.respond.evidence import find_py_spy

    if find_py_spy("py-spy") is None:
        pytest.skip("py-spy not installed")
    tree = start_tree(pipes=False)
    responder = make_responder(tmp_path, tree, config=fast_config(evidence={"py_spy": True, "py_spy_timeout": 20.0,
                                                                             "budget": 30.0}))
    record = await responder.handle(decision(time.time()), 1)
    bundle = tmp_path / "run" / "incidents" / "1"
    step = json.loads((bundle / "incident.json").read_text())["steps"]["py_spy"]
    assert tree.alive() == set()
    for pid in tree.all_pids:
        assert (bundle / f"py-spy-{pid}.txt").exists()
    if step["ok"]:
        # ptrace permitted: a real Python stack of the api server's main loop
        assert "tree_app.py" in (bundle / f"py-spy-{tree.pids['api']}.txt").read_text()
    else:
        assert step["note"] and record.notes


async def test_gpus_that_stay_busy_are_reported_not_released(tmp_path, start_tree, start_decoy):
    tree = start_tree(pipes=False)
    stranger = start_decoy("python")
    gpus = ListedGpus({0: [stranger]}, mib_per_pid={stranger: 4096.0})
    responder = make_responder(tmp_path, tree, gpus=gpus,
                               config=fast_config(gpu_release_timeout=0.5, gpu_memory_baseline_mib=0.0,
                                                  evidence={"enabled": False}))
    record = await responder.handle(decision(time.time()), 1)
    assert tree.alive() == set()
    assert record.gpus_released is False and record.gpu_free_s is None
    assert any("4096 MiB" in n for n in record.notes)
    assert is_alive(stranger)


def test_the_harness_its_ancestors_and_pid_1_are_never_signalled():
    protected = protected_pids()
    assert {1, os.getpid(), os.getppid()} <= protected
    tree = ProcessTree()
    assert tree.snapshot(os.getpid()) == () and tree.root is None
    assert tree.snapshot(1) == ()
    assert tree.claim(os.getpid(), via="gpu") is None


def test_a_reused_pid_is_not_killed(start_decoy):
    decoy = start_decoy()
    tree = ProcessTree()
    tree.snapshot(decoy)
    real = tree.known()[0]
    # The same PID with another start time is another process now.
    stale = replace(real, facts=replace(real.facts, create_time=real.create_time - 3600))
    target = TargetIdentity(Proof.ATTACHED_PID, root=Pin(real.pid, real.create_time))
    result = kill_processes([stale], target=target, timeout_s=1.0)
    assert result.killed == () and is_alive(decoy)
    result = kill_processes([real], target=target, timeout_s=5.0)
    assert result.killed_pids == (decoy,) and not is_alive(decoy)


async def test_memory_back_is_judged_against_the_baseline_seen_with_no_process(tmp_path, start_tree):
    # An idle H200 reads ~615 MiB through NVML: more than the 512 MiB tolerance.
    tree = start_tree(pipes=False)
    gpus = ListedGpus({0: [tree.pids["worker0"]]}, default_mib=2048.0)
    gpus.idle_mib = 615.0
    idle = GpuSample(time.time() - 30, GpuSource.NVML,
                     (GpuReading(index=0, util_pct=0.0, mem_used_mib=615.0, mem_total_mib=143771.0),))
    responder = make_responder(tmp_path, tree, gpus=gpus, samples=[idle],
                               config=fast_config(gpu_release_timeout=2.0, evidence={"enabled": False}))
    record = await responder.handle(decision(time.time()), 1)
    assert record.gpus_released, record.notes
    # with a stricter baseline the same 615 MiB is "not back"
    tree2 = start_tree(pipes=False)
    gpus2 = ListedGpus({0: [tree2.pids["worker0"]]})
    gpus2.idle_mib = 615.0
    strict = make_responder(tmp_path, tree2, gpus=gpus2,
                            config=fast_config(gpu_release_timeout=0.3, gpu_memory_baseline_mib=0.0,
                                               gpu_memory_tolerance_mib=100.0, evidence={"enabled": False}))
    record2 = await strict.handle(decision(time.time()), 2)
    assert not record2.gpus_released
    assert any("615 MiB > 100 MiB allowed" in n for n in record2.notes)


async def test_a_response_cancelled_by_its_caller_still_kills_the_tree(tmp_path, start_tree):
    import asyncio

    import socket

    tree = start_tree(pipes=False)
    # A slow evidence step keeps the response busy while the caller gives up on it:
    # /metrics from a loopback socket that listens but never answers (1 s deadline).
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        responder = make_responder(tmp_path, tree, config=fast_config(evidence={"metrics_timeout": 1.0}))
        responder._target.base_url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        handling = asyncio.ensure_future(responder.handle(decision(time.time()), 1))
        await asyncio.sleep(0.2)
        handling.cancel()
        with pytest.raises(asyncio.CancelledError):
            await handling
        assert tree.alive(), "cancelled mid-evidence: the kill has not happened yet"
        await responder.aclose()  # waits for the kill that was under way
    finally:
        silent.close()
    assert tree.alive() == set()
    record = json.loads((tmp_path / "run" / "incidents" / "1" / "incident.json").read_text())
    assert record["status"] == "done"


def test_a_reaped_leaders_group_stragglers_are_found_one_by_one(tmp_path):
    """After the root is reaped its group's members are still found (to be killed
    by PID and start time); a live process holding the number means none are."""
    import subprocess
    import sys
    import time

    from soak.proc.kill import group_stragglers, kill_processes

    pid_file = tmp_path / "straggler.pid"
    code = ("import os, subprocess, sys; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))")
    # Group membership alone is no proof once the leader is reaped (its number may
    # lead a stranger's group later); the run's marker, which every launched
    # process inherits, is.
    import os

    token = "test-stragglers-0000000000000000"
    leader = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                              env={**os.environ, "SOAK_TARGET_ID": token})
    assert leader.wait(timeout=30) == 0  # reaped: its number is free, its child lives on in the group
    straggler = int(pid_file.read_text())
    try:
        found = group_stragglers(leader.pid)
        assert [info.pid for info in found] == [straggler]
        assert kill_processes(found, target=TargetIdentity(Proof.LAUNCHED), timeout_s=5).killed_pids == ()
        assert kill_processes(found, target=TargetIdentity(Proof.LAUNCHED, marker=token),
                              timeout_s=5).killed_pids == (straggler,)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and group_stragglers(leader.pid):
            time.sleep(0.05)
        assert group_stragglers(leader.pid) == ()
    finally:
        try:
            os.kill(straggler, 9)
        except OSError:
            pass

    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        assert group_stragglers(alive.pid) == ()  # the number is held: not a reaped leader's group
    finally:
        alive.kill()
        alive.wait()
