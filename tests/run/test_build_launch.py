"""A build is what ran (issue 50), with real launches: the same label, flags and
``/version`` but another ``LD_LIBRARY_PATH`` and ``PYTHONPATH`` (how NCCL or a
venv is swapped to try a fix) are two builds in ``soak history``; the same launch
twice is one. The launched server is the simulator (``python -m soak sim``), so
the build event reads a real interpreter, module and dist-info."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from soakrun_helpers import events, small_config, soak_cmd, write_config

from ports import free_port  # per-worker ports: tests/ports.py

pytestmark = pytest.mark.timeout(400)


def _launched(tmp_path: Path, name: str, env: dict[str, str]) -> Path:
    port = free_port()
    config = small_config(duration="3s", build="candidate-7")
    config["target"] = {
        "kind": "launched",
        "command": [sys.executable, "-m", "soak", "sim", "--port", str(port), "--time-scale", "20"],
        "env": {**env, "HF_TOKEN": "hf-very-secret-build"},
        "base_url": f"http://127.0.0.1:{port}",
        "startup_timeout": "60s",
    }
    config["probes"] = {"gpu": {"kind": "sim"}}
    return write_config(tmp_path / f"{name}.yaml", config)


def test_nccl_and_venv_swaps_are_two_builds_and_the_same_launch_is_one(tmp_path, harness):
    runs = tmp_path / "runs"
    runs.mkdir()
    a = {"LD_LIBRARY_PATH": "/opt/nccl-2.19/lib", "PYTHONPATH": str(tmp_path / "venv-a")}
    b = {"LD_LIBRARY_PATH": "/opt/nccl-2.21/lib", "PYTHONPATH": str(tmp_path / "venv-b")}
    nights = [harness(_launched(tmp_path, name, env), runs / name) for name, env in
              (("n1", a), ("n2", b), ("n3", a))]
    for h in nights:  # run side by side: three servers on their own ports
        assert h.wait(timeout_s=180) == 0, h.stderr

    build = next(e for e in events(runs / "n1") if e["type"] == "build")
    summary = json.loads((runs / "n1" / "summary.json").read_text())
    assert summary["build"]["launch_digest"] == build["launch_digest"]  # summary.json's build is the event's
    launch = build["launch"]
    assert build["label"] == "candidate-7" and build["build"] == "candidate-7"
    assert launch["executable"]["path"] == os.path.abspath(sys.executable)
    real = os.path.realpath(sys.executable)
    assert launch["executable"]["sha256"] == hashlib.sha256(Path(real).read_bytes()).hexdigest()
    assert launch["script"]["module"] == "soak" and launch["script"]["path"].endswith("__main__.py")
    assert launch["packages"]["soak"] == metadata.version("soak")
    assert launch["env"] == a  # only these two values of the server's environment
    text = (runs / "n1" / "events.jsonl").read_text() + (runs / "n1" / "summary.json").read_text()
    assert "hf-very-secret-build" not in text

    done = subprocess.run(soak_cmd("history", str(runs), "--json"), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    lines = document["lines"]
    assert lines[0].startswith("candidate-7: 2 builds: ")
    # the builds in the order their first nights started (side by side here: either may be first)
    assert ("LD_LIBRARY_PATH /opt/nccl-2.19/lib vs /opt/nccl-2.21/lib" in lines[0]
            or "LD_LIBRARY_PATH /opt/nccl-2.21/lib vs /opt/nccl-2.19/lib" in lines[0])
    venvs = (tmp_path / "venv-a", tmp_path / "venv-b")
    assert f"PYTHONPATH {venvs[0]} vs {venvs[1]}" in lines[0] or f"PYTHONPATH {venvs[1]} vs {venvs[0]}" in lines[0]
    builds = {b["facts"]["LD_LIBRARY_PATH"]: b for b in document["history"]["builds"]}
    assert builds["/opt/nccl-2.19/lib"]["runs"] == 2 and builds["/opt/nccl-2.21/lib"]["runs"] == 1
    by_path = {Path(r["path"]).name: r["build"] for r in document["history"]["runs"]}
    assert by_path["n1"] == by_path["n3"] != by_path["n2"]
