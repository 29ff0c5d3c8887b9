"""The harness's heap does not creep: glibc's thresholds fixed at the start of `soak run`."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from soak.run.heap import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, bound_heap_growth

ROOT = Path(__file__).resolve().parents[2]
glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc")

# What a soak's client does to the heap, shrunk: bodies of 100 KB-1 MB of any
# size, a few in flight, freed in any order, while small objects (over
# pymalloc's 512 bytes, so malloc's) are made and kept for a while.
CHURN = """
import random, sys
from soak.run.heap import bound_heap_growth
if sys.argv[1] == "tuned":
    assert bound_heap_growth(environ={}).applied
def rss_kb():
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS"))
rng = random.Random(1)
kept, in_flight = [], []
before = rss_kb()
for _ in range(4000):
    in_flight.append(b"x" * rng.randint(100_000, 1_000_000))
    if len(in_flight) > 8:
        in_flight.pop(rng.randrange(len(in_flight)))
    kept.append(b"k" * rng.randint(600, 3000))
    if len(kept) > 1500:
        kept.pop(rng.randrange(len(kept)))
in_flight.clear()
print(rss_kb() - before)
"""


def _growth_kb(mode: str) -> int:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}  # no MALLOC_* knobs from the caller
    done = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@glibc_only
def test_big_transient_buffers_go_back_to_the_system_once_tuned() -> None:
    untuned, tuned = _growth_kb("untuned"), _growth_kb("tuned")
    # Untuned, the freed bodies stay as holes in the heap around the kept objects
    # (about 13 MB here); tuned, only the kept objects remain (about 3 MB).
    assert untuned > 8_000, untuned
    assert tuned < untuned / 2, (tuned, untuned)


class _Libc:
    def __init__(self, answer: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self._answer = answer

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self._answer


def test_both_thresholds_are_fixed_and_said() -> None:
    libc = _Libc()
    tuning = bound_heap_growth(environ={}, libc=lambda: libc, mmap_threshold=4096, trim_threshold=8192)
    assert tuning.applied and "4096" in tuning.reason
    assert libc.calls == [(M_MMAP_THRESHOLD, 4096), (M_TRIM_THRESHOLD, 8192)]


@pytest.mark.parametrize("environ", [
    {"MALLOC_MMAP_THRESHOLD_": "1048576"},
    {"MALLOC_TRIM_THRESHOLD_": "0"},
    {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"},
])
def test_a_user_who_tuned_malloc_keeps_it(environ) -> None:
    libc = _Libc()
    tuning = bound_heap_growth(environ=environ, libc=lambda: libc)
    assert not tuning.applied and "environment" in tuning.reason
    assert libc.calls == []


def test_another_libc_or_a_refusal_leaves_malloc_alone() -> None:
    assert not bound_heap_growth(environ={}, libc=lambda: None).applied
    assert not bound_heap_growth(environ={}, libc=lambda: object()).applied  # no mallopt at all
    refused = bound_heap_growth(environ={}, libc=lambda: _Libc(answer=0))
    assert not refused.applied and "refused" in refused.reason
