"""Property: the tree walk over one snapshot returns exactly the root's subtree.

Tables are generated with numbers reused (a "child" older than the process now
holding its parent's number is an orphan of someone else), parent links that
form cycles, links to PIDs not in the table, and zombies. The reference walks
each process's parent links upward, which is what "descends from" means; the
walk under test goes downward from the root.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from soak.probes.target import process_state
from soak.proc.facts import SAME_START_S, ProcFacts, ProcTable


@st.composite
def tables(draw):
    n = draw(st.integers(1, 40))
    pids = draw(st.lists(st.integers(2, 60), min_size=n, max_size=n, unique=True))
    procs = {}
    for pid in pids:
        ppid = draw(st.one_of(st.sampled_from(pids), st.integers(0, 70)))  # also itself, also absent
        start = draw(st.sampled_from([0.0, 1.0, 1.0 + SAME_START_S / 2, 2.0, 5.0, 9.0]))
        procs[pid] = ProcFacts(pid=pid, ppid=ppid, create_time=start, zombie=draw(st.booleans()))
    root = draw(st.one_of(st.sampled_from(pids), st.integers(2, 70)))
    return ProcTable(me=1, procs=procs), root


def descends_from(table: ProcTable, pid: int, root: int) -> bool:
    """Up the true-parent links from ``pid`` (a parent no older than its child,
    within the same-start tolerance), stopping at a loop."""
    seen = set()
    cur = table.procs.get(pid)
    while cur is not None and cur.pid not in seen:
        if cur.pid == root:
            return True
        seen.add(cur.pid)
        parent = table.procs.get(cur.ppid)
        if parent is None or parent.pid == cur.pid or parent.create_time > cur.create_time + SAME_START_S:
            return False
        cur = parent
    return False


@settings(max_examples=100, deadline=None)
@given(tables())
def test_the_walk_returns_every_descendant_and_nothing_outside_the_subtree(case) -> None:
    table, root = case
    walked = table.descendants(root)
    if root not in table.procs:
        assert walked == frozenset()
        return
    expected = {pid for pid in table.procs if descends_from(table, pid, root)}
    assert walked == expected
    assert root in walked


@settings(max_examples=100, deadline=None)
@given(tables())
def test_the_process_probe_reads_the_subtree_below_a_live_root(case) -> None:
    table, root = case
    state = process_state(root, table)
    facts = table.procs.get(root)
    if facts is None:
        assert state is None  # not in this table: the probe asks the process itself
    elif facts.zombie:
        assert state == (False, ())
    else:
        assert state == (True, tuple(sorted(table.descendants(root) - {root})))
