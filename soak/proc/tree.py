"""The target's process tree: who belongs to it, learned over the run.

vLLM's engine core and workers are separate processes; when a parent is
SIGKILLed its children reparent and may keep spinning on the GPUs (vllm#55510).
So membership is learned over the run, not only at the moment of the kill:
``ProcessTree.snapshot()`` walks the children of the root *and* of every process
already known, on one table of the shared reader (``soak.proc.snapshots``), and
keeps each one with its start time so a PID the kernel hands to a stranger
later is never mistaken for ours.

Safety rules, applied on every path that records a process:
- never PID 0 or 1, the harness, or any ancestor of the harness;
- never a process without proof (a known ancestor, the marker, the cgroup;
  never a name or a title);
- a recorded PID whose start time no longer matches is someone else now.

The kill is ``soak.proc.kill``; what may be signalled, ``soak.proc.belonging``.
"""

from __future__ import annotations

import time
from typing import Iterable

import psutil

from soak.proc.facts import Member, Pin, ProcTable
from soak.proc.read import facts_of, protected_pids, running
from soak.proc.snapshots import ProcSnapshots


def member_of(pid: int, *, via: str, now: float, pin: Pin | None = None) -> Member | None:
    """``pid`` read now as a member found ``via``; None when gone or (with ``pin``) someone else now."""
    facts = facts_of(pid)
    if facts is None or (pin is not None and not pin.matches(facts.pid, facts.create_time)):
        return None
    return Member(facts, now, via)


class ProcessTree:
    """The record of every process seen in the target's tree over the run.

    ``reader``: the process's shared /proc reader; by default a private one that
    reads on every walk."""

    def __init__(self, *, reader: ProcSnapshots | None = None) -> None:
        self._reader = reader if reader is not None else ProcSnapshots(max_age_s=0)
        self._known: dict[int, Member] = {}
        self._root: Member | None = None

    @property
    def root(self) -> Member | None:
        return self._root

    def known(self) -> tuple[Member, ...]:
        return tuple(self._known.values())

    def snapshot(self, root_pid: int | None, *, now: float | None = None, fresh: bool = False) -> tuple[Member, ...]:
        """Walk the tree from the root and every known process; drop the dead.

        Returns the processes alive now. Protected PIDs are never recorded.
        ``fresh``: read /proc now rather than take the shared reader's latest table.
        """
        now = time.time() if now is None else now
        protected = protected_pids()
        self._adopt_root(root_pid, protected, now)
        if not self._known:
            return ()  # nothing known yet: no /proc pass
        table = self._reader.fresh() if fresh else self._reader.table()
        alive: dict[int, Member] = {}
        for member in list(self._known.values()):
            if _still_running(member, table):
                alive[member.pid] = member
            else:
                del self._known[member.pid]
        frontier = list(alive)
        while frontier:
            for child in table.children(frontier.pop()):
                if child.pid in alive or child.pid in protected:
                    continue
                member = member_of(child.pid, via="descendant", now=now, pin=child.pin)
                if member is None:
                    continue
                self._known[member.pid] = alive[member.pid] = member
                frontier.append(member.pid)
        return tuple(alive.values())

    def _adopt_root(self, root_pid: int | None, protected: frozenset[int], now: float) -> None:
        if root_pid is None or root_pid in protected:
            return
        if self._root is not None and self._root.pid == root_pid and not running(self._root.pin):
            return  # the root we knew died; a process now holding its number is a stranger
        current = self._known.get(root_pid)
        if current is not None and running(current.pin):
            if self._root is None or self._root.pid != root_pid:
                self._root = current
            return
        member = member_of(root_pid, via="root", now=now)
        if member is not None:
            self._root = self._known[root_pid] = member

    def watch(self, pid: int, *, create_time: float | None = None, now: float | None = None) -> Member | None:
        """Record ``pid`` as one more root (a server launched, or launched again);
        with ``create_time``, only if the PID still belongs to that process."""
        if pid in protected_pids():
            return None
        pin = Pin(pid, create_time) if create_time is not None else None
        member = member_of(pid, via="root", now=time.time() if now is None else now, pin=pin)
        if member is not None:
            self._known[pid] = member
        return member

    def claim(self, pid: int, *, via: str, marker: tuple[str, str] | None = None,
              now: float | None = None) -> Member | None:
        """Add ``pid`` if it provably belongs to the target; return its record or None.

        It belongs when it is already known, when one of its ancestors is known,
        or when its environment carries the target's ownership marker (which
        every descendant inherits, reparented or not).
        """
        if pid in protected_pids():
            return None
        known = self._known.get(pid)
        if known is not None:
            return known if running(known.pin) else None
        try:
            proc = psutil.Process(pid)
            parents = proc.parents()
        except psutil.Error:
            return None
        belongs = any(self._known.get(p.pid) is not None and running(self._known[p.pid].pin) for p in parents)
        if not belongs and marker is not None:
            try:
                belongs = proc.environ().get(marker[0]) == marker[1]
            except psutil.Error:
                belongs = False
        if not belongs:
            return None
        member = member_of(pid, via=via, now=time.time() if now is None else now)
        if member is not None:
            self._known[pid] = member
        return member

    def adopt(self, pids: Iterable[int], *, via: str, now: float | None = None) -> tuple[Member, ...]:
        """Record ``pids`` found by a proof the caller holds (the target's cgroup);
        protected PIDs never. ``decide`` judges them again before any signal."""
        now = time.time() if now is None else now
        protected = protected_pids()
        found = []
        for pid in pids:
            if pid in protected or pid in self._known:
                continue
            member = member_of(pid, via=via, now=now)
            if member is not None:
                self._known[pid] = member
                found.append(member)
        return tuple(found)

    def find_marked(self, marker: tuple[str, str], *, now: float | None = None) -> tuple[Member, ...]:
        """Every live process whose environment carries the ownership marker."""
        now = time.time() if now is None else now
        protected = protected_pids()
        found = []
        for proc in psutil.process_iter():
            if proc.pid in protected or proc.pid in self._known:
                continue
            try:
                if proc.environ().get(marker[0]) != marker[1]:
                    continue
            except psutil.Error:
                continue
            member = member_of(proc.pid, via="marker", now=now)
            if member is not None:
                self._known[member.pid] = member
                found.append(member)
        return tuple(found)

    def pins(self) -> frozenset[Pin]:
        """Every recorded process by PID and start time: the members ``decide`` accepts."""
        return frozenset(member.pin for member in self._known.values())

    def forget_dead(self) -> None:
        for member in list(self._known.values()):
            if not running(member.pin):
                del self._known[member.pid]


def _still_running(member: Member, table: ProcTable) -> bool:
    facts = table.procs.get(member.pid)
    if facts is not None and member.pin.matches(facts.pid, facts.create_time):
        return not facts.zombie
    # Not in the table as recorded: gone, or recorded after the shared table was read. Asked on its own.
    return running(member.pin)


def merge(*groups: Iterable[Member]) -> tuple[Member, ...]:
    """One record per PID, first seen wins."""
    out: dict[int, Member] = {}
    for group in groups:
        for member in group:
            out.setdefault(member.pid, member)
    return tuple(out.values())


__all__ = ["ProcessTree", "member_of", "merge"]
