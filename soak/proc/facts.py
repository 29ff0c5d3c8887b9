"""What /proc says about processes, as plain records: pure, no reads here.

One identity (``Pin``: a PID and its start time, seconds since boot), one facts record
(``ProcFacts``), one snapshot of the box (``ProcTable``) with the walks every
user of it needs (ancestors, true parent, descendants, listeners). The reading
is ``soak.proc.read``; the decision whether a PID may be signalled is
``soak.proc.belonging``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Mapping

# A start time is seconds since boot (soak.proc.read: /proc/PID/stat's clock ticks,
# which no wall-clock step moves); the same process always reads within this of itself.
SAME_START_S = 0.05
# The ownership marker every process of a launched target inherits in its environment.
MARKER_VARIABLE = "SOAK_TARGET_ID"
# Beside the marker: the harness that set it (PID@start time), so a later run can
# tell a leftover (its harness gone) from another live run's server.
OWNER_VARIABLE = "SOAK_TARGET_OWNER"


@dataclass(frozen=True)
class Pin:
    """A process by PID and start time: the same PID with another start time is someone else."""

    pid: int
    create_time: float

    def matches(self, pid: int, create_time: float) -> bool:
        return pid == self.pid and abs(create_time - self.create_time) <= SAME_START_S


@dataclass(frozen=True)
class ProcFacts:
    """What /proc says about one process, as far as this user may read it. A light
    reading (``read_table(full=False)``) fills only pid, ppid, create_time and zombie."""

    pid: int
    ppid: int
    create_time: float
    cmdline: tuple[str, ...] = ()
    name: str = ""
    sid: int | None = None
    # The ownership marker's variables in its environment (None: absent or unreadable).
    marker: str | None = None
    owner: str | None = None
    # TCP ports it listens on, and the ports of local listeners it has connections to.
    listens: frozenset[int] = frozenset()
    dials: frozenset[int] = frozenset()
    # Its cgroup v2 name (None: no v2 hierarchy or not readable).
    cgroup: str | None = None
    # Its PID namespace (the link /proc/PID/ns/pid names; None: not readable). An owner
    # stamp ``PID@START`` means that PID only inside the namespace it was written in.
    pid_ns: str | None = None
    # Its time namespace (/proc/PID/ns/time): start ticks since boot read from another
    # one carry that namespace's boot-time offset, so its stamps do not compare here.
    time_ns: str | None = None
    pgid: int | None = None
    zombie: bool = False

    @property
    def pin(self) -> Pin:
        return Pin(self.pid, self.create_time)


@dataclass(frozen=True)
class Member:
    """One process of the target: its facts when first seen, when, and how it was
    found (root, descendant, gpu, marker, cgroup, session, leftover)."""

    facts: ProcFacts
    first_seen: float
    via: str

    pid = property(lambda self: self.facts.pid)
    ppid = property(lambda self: self.facts.ppid)
    create_time = property(lambda self: self.facts.create_time)
    name = property(lambda self: self.facts.name)
    cmdline = property(lambda self: self.facts.cmdline)
    pgid = property(lambda self: self.facts.pgid)
    sid = property(lambda self: self.facts.sid)

    @property
    def pin(self) -> Pin:
        return self.facts.pin

    def to_json(self) -> dict:
        return {
            "pid": self.pid,
            "ppid": self.ppid,
            "started_since_boot_s": self.create_time,
            "name": self.name,
            "cmdline": list(self.cmdline),
            "pgid": self.pgid,
            "sid": self.sid,
            "first_seen": self.first_seen,
            "via": self.via,
        }


@dataclass(frozen=True)
class ProcTable:
    """One snapshot of the box: every visible process, and who reads it (``me``)."""

    me: int
    procs: Mapping[int, ProcFacts]
    # Ports whose listener this user cannot see (another user's process).
    unseen_listeners: frozenset[int] = frozenset()
    # Start times are seconds since boot (procfs); False: psutil's wall-clock figure.
    boot_clock: bool = True

    @cached_property
    def _children(self) -> Mapping[int, tuple[ProcFacts, ...]]:
        by_parent: dict[int, list[ProcFacts]] = {}
        for facts in self.procs.values():
            by_parent.setdefault(facts.ppid, []).append(facts)
        return {ppid: tuple(kids) for ppid, kids in by_parent.items()}

    def ancestors(self, pid: int) -> tuple[int, ...]:
        out: list[int] = []
        seen = {pid}
        cur = self.procs.get(pid)
        while cur is not None and cur.ppid not in seen and cur.ppid > 0:
            out.append(cur.ppid)
            seen.add(cur.ppid)
            cur = self.procs.get(cur.ppid)
        return tuple(out)

    def protected(self) -> frozenset[int]:
        """PIDs no signal may ever reach: 0, 1, the reader itself and its ancestors."""
        return frozenset({0, 1, self.me, *self.ancestors(self.me)})

    def parent_of(self, facts: ProcFacts) -> ProcFacts | None:
        """The parent, when it is truly the parent (not a newer process holding the number)."""
        parent = self.procs.get(facts.ppid)
        if parent is None or parent.pid == facts.pid or parent.create_time > facts.create_time + SAME_START_S:
            return None
        return parent

    def lineage(self, facts: ProcFacts) -> Iterable[ProcFacts]:
        """The process itself, then each true ancestor."""
        seen: set[int] = set()
        cur: ProcFacts | None = facts
        while cur is not None and cur.pid not in seen:
            seen.add(cur.pid)
            yield cur
            cur = self.parent_of(cur)

    def children(self, pid: int) -> tuple[ProcFacts, ...]:
        """The true children of ``pid`` (a "child" older than its parent holds a reused PID)."""
        parent = self.procs.get(pid)
        if parent is None:
            return ()
        return tuple(c for c in self._children.get(pid, ()) if self.parent_of(c) is parent)

    def descendants(self, pid: int) -> frozenset[int]:
        """``pid`` and every true descendant; empty when ``pid`` is not in the table."""
        if pid not in self.procs:
            return frozenset()
        out = {pid}
        frontier = [pid]
        while frontier:
            for child in self.children(frontier.pop()):
                if child.pid not in out:
                    out.add(child.pid)
                    frontier.append(child.pid)
        return frozenset(out)

    def running(self, pin: Pin) -> bool:
        """The pinned process is in the table, with its start time, and not a zombie."""
        facts = self.procs.get(pin.pid)
        return facts is not None and pin.matches(facts.pid, facts.create_time) and not facts.zombie

    def listeners(self, port: int) -> tuple[ProcFacts, ...]:
        return tuple(f for f in self.procs.values() if port in f.listens)


# An owner stamp's start time on the boot clock reads ``PID@b<seconds>``: a harness
# from before soak pinned by ticks since boot wrote ``PID@<wall seconds>`` and reads
# every stamp as wall seconds, so the tag makes a new stamp unreadable to it (it
# leaves the process alone) rather than "a harness that is gone" (it would kill a
# live run's server).
BOOT_CLOCK_TAG = "b"


def owner_stamp(pid: int, create_time: float, *, boot_clock: bool = True) -> str:
    """``PID@START`` of a harness, START tagged with the clock it is on (see BOOT_CLOCK_TAG)."""
    return f"{pid}@{BOOT_CLOCK_TAG if boot_clock else ''}{create_time:.3f}"


__all__ = ["BOOT_CLOCK_TAG", "MARKER_VARIABLE", "Member", "OWNER_VARIABLE", "Pin", "ProcFacts", "ProcTable",
           "SAME_START_S", "owner_stamp"]
