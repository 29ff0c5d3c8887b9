"""``soak_peak_rss(*args, cwd=..., timeout_s=120)`` runs ``python -m soak *args``
and returns its exit status, its peak RSS (KiB) and its stderr: how the tests
show an input from outside cannot take the harness's memory. The peak is
``ru_maxrss`` of RUSAGE_CHILDREN in a wrapper process, so it is the largest of
the command's tree (the harness and whatever it waited for), not this test
process's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_MEASURE = ("import resource, subprocess, sys\n"
            "done = subprocess.run(sys.argv[2:], capture_output=True, text=True, timeout=float(sys.argv[1]))\n"
            "sys.stderr.write(done.stderr)\n"
            "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")


def soak_peak_rss(*args: str, cwd: Path, timeout_s: float = 120) -> tuple[int, int, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # The wrapper's limit comes first: it kills the soak it started, which a kill of the wrapper would orphan.
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(timeout_s), sys.executable, "-m", "soak", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s + 60)
    code, rss = done.stdout.split()[-2:]
    return int(code), int(rss), done.stderr
