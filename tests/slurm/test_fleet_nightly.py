"""The fleet nightly on a real Slurm: deploy/fleet.sh submits one soak per box as
a job array (each a real `soak run` against its own simulator) and a job after it
that pools every box's night with `soak history` and pushes each box's nights to
a real Pushgateway with its `box` label."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dashboards"))  # prom_helpers, as its conftest does
from tests.dashboards.test_pushgateway import pushgateway  # noqa: E402,F401  (the real Pushgateway fixture)

pytestmark = pytest.mark.xdist_group("slurm-bisect")

REPO = Path(__file__).resolve().parents[2]


def test_a_fleet_nightly_of_two_boxes_is_pooled_by_history_and_pushed_per_box(slurm_cluster, tmp_path, pushgateway):  # noqa: F811
    config = yaml.safe_load((REPO / "workloads" / "demo.yaml").read_text())
    config.update(name="fleet", duration="8s", build="fleet-build")
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(config))
    soak_bin = tmp_path / "soak"
    soak_bin.write_text(f"#!/bin/sh\nexec {sys.executable} -m soak \"$@\"\n")
    soak_bin.chmod(0o755)
    fleet = tmp_path / "fleet"
    env = {**slurm_cluster.env, "SOAK_FLEET_DIR": str(fleet), "SOAK_CONFIG": str(tmp_path / "fleet.yaml"),
           "SOAK_FLEET_BOXES": "2", "SOAK_FLEET_SHARE_NODES": "1", "SOAK_BIN": str(soak_bin),
           "SOAK_PYTHON": sys.executable, "SOAK_PUSHGATEWAY": f"http://127.0.0.1:{pushgateway}",
           # proving across nights: both boxes' nights of the build as one sequential test
           "SOAK_PROVE": "--prove fleet-build --broken-mtbf 20m --target-mtbf 200m",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(["bash", str(REPO / "deploy" / "fleet.sh")], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "array of 2" in done.stdout
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and slurm_cluster.run("squeue", "-h").stdout.strip():
        time.sleep(1)
    assert not slurm_cluster.run("squeue", "-h").stdout.strip(), "the fleet's jobs never ended"

    host = slurm_cluster.host
    nights = sorted(p.name for p in (fleet / "history" / "runs").iterdir())
    boxes = [re.sub(r"-\d{8}T\d{6}Z(-\d+)?$", "", n) for n in nights]  # a host name may hold "-"
    assert boxes == [f"{host}.0", f"{host}.1"], nights
    history = json.loads((fleet / "history" / "history.json").read_text())
    builds = {b["build"]: b for b in history["builds"]}
    assert builds["fleet-build"]["runs"] == 2, history["builds"]  # both boxes' nights, pooled
    assert (fleet / "history" / "history.html").is_file()
    (proof,) = history["proofs"]  # the two nights laid end to end: about 16 s of 65 clean minutes
    assert proof["build"] == "fleet-build" and proof["decision"] == "undecided", proof

    with urllib.request.urlopen(f"http://127.0.0.1:{pushgateway}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    runs_lines = [line for line in metrics.splitlines() if line.startswith("soak_build_runs{")]
    assert any(f'box="{host}.0"' in line for line in runs_lines), runs_lines
    assert any(f'box="{host}.1"' in line for line in runs_lines), runs_lines
