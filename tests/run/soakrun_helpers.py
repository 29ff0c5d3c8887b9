"""Shared by the run-loop tests: a small fast config, the harness and the fake
vLLM as real subprocesses, and cleanup of whatever they started."""

from __future__ import annotations

import pytest

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# A small independent fake of vLLM for the ways the simulator cannot misbehave.
FAKE_VLLM = Path(__file__).with_name("fake_vllm.py")

SMALL_WORKLOAD = {
    "kind": "synthetic_agentic",
    "min_context_tokens": 2000,
    "max_context_tokens": 6000,
    "start_context_tokens": {"dist": "uniform", "low": 2000, "high": 2400},
    "shared_prefix_tokens": 1000,
    "tool_result_tokens": {"dist": "uniform", "low": 200, "high": 400},
    "output_tokens": 12,
    "think_time_s": 0.1,
}


def small_config(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": "test",
        "duration": "4s",
        "target": {"kind": "simulator", "sim": {"time_scale": 20}},
        "workload": dict(SMALL_WORKLOAD),
        "load": {"concurrency": 3, "drain": "5s"},
        "exporter": {"enabled": False},
        "view": {"mode": "plain", "plain_interval": "1s"},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


def attached_config(url: str, **overrides: Any) -> dict[str, Any]:
    """``small_config`` against a server already listening at ``url`` (no GPU, an
    estimating tokenizer: a fake has neither)."""
    config = small_config(**overrides)
    config["target"] = {"kind": "attached", "base_url": url, "startup_timeout": "10s"}
    config["workload"] = {**config["workload"], "tokenizer": {"kind": "estimate"}}
    config["probes"] = {"gpu": {"kind": "none"}, **config.get("probes", {})}
    return config


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def soak_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "soak", *args]


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def events(run_dir: Path) -> list[dict[str, Any]]:
    return read_lines(run_dir / "events.jsonl")


def scrape(base_url: str) -> dict[str, float]:
    """The server's counters and gauges, summed over label sets, by sample name."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(base_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)



def wait_for_load(run_dir: Path, timeout_s: float = 60.0) -> None:
    """Until the run at ``run_dir`` has logged load_started; until then its
    events.jsonl may be missing or end in half a line."""
    def loaded() -> bool:
        try:
            return any(e["type"] == "load_started" for e in events(run_dir))
        except (OSError, ValueError):
            return False

    wait_for(loaded, timeout_s, "the load")

class Harness:
    """A ``soak run`` subprocess; ``close()`` kills it and the target tree it
    started (found from events.jsonl), even after a failed test. Without
    ``html=True`` it runs with ``--no-html``: plotting report.html costs seconds
    of CPU, and only the tests that read the page pay for it."""

    def __init__(self, config_path: Path, run_dir: Path, *extra: str, html: bool = False) -> None:
        self.run_dir = run_dir
        self.stdout_path = run_dir.parent / (run_dir.name + ".out")
        self._out = open(self.stdout_path, "w", encoding="utf-8")
        self.popen = subprocess.Popen(
            soak_cmd("run", str(config_path), "--out", str(run_dir), *extra, *(() if html else ("--no-html",))),
            stdout=self._out,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            text=True,
        )
        self.stderr = ""

    def wait(self, timeout_s: float = 90.0) -> int:
        try:
            _, self.stderr = self.popen.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.close()
            raise
        return self.popen.returncode

    def target_pid(self) -> int | None:
        ready = self._target_ready()
        return None if ready is None else ready["root_pid"]

    def _target_ready(self) -> dict | None:
        try:
            for event in events(self.run_dir):
                if event["type"] == "target_ready":
                    return event
        except (OSError, ValueError, KeyError):
            pass
        return None

    def close(self) -> None:
        ready = self._target_ready()
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.communicate(timeout=10)
        if ready is not None:
            # The harness starts its target in its own session: the group is the tree.
            kill_group_if_born_before(ready["root_pid"], ready["ts"])
        self._out.close()


def kill_group_if_born_before(pid: int, ts: float) -> None:
    """SIGKILL the process group led by ``pid`` if that process is still the one
    that existed at ``ts``. PIDs wrap quickly on a box with pid_max 32768 and a
    suite that starts thousands of processes: a stale number is someone else's
    (another test's simulator, in a parallel run)."""
    import psutil

    if not isinstance(pid, int) or pid <= 1:  # an attached target without a PID
        return
    try:
        born = psutil.Process(pid).create_time()
    except psutil.Error:
        return
    if born > ts + 0.05:  # created after it was seen answering: a stranger with a reused PID
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


@pytest.fixture
def harness():
    """Factory: ``h = harness(config_path, run_dir, *flags, html=False)``; every one closed at teardown."""
    created: list[Harness] = []

    def make(config_path: Path, run_dir: Path, *extra: str, html: bool = False) -> Harness:
        h = Harness(config_path, run_dir, *extra, html=html)
        created.append(h)
        return h

    yield make
    for h in created:
        h.close()


@dataclass(frozen=True)
class FakeVllm:
    url: str
    proc: subprocess.Popen


@pytest.fixture
def fake_vllm(tmp_path):
    """Factory: ``fake = fake_vllm(mode, *args, env=None, quiet=False)`` starts
    ``fake_vllm.py MODE PORT_FILE *args`` on 127.0.0.1 port 0 and returns it once
    it listens (``fake.url``, ``fake.proc``); ``env`` is added to the environment,
    ``quiet`` drops its stderr. Every fake it started is killed at teardown."""
    started: list[subprocess.Popen] = []

    def start(mode: str, *args: str, env: dict[str, str] | None = None, quiet: bool = False) -> FakeVllm:
        port_file = tmp_path / f"fake-{mode}-{len(started)}.port"
        proc = subprocess.Popen([sys.executable, str(FAKE_VLLM), mode, str(port_file), *args],
                                stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL if quiet else None,
                                env=None if env is None else {**os.environ, **env})
        started.append(proc)
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"fake server {mode} did not start")
            time.sleep(0.05)
        return FakeVllm(f"http://127.0.0.1:{port_file.read_text()}", proc)

    yield start
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)
