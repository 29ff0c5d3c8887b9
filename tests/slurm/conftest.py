"""A real single-node Slurm (soak.rigs.slurm) for the executor tests: started
once per pytest worker that runs them, on ports of that worker's block, torn
down after. A machine without Slurm fails these tests (scripts/test installs
Debian's slurm-wlm and munge), so CI cannot skip them silently."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from soak.rigs.slurm import missing_commands, start_cluster
from tests.ports import free_port


@pytest.fixture(scope="session")
def slurm_cluster():
    missing = missing_commands()
    if missing:
        pytest.fail(f"Slurm is missing ({', '.join(missing)}): scripts/test installs Debian's slurm-wlm and munge")
    # Under /tmp, not pytest's tmp dirs: munge refuses a socket path it deems
    # unsafe and slurmd's spool paths must stay short.
    root = Path(tempfile.mkdtemp(prefix="soak-slurm-"))
    cluster = start_cluster(root / "cluster", ctld_port=free_port(), node_port=free_port(), cpus=2)
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
