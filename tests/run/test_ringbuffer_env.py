"""VLLM_RINGBUFFER_WARNING_INTERVAL for a server the harness starts: 5 s unless the
target says otherwise, never over a value the launch's own ``env`` sets, and read by
the simulator as vLLM reads it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from soak.errors import ArgumentError, TargetNotReady
from soak.run.target import build_target
from soak.target.config import LaunchedTarget, SimulatorTarget, server_env
from ports import free_port
from soakrun_helpers import small_config, soak_cmd, write_config

VAR = "VLLM_RINGBUFFER_WARNING_INTERVAL"


def launched_env(tmp_path, **config) -> dict[str, str]:
    """The environment a launched command really starts with (it writes it out and exits)."""
    dump = tmp_path / "env.json"
    script = f"import json, os; json.dump(dict(os.environ), open({str(dump)!r}, 'w'))"
    target = build_target(
        LaunchedTarget(command=[sys.executable, "-c", script], base_url=f"http://127.0.0.1:{free_port()}",
                       startup_timeout=20, **config),
        run_dir=tmp_path, environ={}, extra_env={"SOAK_EXTRA": "1"})

    async def go() -> None:
        try:
            await target.start()
        except TargetNotReady:
            pass  # it exits at once: only its environment matters here
        finally:
            await target.aclose()

    asyncio.run(go())
    return json.loads(dump.read_text())


def test_a_launched_server_gets_5_seconds_by_default(tmp_path):
    env = launched_env(tmp_path)
    assert env[VAR] == "5" and env["SOAK_EXTRA"] == "1"


def test_the_launch_env_wins_over_the_target_setting(tmp_path):
    env = launched_env(tmp_path, env={VAR: "30"}, ringbuffer_warning_interval="2s")
    assert env[VAR] == "30"


def test_the_target_setting_and_none(tmp_path):
    assert launched_env(tmp_path, ringbuffer_warning_interval="1m")[VAR] == "60"
    # None: vLLM's own default; the harness's inherited environment passes through untouched
    assert VAR not in launched_env(tmp_path, ringbuffer_warning_interval=None)
    assert server_env(SimulatorTarget()) == {VAR: "5"}


@pytest.mark.parametrize("value, words", [
    ("0s", "greater than 0"), (-3, "cannot be negative"), ("2.5s", "not a whole number of seconds"),
])
def test_a_bad_interval_is_one_line_and_exit_2(tmp_path, value, words):
    config = small_config()
    config["target"]["ringbuffer_warning_interval"] = value
    done = subprocess.run(soak_cmd("run", str(write_config(tmp_path / "bad.yaml", config)), "--out", str(tmp_path / "r")),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "target.ringbuffer_warning_interval" in done.stderr
    assert words in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0


def _sim_config(monkeypatch, tmp_path, value: str | None, **sim):
    from soak.sim.cli import build_config, configure
    import argparse

    if value is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, value)
    path = tmp_path / "sim.json"
    path.write_text(json.dumps(sim))
    parser = argparse.ArgumentParser()
    configure(parser)
    return build_config(parser.parse_args(["--config", str(path)]))


def test_the_simulator_reads_the_variable_as_vllm_does(monkeypatch, tmp_path):
    assert _sim_config(monkeypatch, tmp_path, None).ringbuffer_interval_s == 60.0
    assert _sim_config(monkeypatch, tmp_path, "5").ringbuffer_interval_s == 5.0
    # its own config, when it names one, wins (as a launch's env does)
    assert _sim_config(monkeypatch, tmp_path, "5", ringbuffer_warning_interval=7).ringbuffer_interval_s == 7.0
    with pytest.raises(ArgumentError, match="VLLM_RINGBUFFER_WARNING_INTERVAL='soon'"):
        _sim_config(monkeypatch, tmp_path, "soon")
