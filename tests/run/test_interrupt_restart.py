"""Ctrl-C while the harness relaunches a hung server (on_hang: restart) ends the
run now, not once the new server is ready: a large model takes minutes to load."""

from __future__ import annotations

import json
import signal
import sys
import time
import urllib.request

from ports import free_port  # per-worker ports: tests/ports.py
from soakrun_helpers import events, pid_alive, small_config, wait_for, write_config

# The first start serves the simulator; a relaunch loads "for ten minutes" (never
# opens its port) and writes its pid, so the test can see that it was stopped.
WRAPPER = """\
import os, sys, time
marker, port, pid_file = sys.argv[1], sys.argv[2], sys.argv[3]
if os.path.exists(marker):
    with open(pid_file, "w") as fh:
        fh.write(str(os.getpid()))
    time.sleep(600)
    raise SystemExit(0)
open(marker, "w").close()
os.execv(sys.executable, [sys.executable, "-m", "soak", "sim", "--port", port, "--time-scale", "20",
                          "--pipeline-parallel-size", "4"])
"""

DEADLOCK = {"kind": "pp_deadlock", "watchdog_timeout": "3000s", "ringbuffer_warning_interval": "3000s",
            "execute_timeout": "6000s"}


def of_type(run_dir, kind):
    try:
        return [e for e in events(run_dir) if e["type"] == kind]
    except (OSError, ValueError):
        return []


def test_ctrl_c_during_a_relaunch_stops_at_once_and_leaves_nothing_running(tmp_path, harness):
    port = free_port()
    wrapper = tmp_path / "serve.py"
    wrapper.write_text(WRAPPER)
    relaunch_pid_file = tmp_path / "relaunch.pid"
    config = small_config(duration="60s")
    config["target"] = {
        "kind": "launched",
        "command": [sys.executable, str(wrapper), str(tmp_path / "started"), str(port), str(relaunch_pid_file)],
        "base_url": f"http://127.0.0.1:{port}",
        "startup_timeout": "10m",
        "pp_size": 4,
        "block_size": 256,
    }
    config["probes"] = {"gpu": {"kind": "sim"}}
    config["response"] = {"on_hang": "restart", "max_restarts": 3}
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "t.yaml", config), run_dir)

    wait_for(lambda: of_type(run_dir, "load_started"), 60, "the load to start")
    request = urllib.request.Request(f"http://127.0.0.1:{port}/sim/fault", data=json.dumps(DEADLOCK).encode(),
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=5).read()
    wait_for(lambda: of_type(run_dir, "restart_started") and relaunch_pid_file.exists()
             and relaunch_pid_file.read_text(), 60, "the relaunch")
    relaunched = int(relaunch_pid_file.read_text())
    assert pid_alive(relaunched)

    sent = time.monotonic()
    h.popen.send_signal(signal.SIGINT)
    assert h.wait(timeout_s=60) == 130, h.stderr
    took = time.monotonic() - sent
    # Before, the run waited for the relaunched server's start-up (here ten minutes).
    assert took < 30, f"{took:.1f} s from Ctrl-C to exit"
    cancelled = of_type(run_dir, "restart_cancelled")
    assert len(cancelled) == 1 and cancelled[0]["number"] == 1
    assert cancelled[0]["reason"] == "interrupted (SIGINT)"
    assert not of_type(run_dir, "restart_done")
    ended = of_type(run_dir, "run_ended")[0]
    assert ended["exit_code"] == 130 and ended["incidents"] == 1
    wait_for(lambda: not pid_alive(relaunched), 10, "the half-started server to be stopped")
