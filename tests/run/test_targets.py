"""Targets as real processes: a launched server (output captured, flight-recorder
variables set, tree stopped at the end), and the ways a target is never ready (exit 3)."""

from __future__ import annotations

import json
import subprocess
import sys

from soakrun_helpers import events, pid_alive, small_config, soak_cmd, write_config

from soak.judge import summarize
from ports import free_port  # per-worker ports: tests/ports.py


def test_launched_target_runs_captures_output_and_gets_the_flight_recorder_env(tmp_path, harness) -> None:
    port = free_port()
    config = small_config(duration="3s")
    config["target"] = {
        "kind": "launched",
        "command": [sys.executable, "-m", "soak", "sim", "--port", str(port), "--time-scale", "20"],
        "env": {"SOAK_TEST_MARK": "launched-by-soak", "HF_TOKEN": "hf-very-secret"},
        "base_url": f"http://127.0.0.1:{port}",
        "model": "deepseek-v4-flash",
        "startup_timeout": "60s",
        "pp_size": 8,
        "block_size": 256,
    }
    config["probes"] = {"gpu": {"kind": "sim"}}
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "launched.yaml", config), run_dir)
    pid = None
    assert h.wait() == 0, h.stderr
    pid = h.target_pid()
    assert pid is not None and not pid_alive(pid)
    log = (run_dir / "server.log").read_text()
    assert "soak: starting the launched server" in log and len(log.splitlines()) > 3
    config_text = (run_dir / "config.yaml").read_text()
    assert "hf-very-secret" not in config_text and "HF_TOKEN: '***'" in config_text
    assert "launched-by-soak" in config_text  # not a secret: kept
    summary = summarize(run_dir)
    assert summary["verdict"] == "pass" and summary["requests"]["ok"] > 0 and summary["requests"]["failed"] == 0


def test_the_launched_server_environment(tmp_path) -> None:
    """The variables reach the server process (written by a stand-in command)."""
    import asyncio

    from soak.target.config import LaunchedTarget
    from soak.run.target import build_target
    from soak.errors import TargetNotReady

    dump = tmp_path / "env.json"
    script = f"import json, os; json.dump(dict(os.environ), open({str(dump)!r}, 'w'))"
    config = LaunchedTarget(command=[sys.executable, "-c", script], env={"A_VAR": "1"},
                            base_url=f"http://127.0.0.1:{free_port()}", startup_timeout=20)
    target = build_target(config, run_dir=tmp_path, environ={}, extra_env={"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"})

    async def go() -> str:
        try:
            await target.start()
        except TargetNotReady as exc:
            return str(exc)
        finally:
            await target.aclose()
        return ""

    message = asyncio.run(go())
    assert "exited with code 0 before it was ready" in message
    env = json.loads(dump.read_text())
    assert env["A_VAR"] == "1" and env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"


def run_expect_3(tmp_path, target: dict, words: str) -> None:
    config = small_config(duration="3s", probes={"gpu": {"kind": "none"}})
    config["target"] = target
    path = write_config(tmp_path / "t.yaml", config)
    run_dir = tmp_path / "run"
    proc = subprocess.run(soak_cmd("run", str(path), "--out", str(run_dir), "--no-html"), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    ended = [e for e in events(run_dir) if e["type"] == "run_ended"]
    assert ended and ended[0]["exit_code"] == 3
    assert json.loads((run_dir / "summary.json").read_text())["verdict"] == "aborted"


def test_never_ready_is_exit_3(tmp_path) -> None:
    run_expect_3(
        tmp_path,
        {"kind": "launched", "command": [sys.executable, "-c", "import time; time.sleep(60)"],
         "base_url": f"http://127.0.0.1:{free_port()}", "startup_timeout": "1s", "ready_poll_interval": "0.2s",
         "stop_timeout": "1s"},
        "not ready after 1s",
    )


def test_a_server_that_exits_during_start_up_is_exit_3(tmp_path) -> None:
    run_expect_3(
        tmp_path,
        {"kind": "launched", "command": [sys.executable, "-c", "raise SystemExit(7)"],
         "base_url": f"http://127.0.0.1:{free_port()}"},
        "exited with code 7",
    )


def test_attached_to_nothing_is_exit_3(tmp_path) -> None:
    run_expect_3(tmp_path, {"kind": "attached", "base_url": f"http://127.0.0.1:{free_port()}", "startup_timeout": "1s"},
                 "not ready after 1s")


def test_a_missing_api_key_variable_is_exit_3(tmp_path) -> None:
    config = small_config(duration="3s")
    config["target"]["api_key_env"] = "SOAK_TEST_NO_SUCH_VARIABLE"
    path = write_config(tmp_path / "k.yaml", config)
    proc = subprocess.run(soak_cmd("run", str(path), "--out", str(tmp_path / "run"), "--no-html"), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 3
    assert "SOAK_TEST_NO_SUCH_VARIABLE is not set" in proc.stderr and proc.stderr.count("\n") == 1


def test_no_nvml_is_exit_3_before_a_server_is_started(tmp_path) -> None:
    import pytest

    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML works on this machine")
    except Exception:
        pass
    marker = tmp_path / "started"
    config = small_config(duration="3s")
    config["target"] = {"kind": "launched", "command": ["touch", str(marker)], "base_url": f"http://127.0.0.1:{free_port()}"}
    config["probes"] = {"gpu": {"kind": "nvml"}}
    path = write_config(tmp_path / "n.yaml", config)
    proc = subprocess.run(soak_cmd("run", str(path), "--out", str(tmp_path / "run"), "--no-html"), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 3 and "NVML" in proc.stderr and proc.stderr.count("\n") == 1
    assert not marker.exists()


def _spawn_with_pid(want: int, cmd: list[str]) -> subprocess.Popen | None:
    """A process in a session of its own holding PID ``want``: the kernel's
    ``ns_last_pid`` (root only) makes the next fork take it. None where that
    cannot be arranged (not root, or another fork took the number first)."""
    import os

    for _ in range(20):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(want - 1))
        except OSError:
            return None
        proc = subprocess.Popen(cmd, start_new_session=True, stdin=subprocess.DEVNULL)
        if proc.pid == want:
            return proc
        proc.kill()
        proc.wait()
        if os.path.exists(f"/proc/{want}"):
            return None  # someone else holds it now
    return None


def test_stopping_a_dead_launched_server_never_signals_the_stranger_holding_its_pid(tmp_path) -> None:
    """pid_max is often 32768: once the harness has reaped its server's root, the
    number is free, and a stranger may lead a session under it. Stopping the target
    must not take that stranger for the root (or killpg its group)."""
    import asyncio

    import pytest

    from soak.errors import TargetNotReady
    from soak.run.process_target import ProcessTarget

    target = ProcessTarget(command=[sys.executable, "-c", "import sys; sys.exit(7)"], what="the launched server",
                           run_dir=tmp_path, base_url=f"http://127.0.0.1:{free_port()}", startup_timeout_s=30,
                           poll_interval_s=0.05, stop_timeout_s=2)

    async def start() -> int:
        with pytest.raises(TargetNotReady):
            await target.start()
        return target.root_pid

    root = asyncio.run(start())
    stranger = _spawn_with_pid(root, [sys.executable, "-c", "import time; time.sleep(60)"])
    if stranger is None:
        pytest.skip("cannot hand a reused PID to a stranger here (needs root and /proc/sys/kernel/ns_last_pid)")
    try:
        asyncio.run(target.aclose())
        assert stranger.poll() is None, "the stranger holding the old root's PID was killed"
    finally:
        stranger.kill()
        stranger.wait()
