"""The real-vLLM tier: vLLM's CPU build (scripts/real-vllm) driven by `soak run`.

Runs only where `scripts/real-vllm setup` has been done and SOAK_REAL_VLLM=1 is
set (`scripts/real-vllm test` sets it): each test starts a real server, which
takes minutes on two shared cores, so the default test run skips them.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import yaml
from ports import free_port  # per-worker ports: tests/ports.py

REPO = Path(__file__).resolve().parents[2]


def _home() -> Path:
    """Where scripts/real-vllm keeps the tier (one answer: the script's own)."""
    if os.environ.get("REAL_VLLM_HOME"):
        return Path(os.environ["REAL_VLLM_HOME"])
    done = subprocess.run(["bash", str(REPO / "scripts" / "real-vllm"), "home"], capture_output=True, text=True,
                          timeout=30, check=True)
    return Path(done.stdout.strip())


HOME = _home()


def real_vllm_ready() -> str | None:
    """Why the tier cannot run here, or None."""
    if os.environ.get("SOAK_REAL_VLLM") != "1":
        return "real-vLLM tier: run it with scripts/real-vllm test (SOAK_REAL_VLLM=1)"
    if not (HOME / "venv" / ".soak-ready").exists() or not (HOME / "model" / "model.safetensors").exists():
        return f"real-vLLM tier: not set up under {HOME}; run scripts/real-vllm setup"
    return None


def pytest_collection_modifyitems(config, items):
    reason = real_vllm_ready()
    if reason is None:
        return
    if os.environ.get("SOAK_REAL_VLLM") == "1":
        # Asked for and not there: a tier that skips in silence would pass CI with no real server met.
        raise pytest.UsageError(reason)
    for item in items:
        if item.get_closest_marker("real_vllm") is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


def launch_config(tmp_path: Path, *, duration: str, env: dict | None = None, detector: dict | None = None,
                  response: dict | None = None) -> tuple[Path, str]:
    """The launch example, on a free port, written into tmp_path."""
    config = yaml.safe_load((REPO / "examples" / "real-vllm-launch.yaml").read_text())
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    config["target"]["command"] = [str(REPO / "scripts" / "real-vllm"), "serve", "--pp", "2", "--port", str(port)]
    config["target"]["base_url"] = base
    config["target"]["env"] = {"REAL_VLLM_HOME": str(HOME), **(env or {})}
    config["workload"] = str(REPO / "examples" / "workloads" / "real-vllm-8k.yaml")
    config["duration"] = duration
    if detector:
        config["detector"] = detector
    if response:
        config["response"] = {**config["response"], **response}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, base


def generation_tokens(base_url: str) -> float | None:
    try:
        with urllib.request.urlopen(base_url + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except Exception:
        return None
    total = None
    for line in text.splitlines():
        if line.startswith("vllm:generation_tokens_total"):
            total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
    return total


@dataclass
class Stopper:
    """SIGSTOPs the last stage's worker of the server under `soak run` at a random
    moment after the server has generated tokens: a real stage that stops
    answering, with nothing in the process state a deadlock would not show."""

    soak: subprocess.Popen
    base_url: str
    title: str = "VLLM::Worker_PP1"
    min_delay: float = 3.0
    max_delay: float = 20.0
    seed: int | None = None
    stop_at: float | None = None
    worker_pid: int | None = None
    tree: list[dict] = field(default_factory=list)
    shm: set[str] = field(default_factory=set)
    error: str | None = None

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        from soak.proc.shm import shm_paths_of

        rng = random.Random(self.seed)
        deadline = time.time() + 1500
        root = psutil.Process(self.soak.pid)
        worker = None
        while worker is None and time.time() < deadline and self.soak.poll() is None:
            for proc in root.children(recursive=True):
                try:
                    cmd = proc.cmdline()
                except psutil.Error:
                    continue
                if cmd and cmd[0].strip() == self.title:
                    worker = proc
            time.sleep(1.0)
        if worker is None:
            self.error = "the worker never appeared"
            return
        before = None
        while time.time() < deadline and self.soak.poll() is None:
            tokens = generation_tokens(self.base_url)
            if tokens is not None and before is not None and tokens > before:
                break
            before = tokens if tokens is not None else before
            time.sleep(1.0)
        time.sleep(rng.uniform(self.min_delay, self.max_delay))
        try:
            api = worker.parent().parent()
            procs = [api, *api.children(recursive=True)]
            self.tree = [{"pid": p.pid, "cmdline": [c for c in p.cmdline() if c][:6]} for p in procs]
            for p in procs:
                self.shm |= shm_paths_of(p.pid)
            self.worker_pid = worker.pid
            worker.send_signal(signal.SIGSTOP)
            self.stop_at = time.time()
        except psutil.Error as exc:
            self.error = f"could not stop the worker: {exc}"


def run_soak(config: Path, out: Path, *, timeout: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "soak", "run", str(config), "--out", str(out)],
        cwd=REPO, stdout=open(out.parent / (out.name + ".out"), "wb"), stderr=subprocess.STDOUT,
    )


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
