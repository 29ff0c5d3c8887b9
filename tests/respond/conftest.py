"""Fixtures for the kill-path tests: real process trees, a decoy, a GPU source
that lists the tree's PIDs in the GpuSample format. Every process a fixture
starts is SIGKILLed (by its recorded PID and start time) at teardown."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Mapping

import psutil
import pytest

from respond_helpers import ROLES, TREE_APP, Tree, Reaper, wait_for


@pytest.fixture
def reaper():
    r = Reaper()
    yield r
    r.close()


@pytest.fixture
def start_tree(tmp_path, reaper):
    """start_tree(**popen_kw) -> Tree: the vLLM-shaped tree of tree_app.py, all up."""
    count = [0]

    def start(*, pipes: bool = True, **popen_kw) -> Tree:
        count[0] += 1
        state = tmp_path / f"tree{count[0]}"
        state.mkdir()
        nccl = state / "nccl"
        nccl.mkdir()
        pipe_stem, dump_prefix = str(nccl / "pipe_rank_"), str(nccl / "nccl_trace_rank_")
        log_path = state / "server.log"
        cmd = [sys.executable, str(TREE_APP), "--state", str(state), "--lifetime", "60"]
        if pipes:
            cmd += ["--pipe-stem", pipe_stem, "--dump-prefix", dump_prefix]
        log = open(log_path, "wb")
        try:
            popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **popen_kw)
        finally:
            log.close()
        reaper.add_popen(popen)
        pids: dict[str, int] = {}

        def up() -> bool:
            for role in ROLES:
                if role not in pids and (state / f"{role}.pid").exists():
                    pids[role] = int((state / f"{role}.pid").read_text())
                    reaper.add(pids[role])
            return len(pids) == len(ROLES) and (state / "port").exists()

        wait_for(up, what="the tree to come up")
        port = int((state / "port").read_text())
        if pipes:
            wait_for(lambda: all(os.path.exists(f"{pipe_stem}{r}.pipe") for r in range(3)), what="the rank pipes")
        return Tree(popen, state, pids, port, log_path, pipe_stem, dump_prefix)

    return start


@pytest.fixture
def start_decoy(reaper):
    """A process titled like a vLLM worker that is NOT in any target's tree."""

    def start(title: str | None = "VLLM::Worker_PP0", env: Mapping[str, str] | None = None) -> int:
        # setproctitle reuses the environ area, so /proc/PID/environ of a titled
        # process no longer shows its variables: title=None keeps them readable.
        code = "import signal, time\n"
        if title is not None:
            code += f"import setproctitle; setproctitle.setproctitle({title!r})\n"
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n"
        popen = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **(env or {})},
                                 stdin=subprocess.DEVNULL)
        reaper.add_popen(popen)
        if title is not None:
            wait_for(lambda: title in " ".join(psutil.Process(popen.pid).cmdline()), what="the decoy's title")
        return popen.pid

    return start


