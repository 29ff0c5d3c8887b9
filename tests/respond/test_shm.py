"""/dev/shm cleanup after a SIGKILL: only what the killed tree held goes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from soak.proc.shm import ShmLedger, shm_paths_of

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")

# A child that creates (or attaches to) POSIX shared memory and keeps it mapped,
# as vLLM's broadcast rings do, then waits to be killed.
HOLDER = r"""
import sys, time
from multiprocessing import shared_memory, resource_tracker
name, create = sys.argv[1], sys.argv[2] == "1"
shm = shared_memory.SharedMemory(name=name, create=create, size=4096 if create else 0)
try:
    resource_tracker.unregister(shm._name, "shared_memory")  # we test our cleanup, not Python's
except Exception:
    pass
print("ready", flush=True)
time.sleep(120)
"""


def _holder(name: str, create: bool) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, name, "1" if create else "0"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


@pytest.fixture
def names():
    made: list[str] = []

    def make() -> str:
        name = f"soaktest_{uuid.uuid4().hex[:10]}"
        made.append(name)
        return name

    yield make
    for name in made:
        try:
            os.unlink(f"/dev/shm/{name}")
        except FileNotFoundError:
            pass


def test_a_segment_only_the_killed_process_held_is_removed(names):
    name = names()
    proc = _holder(name, create=True)
    try:
        assert f"/dev/shm/{name}" in shm_paths_of(proc.pid)
        ledger = ShmLedger()
        assert ledger.record([proc.pid]) == 1
    finally:
        _kill(proc)
    assert Path(f"/dev/shm/{name}").exists()  # SIGKILL leaves it behind
    result = ledger.cleanup([proc.pid])
    assert [s.path for s in result.removed] == [f"/dev/shm/{name}"]
    assert not Path(f"/dev/shm/{name}").exists()


def test_a_segment_another_live_process_still_maps_is_kept(names):
    name = names()
    ours = _holder(name, create=True)
    stranger = _holder(name, create=False)
    try:
        ledger = ShmLedger()
        ledger.record([ours.pid])
        _kill(ours)
        result = ledger.cleanup([ours.pid])
        assert result.removed == ()
        assert str(stranger.pid) in result.kept[f"/dev/shm/{name}"]
        assert Path(f"/dev/shm/{name}").exists()
    finally:
        _kill(stranger)


def test_a_new_file_under_the_same_name_is_someone_elses(names):
    name = names()
    proc = _holder(name, create=True)
    ledger = ShmLedger()
    ledger.record([proc.pid])
    _kill(proc)
    os.unlink(f"/dev/shm/{name}")
    Path(f"/dev/shm/{name}").write_bytes(b"not yours")  # a stranger reuses the name
    result = ledger.cleanup([proc.pid])
    assert result.removed == ()
    assert "another file" in result.kept[f"/dev/shm/{name}"]
    assert Path(f"/dev/shm/{name}").read_bytes() == b"not yours"


def test_segments_never_seen_in_the_tree_are_left_alone(names):
    mine, other = names(), names()
    proc = _holder(mine, create=True)
    outsider = _holder(other, create=True)
    try:
        ledger = ShmLedger()
        ledger.record([proc.pid])
        _kill(proc)
        _kill(outsider)  # dead too, but never recorded as the target's
        result = ledger.cleanup([proc.pid, outsider.pid])
        assert [s.path for s in result.removed] == [f"/dev/shm/{mine}"]
        assert Path(f"/dev/shm/{other}").exists()
    finally:
        if outsider.poll() is None:
            _kill(outsider)


def _responder(tmp_path, root_pid: int):
    from respond_helpers import FakeTarget

    from soak.clock import SystemClock
    from soak.respond.config import ResponseConfig
    from soak.respond.responder import Responder

    config = ResponseConfig.model_validate({"evidence": {"py_spy": False, "flight_recorder": False, "budget": 3},
                                            "tree_snapshot_interval": 0.1, "kill_timeout": 5, "gpu_release_timeout": 1})
    return Responder(config, run_dir=tmp_path, target=FakeTarget(base_url="http://127.0.0.1:9/", root_pid=root_pid),
                     gpu_source=None, clock=SystemClock(), recent_samples=lambda: [])


async def test_the_responder_removes_the_killed_trees_segments_on_an_incident(tmp_path, names):
    from respond_helpers import Decision

    name = names()
    proc = _holder(name, create=True)
    responder = _responder(tmp_path, proc.pid)
    await responder.start()
    try:
        now = time.time()
        record = await responder.handle(Decision("generation_frozen", "hang", now - 5, now), 1)
    finally:
        await responder.aclose()
        proc.wait(timeout=10)
    assert proc.pid in record.killed_pids
    assert record.extra["shm_removed"] == [f"/dev/shm/{name}"]
    assert not Path(f"/dev/shm/{name}").exists()
    assert (tmp_path / "incidents" / "1" / "shm_cleanup.json").exists()


async def test_release_after_a_normal_stop_and_never_while_the_tree_lives(tmp_path, names):
    name = names()
    proc = _holder(name, create=True)
    responder = _responder(tmp_path, proc.pid)
    await responder.start()
    await responder.aclose()
    assert await responder.release_shm() is None  # still running: nothing touched
    assert Path(f"/dev/shm/{name}").exists()
    _kill(proc)  # the run's own stop (it leaves the segment, as vLLM 0.32's SIGTERM does)
    from respond_helpers import is_alive, wait_for

    # its resource tracker (a child) sees the pipe close and exits by itself
    wait_for(lambda: not any(is_alive(i.pid) for i in responder.targets.tree.known()), 15, "the tree gone")
    released = await responder.release_shm()
    assert [s["path"] for s in released["removed"]] == [f"/dev/shm/{name}"]
    assert not Path(f"/dev/shm/{name}").exists()
