"""Fixtures for the real-GPU pieces: which Python has torch, whether a GPU is
there, and a factory of worker processes that kills what it starts.

torch is not a dependency of soak. The tests that need it run the programs
under ``$SOAK_TORCH_PYTHON`` when set (a venv with torch; the soak package
importable from it), else under this interpreter, and skip when neither has
torch. The GPU tests also skip unless NVML lists a GPU.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=None)
def _torch_python() -> tuple[str | None, str]:
    python = os.environ.get("SOAK_TORCH_PYTHON") or sys.executable
    try:
        probe = subprocess.run(
            [python, "-c", "import torch, soak; print(torch.__version__, torch.cuda.device_count())"],
            capture_output=True, text=True, timeout=120, cwd=REPO,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{python}: {exc}"
    if probe.returncode != 0:
        return None, f"no torch (with soak) under {python}"
    return python, probe.stdout.strip()


@functools.lru_cache(maxsize=None)
def gpu_count() -> int:
    python, info = _torch_python()
    if python is None:
        return 0
    try:
        return int(info.split()[1])
    except (IndexError, ValueError):
        return 0


@pytest.fixture
def torch_python() -> str:
    python, why = _torch_python()
    if python is None:
        pytest.skip(why)
    return python


@pytest.fixture
def gpu_python(torch_python) -> str:
    if gpu_count() < 1:
        pytest.skip("no CUDA GPU visible to torch")
    return torch_python


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a process we started and everything in its process group."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


@pytest.fixture
def spawn():
    """spawn(argv, **popen_kwargs) -> Popen in its own session; all killed at teardown."""
    started: list[subprocess.Popen] = []

    def _spawn(argv, **kwargs):
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        kwargs.setdefault("env", env)
        kwargs.setdefault("cwd", REPO)
        proc = subprocess.Popen(argv, start_new_session=True, **kwargs)
        started.append(proc)
        return proc

    yield _spawn
    for proc in started:
        kill_tree(proc)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
