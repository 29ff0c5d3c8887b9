"""The real-vLLM tier: vLLM's CPU build (scripts/real-vllm) driven by `soak run`.

Runs only where `scripts/real-vllm setup` has been done and SOAK_REAL_VLLM=1 is
set (`scripts/real-vllm test` sets it): each test starts a real server, which
takes minutes on two shared cores, so the default test run skips them.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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
                  response: dict | None = None, gpu: str = "stage_cpu") -> tuple[Path, str]:
    """The launch example, on a free port, written into tmp_path."""
    config = yaml.safe_load((REPO / "examples" / "real-vllm-launch.yaml").read_text())
    # SOAK_REAL_VLLM_PORT: a port agreed with whoever else runs servers on this machine
    port = int(os.environ.get("SOAK_REAL_VLLM_PORT") or free_port())
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
    # the stage-CPU source outright: what stage_cpu_stall reads where there is no GPU
    config.setdefault("probes", {})["gpu"] = {"kind": gpu}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, base


def run_soak(config: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "soak", "run", str(config), "--out", str(out)],
        cwd=REPO, stdout=open(out.parent / (out.name + ".out"), "wb"), stderr=subprocess.STDOUT,
    )


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def hangs_bench() -> Any:
    """bench/real_vllm_hangs.py: the plan, the stamp watcher and the per-hang rows the tier asserts on."""
    spec = importlib.util.spec_from_file_location("real_vllm_hangs", REPO / "bench" / "real_vllm_hangs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
