"""The harness's heap does not creep: glibc's thresholds fixed at the start of `soak run`."""

from __future__ import annotations

import platform
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from soak.run.heap import (
    M_MMAP_THRESHOLD,
    M_TRIM_THRESHOLD,
    READ_SIZE,
    HeapTrimmer,
    bound_heap_growth,
    bound_read_size,
)

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


def _run_script(script: str, mode: str) -> int:
    """The number a script prints, run in a fresh process as ``mode``."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}  # no MALLOC_* knobs from the caller
    done = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@glibc_only
def test_big_transient_buffers_go_back_to_the_system_once_tuned() -> None:
    untuned, tuned = _run_script(CHURN, "untuned"), _run_script(CHURN, "tuned")
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


class _Transport:
    max_size = 256 * 1024


def test_both_thresholds_are_fixed_and_said() -> None:
    libc = _Libc()
    tuning = bound_heap_growth(environ={}, libc=lambda: libc, mmap_threshold=4096, trim_threshold=8192,
                               transport=lambda: _Transport)
    assert tuning.applied and "4096" in tuning.reason
    assert libc.calls == [(M_MMAP_THRESHOLD, 4096), (M_TRIM_THRESHOLD, 8192)]
    # a socket read must stay under the mmap threshold, or every read is an mmap
    assert _Transport.max_size == 2048 and "socket reads 2048 B" in tuning.reason


def test_a_python_without_the_read_knob_is_still_tuned_and_says_so() -> None:
    class Renamed:
        pass

    tuning = bound_heap_growth(environ={}, libc=_Libc, transport=lambda: Renamed)
    assert tuning.applied and "socket reads left as they are" in tuning.reason
    assert bound_read_size(1024, transport=lambda: None) is None


# A soak's client, shrunk: an asyncio stream of small SSE-sized writes over
# loopback, read by a protocol (as aiohttp's is). Prints the minor page faults
# the reading took.
READS = """
import asyncio, resource, sys
from soak.run.heap import bound_heap_growth
if sys.argv[1] != "untuned":
    assert bound_heap_growth(environ={}).applied
if sys.argv[1] == "thresholds-only":  # undo the read bound: asyncio's own 256 KiB
    import asyncio.selector_events as se
    se._SelectorSocketTransport.max_size = 256 * 1024
async def main():
    async def serve(reader, writer):
        for i in range(3000):
            writer.write(b'data: {"choices":[{"delta":{"content":" tok"}}]}\\n\\n')
            await writer.drain()
            await asyncio.sleep(0)
        writer.close()
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    done = asyncio.get_running_loop().create_future()
    class Client(asyncio.Protocol):
        def data_received(self, data): pass
        def connection_lost(self, exc): done.set_result(None)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    await asyncio.get_running_loop().create_connection(Client, "127.0.0.1", port)
    await done
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    server.close()
asyncio.run(main())
"""


@glibc_only
def test_streamed_reads_do_not_fault_a_fresh_mapping_each_once_tuned() -> None:
    with_bound, thresholds_only = _run_script(READS, "tuned"), _run_script(READS, "thresholds-only")
    # Without the read bound, each of the ~3000 reads maps 256 KiB and faults its pages.
    assert thresholds_only > 2_000, thresholds_only
    assert with_bound < thresholds_only / 4, (with_bound, thresholds_only)


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
    refused = bound_heap_growth(environ={}, libc=lambda: _Libc(answer=0), transport=lambda: _Transport)
    assert not refused.applied and "refused" in refused.reason


def test_a_refused_trim_threshold_still_bounds_the_reads_under_the_fixed_mmap_one() -> None:
    class Transport:
        max_size = 256 * 1024

    class TrimRefused(_Libc):
        def mallopt(self, param: int, value: int) -> int:
            super().mallopt(param, value)
            return 0 if param == M_TRIM_THRESHOLD else 1

    tuning = bound_heap_growth(environ={}, libc=TrimRefused, transport=lambda: Transport)
    assert tuning.applied and "trim threshold refused" in tuning.reason
    assert Transport.max_size == READ_SIZE


# A heap with its free space between live objects: 60 MB of 2000-byte objects
# (malloc's, over pymalloc's 512 bytes), all but every 16th freed. The holes
# hold whole pages the heap's top trim never reaches. Prints RSS (KB) freed by
# one trim.
HOLES = """
import sys
from soak.run.heap import bound_heap_growth
tuning = bound_heap_growth(environ={})
assert tuning.applied and tuning.trimmer is not None
def rss_kb():
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS"))
objects = [b"h" * 2000 + i.to_bytes(4, "little") for i in range(30_000)]
kept = objects[::16]
del objects
before = rss_kb()
tuning.trimmer.trim_once()
print(before - rss_kb())
"""


@glibc_only
def test_one_trim_hands_the_free_pages_between_live_objects_back() -> None:
    # about 56 MB lies free in the holes; whole pages of it go back
    assert _run_script(HOLES, "tuned") > 30_000


class _TrimmingLibc(_Libc):
    def __init__(self) -> None:
        super().__init__()
        self.trims: list[int] = []

    def malloc_trim(self, pad: int) -> int:
        self.trims.append(pad)
        return 1


def test_the_tuning_makes_a_trimmer_where_libc_has_malloc_trim_and_says_so() -> None:
    libc = _TrimmingLibc()
    tuning = bound_heap_growth(environ={}, libc=lambda: libc, trim_interval=30, transport=lambda: _Transport)
    assert tuning.trimmer is not None and tuning.trimmer.interval == 30
    assert "free pages returned every 30 s" in tuning.reason
    tuning.trimmer.trim_once()
    assert libc.trims == [0]
    without = bound_heap_growth(environ={}, libc=_Libc, transport=lambda: _Transport)
    assert without.applied and without.trimmer is None and "no malloc_trim" in without.reason


def test_the_trimmer_trims_on_its_own_thread_until_closed() -> None:
    trimmed = threading.Event()
    calls: list[str] = []

    def trim(pad: int) -> int:
        calls.append(threading.current_thread().name)
        trimmed.set()
        return 1

    trimmer = HeapTrimmer(trim, interval=0.001)
    trimmer.start()
    trimmer.start()  # once: one thread
    assert trimmed.wait(10)
    trimmer.close()
    made = len(calls)
    assert set(calls) == {"soak-heap-trim"}
    assert not any(t.name == "soak-heap-trim" for t in threading.enumerate())  # joined
    trimmer.close()  # idempotent
    trimmer.start()  # a closed trimmer stays closed
    assert len(calls) == made and not any(t.name == "soak-heap-trim" for t in threading.enumerate())
