"""Invariant: every fact of a process in a table comes from one life of it.

A PID can die and be reused while /proc is read. The full pass reads several
files per PID (stat, then the command line and environment marker, then stat
again): a process whose start moved between the two stat reads is left out,
since its marker could be the dead process's and its start the new one's, and
a pin built from both would aim the target's kill at a stranger. The light pass
takes ppid, state and start from one read of one file. Reuse is played by an
injected stat reader over the box's real processes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soak.proc.facts import MARKER_VARIABLE
from soak.proc.read import Stat, facts_of, parse_stat, read_stat, read_table

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="stat lines come from /proc")


@pytest.fixture
def marked_child():
    """A real child carrying a target's environment marker."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, MARKER_VARIABLE: "run-one-life"})
    yield child.pid
    child.kill()
    child.wait()


class ReusingStats:
    """/proc/PID/stat as the box has it, except that each PID in ``reused`` reads as
    a later process on every read after its first (the PID was reused mid-pass)."""

    def __init__(self, reused: set[int], *, ppid_shift: int = 0):
        self.reused, self.ppid_shift = reused, ppid_shift
        self.reads: dict[int, list[Stat]] = {}

    def __call__(self, pid: int) -> Stat | None:
        stat = read_stat(pid)
        if stat is None:
            return None
        seen = self.reads.setdefault(pid, [])
        if pid in self.reused and seen:
            stat = Stat(state="S", ppid=stat.ppid + 1, start_ticks=stat.start_ticks + 100 * len(seen))
        stat = Stat(state=stat.state, ppid=stat.ppid + self.ppid_shift, start_ticks=stat.start_ticks)
        seen.append(stat)
        return stat


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_pid_reused_mid_read_is_left_out_of_the_full_table(marked_child, data):
    pids = sorted(set(psutil.pids()) - {os.getpid()})
    # Positions, not PIDs: the box's PIDs change between examples, and a strategy
    # drawn from them would not replay.
    picks = data.draw(st.lists(st.integers(0, 10**6), max_size=8), label="reused positions")
    reused = {pids[i % len(pids)] for i in picks}
    if data.draw(st.booleans(), label="the marked child reused"):
        reused.add(marked_child)
    stats = ReusingStats(reused)
    table = read_table(stat_of=stats)
    assert not reused & set(table.procs), "a process read across two lives is in the table"
    assert marked_child in table.procs or marked_child in reused
    for pid, facts in table.procs.items():
        first, last = stats.reads[pid][0], stats.reads[pid][-1]
        assert first.start_ticks == last.start_ticks
        assert facts.create_time == first.started_s() and facts.ppid == first.ppid
    if marked_child not in reused:
        assert table.procs[marked_child].marker == "run-one-life"
        assert table.procs[marked_child].ppid == os.getpid()


def test_facts_of_a_pid_reused_while_it_was_read_are_none(marked_child):
    assert facts_of(marked_child, stat_of=ReusingStats(set())).ppid == os.getpid()
    assert facts_of(marked_child, stat_of=ReusingStats({marked_child})) is None


def test_the_light_pass_takes_ppid_and_start_from_one_read(marked_child):
    # A stat reader whose ppid is off by 7: the light table's ppids are exactly its
    # reads, so nothing was taken from a second, separate read of another file.
    stats = ReusingStats(set(), ppid_shift=7)
    table = read_table(full=False, stat_of=stats)
    assert table.procs[marked_child].ppid == os.getpid() + 7
    assert all(len(reads) == 1 for reads in stats.reads.values())
    for pid, facts in table.procs.items():
        assert (facts.ppid, facts.create_time) == (stats.reads[pid][0].ppid, stats.reads[pid][0].started_s())


_COMM = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\n"), max_size=16)


@given(comm=_COMM, state=st.sampled_from("RSDZTtXI"), ppid=st.integers(0, 2**22),
       ticks=st.integers(0, 2**62))
def test_state_ppid_and_start_are_read_after_the_last_parenthesis(comm, state, ppid, ticks):
    fields = [state, str(ppid), "1", "1", "0", "-1", "4194304"] + ["0"] * 12 + [str(ticks), "1000", "200"]
    stat = parse_stat(f"4242 ({comm}) " + " ".join(fields) + "\n")
    assert (stat.state, stat.ppid, stat.start_ticks) == (state, ppid, ticks)


def test_a_real_stat_line_matches_psutil():
    me = read_stat(os.getpid())
    assert me is not None and me.ppid == os.getppid() and me.state in "RS"
    assert read_stat(2**31 - 1) is None  # no such PID
