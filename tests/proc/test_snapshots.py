"""The one /proc reader: users within its staleness bound share a pass; the kill
paths' fresh and full reads never come from the cache; the process probe and the
responder's tree record, given one reader, make one pass between them."""

from __future__ import annotations

import subprocess
import sys
import threading

from soak.clock import ManualClock
from soak.probes.target import ProcessProbe
from soak.proc.facts import ProcFacts, ProcTable
from soak.proc.snapshots import ProcSnapshots
from soak.proc.tree import ProcessTree


def counting(table: ProcTable | None = None):
    calls = []

    def read() -> ProcTable:
        calls.append(1)
        return table if table is not None else ProcTable(me=99, procs={99: ProcFacts(99, 1, 0.0)})

    return read, calls


def test_two_users_within_the_bound_share_one_pass_and_a_later_one_reads_again() -> None:
    clock = ManualClock()
    read, calls = counting()
    reader = ProcSnapshots(max_age_s=1.0, clock=clock, read_light=read)
    first = reader.table()
    clock.advance(0.6)
    second = reader.table()
    assert second is first and len(calls) == 1 and reader.passes == 1
    clock.advance(0.6)  # 1.2 s after the pass: stale
    reader.table()
    assert len(calls) == 2 and reader.passes == 2


def test_a_fresh_or_full_read_never_comes_from_the_cache_and_fresh_feeds_the_others() -> None:
    clock = ManualClock()
    light, light_calls = counting()
    full, full_calls = counting()
    reader = ProcSnapshots(max_age_s=5.0, clock=clock, read_light=light, read_full=full)
    reader.table()
    reader.fresh()
    assert len(light_calls) == 2
    reader.table()  # the fresh table is the latest: shared
    assert len(light_calls) == 2
    reader.full()
    reader()
    assert len(full_calls) == 2 and reader.passes == 4


def test_concurrent_users_in_threads_share_a_pass() -> None:
    clock = ManualClock()
    read, calls = counting()
    reader = ProcSnapshots(max_age_s=1.0, clock=clock, read_light=read)
    threads = [threading.Thread(target=reader.table) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1


async def test_the_process_probe_and_the_tree_record_share_one_pass_of_one_reader() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
         "print(p.pid, flush=True)\ntime.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True,
    )
    grandchild = None
    try:
        grandchild = int(child.stdout.readline())
        reader = ProcSnapshots(max_age_s=1.0, clock=ManualClock())
        probe = ProcessProbe(child.pid, clock=ManualClock(), proc=reader)
        tree = ProcessTree(reader=reader)
        (sample,) = await probe.collect()
        members = tree.snapshot(child.pid)
        assert sample.alive and grandchild in sample.tree_pids
        assert {m.pid for m in members} == {child.pid, grandchild}
        assert reader.passes == 1
    finally:
        child.kill()
        child.wait(30)
        if grandchild is not None:
            import os
            import signal
            try:
                os.kill(grandchild, signal.SIGKILL)
            except ProcessLookupError:
                pass


async def test_a_root_born_after_the_shared_table_is_not_read_as_dead() -> None:
    # A restart's new root is younger than the table the others share: a stale
    # table must not make the process probe report it gone (a false incident).
    reader = ProcSnapshots(max_age_s=60.0, clock=ManualClock())
    reader.table()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (sample,) = await ProcessProbe(child.pid, clock=ManualClock(), proc=reader).collect()
        assert sample.alive and reader.passes == 2
    finally:
        child.kill()
        child.wait(30)
