"""Issue 32, "the kill hits the server or nothing", with real processes and real
``soak run`` subprocesses (the decision itself is property-tested in
tests/respond/test_belonging_property.py):

- a launched command that daemonizes (``setsid -f``) is followed by the run's
  marker: the run drives its server, and nothing of it outlives the run; one
  that never becomes ready is refused and nothing of it remains either;
- an attached server behind a loopback TCP proxy, given by URL alone, is
  refused (exit 3, one line) and neither the proxy nor the server is signalled;
  ``response.find_root_by_port: false`` runs with no kill target; and a kill
  aimed through the proxy refuses the proxy;
- a leftover carrying the marker of a harness that was SIGKILLed (its guardian
  too) is killed and reported by the next run before it checks the port, while
  a marked process of a harness still alive is left alone.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ports import free_port
from soakrun_helpers import events, pid_alive, soak_cmd, wait_for, wait_for_load, write_config
from test_trust_safety import fake_cmd, fake_config, one_line, procs, run_soak, state_pids, wait_port  # noqa: F401

HERE = Path(__file__).parent
PROXY = HERE / "loopback_proxy.py"
SETSID = shutil.which("setsid")


def _gone(pids) -> bool:
    return not any(pid_alive(p) for p in pids)


def _reported(run_dir: Path) -> set[int]:
    return {p.get("pid") for e in events(run_dir) if e["type"] == "leftovers_killed" for p in e["processes"]}


def _parallel() -> bool:
    # Under xdist another test's run may clean a leftover first (as it should): then
    # only "gone" is this test's to check, not which run reported it.
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


def _launched(command: list[str], port: int) -> dict:
    return {"kind": "launched", "command": command, "base_url": f"http://127.0.0.1:{port}", "startup_timeout": "20s"}


def _scrubbed_daemon(command: list[str]) -> list[str]:
    """``command`` daemonized (setsid -f) with an empty environment: the harness's
    marker variable is gone, only its cgroup can still find it."""
    return [SETSID, "-f", shutil.which("env"), "-i", *command]


# --- a daemonizing launch ------------------------------------------------------------------------------


@pytest.mark.skipif(SETSID is None, reason="no setsid(1)")
def test_a_daemonizing_launch_is_followed_and_nothing_of_it_outlives_the_run(tmp_path, procs):
    port = free_port()
    state = tmp_path / "daemon"
    target = _launched([SETSID, "-f", *fake_cmd(state, port, workers=1)], port)
    config = write_config(tmp_path / "run.yaml", fake_config(target, duration="2s"))

    for night in ("night1", "night2"):  # the second night is not poisoned by the first
        result = run_soak(config, tmp_path / night)
        assert result.returncode == 0, result.stderr
        server = state_pids(state)
        assert {"root", "worker0"} <= set(server)
        wait_for(lambda: _gone(server.values()), 10, "the daemonized server to be gone")
        log = (tmp_path / night / "server.log").read_text()
        assert f"following its server pid {server['root']}" in log
        shutil.rmtree(state)


@pytest.mark.skipif(SETSID is None, reason="no setsid(1)")
def test_a_daemonized_server_that_never_answers_is_refused_and_killed(tmp_path, procs):
    port = free_port()
    pid_file = tmp_path / "daemon.pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    target = {"kind": "launched", "command": [SETSID, "-f", sys.executable, "-c", code],
              "base_url": f"http://127.0.0.1:{port}", "startup_timeout": "2s", "ready_poll_interval": "0.2s"}
    config = write_config(tmp_path / "run.yaml", fake_config(target))

    result = run_soak(config, tmp_path / "run")

    assert result.returncode == 3, result.stderr
    assert "not ready" in one_line(result.stderr)
    daemon = int(pid_file.read_text())
    wait_for(lambda: not pid_alive(daemon), 10, "the daemon to be gone")


def _cgroups_writable() -> bool:
    from soak.proc.cgroup import create

    cgroup = create("probe-" + str(os.getpid()))
    if cgroup is None:
        return False
    cgroup.remove()
    return True


@pytest.mark.skipif(SETSID is None or shutil.which("env") is None, reason="no setsid(1) or env(1)")
def test_a_daemon_that_scrubs_its_environment_is_still_held_by_the_targets_cgroup(tmp_path, procs):
    """Where the harness may make a cgroup (skipped elsewhere: the marker then is the proof)."""
    if not _cgroups_writable():
        pytest.skip("no writable cgroup v2 here")
    port = free_port()
    state = tmp_path / "daemon"
    target = _launched(_scrubbed_daemon(fake_cmd(state, port, workers=1)), port)
    config = write_config(tmp_path / "run.yaml", fake_config(target, duration="2s"))

    result = run_soak(config, tmp_path / "run")

    assert result.returncode == 0, result.stderr
    server = state_pids(state)
    wait_for(lambda: _gone(server.values()), 10, "the scrubbed daemon to be gone")


# --- an attached server behind a loopback proxy ----------------------------------------------------------


def _server_and_proxy(tmp_path: Path, procs, *, keepalive: bool) -> tuple[subprocess.Popen, subprocess.Popen, int]:
    port = free_port()
    server = procs(fake_cmd(tmp_path / "server", port, workers=0), state=tmp_path / "server")
    wait_port(port)
    port_file = tmp_path / "proxy.port"
    proxy = procs([sys.executable, str(PROXY), str(port), str(port_file), *(["--keepalive"] if keepalive else [])])
    wait_for(port_file.exists, 20, "the proxy's port")
    return server, proxy, int(port_file.read_text())


@pytest.mark.parametrize("keepalive", [False, True])
def test_an_attached_url_behind_a_proxy_is_refused_and_nothing_is_signalled(tmp_path, procs, keepalive):
    server, proxy, proxy_port = _server_and_proxy(tmp_path, procs, keepalive=keepalive)
    config = write_config(tmp_path / "run.yaml", fake_config(
        {"kind": "attached", "base_url": f"http://127.0.0.1:{proxy_port}", "startup_timeout": "10s"}))

    result = run_soak(config, tmp_path / "run")

    assert result.returncode == 3, result.stderr
    line = one_line(result.stderr)
    assert f"pid {proxy.pid}" in line and "forwards to" in line and "target.pid" in line
    assert pid_alive(proxy.pid) and pid_alive(server.pid)
    types = [e["type"] for e in events(tmp_path / "run")]
    assert "load_started" not in types


def test_an_attached_url_behind_a_proxy_runs_with_no_kill_target_when_the_config_says_so(tmp_path, procs):
    server, proxy, proxy_port = _server_and_proxy(tmp_path, procs, keepalive=False)
    settings = fake_config({"kind": "attached", "base_url": f"http://127.0.0.1:{proxy_port}",
                            "startup_timeout": "10s"}, duration="2s")
    settings["response"]["find_root_by_port"] = False
    config = write_config(tmp_path / "run.yaml", settings)

    result = run_soak(config, tmp_path / "run")

    assert result.returncode == 0, result.stderr
    assert pid_alive(proxy.pid) and pid_alive(server.pid)


def test_a_kill_aimed_through_a_proxy_never_reaches_the_proxy(tmp_path, procs):
    """The start-up check aside (a proxy put in front after it): the responder's
    kill reads the box with a request held through the port, sees the proxy
    forward, and signals nothing."""
    from soak.clock import SystemClock
    from soak.records import Decision, IncidentKind
    from soak.respond.config import ResponseConfig
    from soak.respond.responder import Responder

    server, proxy, proxy_port = _server_and_proxy(tmp_path, procs, keepalive=False)

    class Target:
        base_url = f"http://127.0.0.1:{proxy_port}"
        root_pid = None
        identity = None
        log_path = None
        flight_recorder_pipe_stem = None

    config = ResponseConfig.model_validate({"gpu_release_timeout": "1s", "kill_timeout": "2s",
                                            "evidence": {"py_spy": False, "flight_recorder": False}})

    async def go():
        responder = Responder(config, run_dir=tmp_path / "run", clock=SystemClock(), gpu_source=None,
                              recent_samples=lambda: [], target=Target())
        responder.targets.check_kill_target = lambda *a, **k: None  # as if the proxy came after the start
        await responder.start()
        try:
            now = time.time()
            return await responder.handle(Decision("test", IncidentKind.HANG, now - 1, now, ("test",), {}), 1)
        finally:
            await responder.aclose()

    record = asyncio.run(go())
    assert record.killed_pids == ()
    assert pid_alive(proxy.pid) and pid_alive(server.pid)
    assert any(f"refused to signal pid {proxy.pid}" in n and "forwards to" in n for n in record.notes), record.notes


# --- a leftover of a SIGKILLed harness ---------------------------------------------------------------------


def _guardian_of(harness_pid: int) -> int:
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "soak.run.guardian" in cmd and str(harness_pid) in cmd:
            return proc.info["pid"]
    raise AssertionError("no guardian found")


def _first_night(tmp_path: Path, procs, target: dict, state: Path) -> subprocess.Popen:
    """A 60 s night against ``target`` in tmp_path/night1, once its load started."""
    first = write_config(tmp_path / "first.yaml", fake_config(target, duration="60s"))
    harness = procs(soak_cmd("run", str(first), "--out", str(tmp_path / "night1"), "--no-html"),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, state=state)
    wait_for_load(tmp_path / "night1")
    return harness


def _next_night(tmp_path: Path, target: dict, port: int) -> subprocess.CompletedProcess:
    """A short night in tmp_path/night2 on the same port, with a fresh server of its own."""
    second = write_config(tmp_path / "second.yaml", fake_config(
        {**target, "command": fake_cmd(tmp_path / "second", port, workers=1)}, duration="2s"))
    return run_soak(second, tmp_path / "night2")


def test_a_leftover_of_a_killed_harness_is_cleaned_and_reported_by_the_next_run(tmp_path, procs):
    from soak.proc.facts import OWNER_VARIABLE, owner_stamp
    from soak.proc.read import pin_of
    from soak.respond.flight import ownership_variable

    port = free_port()
    state = tmp_path / "first"
    target = _launched(fake_cmd(state, port, workers=1), port)
    harness = _first_night(tmp_path, procs, target, state)
    # The night dies hard, its guardian with it (an OOM kill of the whole cgroup, a CI runner torn down).
    os.kill(_guardian_of(harness.pid), signal.SIGKILL)
    os.kill(harness.pid, signal.SIGKILL)
    harness.wait(timeout=10)
    leftover = state_pids(state)
    time.sleep(0.5)
    # Under xdist another test's run on this machine may clean it first, as the next night would.
    assert pid_alive(leftover["root"]) or _parallel(), "the leftover must outlive its harness for this test"

    # A marked process of a harness that is still alive (this test) is another run's: left alone.
    me = pin_of(os.getpid())
    alive_run = procs([sys.executable, "-c", "import time; time.sleep(120)"],
                      env={**os.environ, ownership_variable: "other-run-0000000000000000",
                           OWNER_VARIABLE: owner_stamp(me.pid, me.create_time)})

    result = _next_night(tmp_path, target, port)

    assert result.returncode == 0, result.stderr
    assert _gone(leftover.values())
    assert _reported(tmp_path / "night2") >= {leftover["root"], leftover["worker0"]} or _parallel()
    assert pid_alive(alive_run.pid)
    from soak.proc.cgroup import _parent

    parent = _parent()
    if parent is not None and parent.exists():
        night1_token = [e for e in events(tmp_path / "night1") if e["type"] == "run_created"][0]["run_id"]
        assert not [p for p in parent.iterdir() if p.name.startswith("soak-" + night1_token)], \
            "the dead night's empty cgroup is removed"


@pytest.mark.skipif(SETSID is None or shutil.which("env") is None, reason="no setsid(1) or env(1)")
@pytest.mark.parametrize("guardian_dies_too", [False, True])
def test_a_scrubbed_daemon_of_a_killed_harness_goes_with_it_or_with_the_next_run(tmp_path, procs, guardian_dies_too):
    """No marker to find it by: the cgroup holds it. With the guardian alive it dies
    with the harness; with the guardian killed too, the next run cleans it."""
    if not _cgroups_writable():
        pytest.skip("no writable cgroup v2 here")
    port = free_port()
    state = tmp_path / "daemon"
    target = _launched(_scrubbed_daemon(fake_cmd(state, port, workers=1)), port)
    harness = _first_night(tmp_path, procs, target, state)
    if guardian_dies_too:
        os.kill(_guardian_of(harness.pid), signal.SIGKILL)
    os.kill(harness.pid, signal.SIGKILL)
    harness.wait(timeout=10)
    daemon = state_pids(state)
    if not guardian_dies_too:
        wait_for(lambda: _gone(daemon.values()), 10, "the guardian to take the scrubbed daemon")
        return
    time.sleep(0.5)
    assert pid_alive(daemon["root"]) or _parallel(), "the leftover must outlive its harness for this test"
    result = _next_night(tmp_path, target, port)
    assert result.returncode == 0, result.stderr
    assert _gone(daemon.values())
    assert daemon["root"] in _reported(tmp_path / "night2") or _parallel()
