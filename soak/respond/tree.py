"""The target's process tree: who belongs to it, and how to SIGKILL all of it.

vLLM's engine core and workers are separate processes; when a parent is
SIGKILLed its children reparent and may keep spinning on the GPUs (vllm#55510).
So membership is learned over the run, not only at the moment of the kill:
``ProcessTree.snapshot()`` walks the children of the root *and* of every process
already known, and keeps each one with its ``create_time`` so a PID the kernel
hands to a stranger later is never mistaken for ours.

Safety rules, applied on every path that sends a signal:
- never PID 0 or 1, the harness, or any ancestor of the harness;
- never a process that is not in the record (never by name or title);
- a recorded PID whose create_time no longer matches is someone else now.

The kill freezes the whole set with SIGSTOP first (so nothing forks or respawns
while we work), picks up children forked in the meantime, then sends SIGKILL
to every frozen process and waits, bounded, until each is gone (a zombie
counts as gone: it holds no memory and runs nothing).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

import psutil

from soak.respond.belonging import (
    KillDecision,
    Pin,
    ProcReader,
    ProcTable,
    Proof,
    Reason,
    TargetIdentity,
    decide,
    read_table,
)

# psutil derives create_time from the boot time and /proc/PID/stat; the same
# process always reads within this of itself.
_SAME_START_S = 0.05


@dataclass(frozen=True)
class ProcInfo:
    """One process of the target, as first seen."""

    pid: int
    create_time: float
    ppid: int
    name: str
    cmdline: tuple[str, ...]
    pgid: int | None
    sid: int | None
    first_seen: float
    # How it was found: root, descendant, gpu, marker, port.
    via: str

    def to_json(self) -> dict:
        return {
            "pid": self.pid,
            "ppid": self.ppid,
            "create_time": self.create_time,
            "name": self.name,
            "cmdline": list(self.cmdline),
            "pgid": self.pgid,
            "sid": self.sid,
            "first_seen": self.first_seen,
            "via": self.via,
        }


def protected_pids() -> frozenset[int]:
    """PIDs no signal may ever reach: 0, 1, the harness and its ancestors."""
    me = psutil.Process()
    pids = {0, 1, me.pid}
    try:
        pids.update(p.pid for p in me.parents())
    except psutil.Error:
        pass
    return frozenset(pids)


def _info(proc: psutil.Process, *, via: str, now: float) -> ProcInfo | None:
    try:
        with proc.oneshot():
            create_time = proc.create_time()
            ppid = proc.ppid()
            name = proc.name()
            try:
                # setproctitle pads the title with empty arguments
                cmdline = tuple(proc.cmdline())
                while cmdline and not cmdline[-1]:
                    cmdline = cmdline[:-1]
                cmdline = cmdline[:16]
            except psutil.AccessDenied:
                cmdline = ()
        pgid = _safe(os.getpgid, proc.pid)
        sid = _safe(os.getsid, proc.pid)
    except psutil.Error:
        return None
    return ProcInfo(proc.pid, create_time, ppid, name, cmdline, pgid, sid, now, via)


def _safe(fn, pid: int) -> int | None:
    try:
        return fn(pid)
    except OSError:
        return None


def same_process(info: ProcInfo) -> psutil.Process | None:
    """The live process ``info`` describes, or None (gone, a zombie, or the PID reused)."""
    try:
        proc = psutil.Process(info.pid)
        if abs(proc.create_time() - info.create_time) > _SAME_START_S:
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None


def _children_by_parent() -> dict[int, list[psutil.Process]]:
    """Every process by its parent's PID, from one pass over ``/proc``.

    ``psutil.Process.children()`` makes that pass once per call: for a tree of a
    dozen processes, walked every half second by the guardian, it was most of
    the guardian's CPU."""
    by_parent: dict[int, list[psutil.Process]] = {}
    for proc in psutil.process_iter(["ppid"]):
        ppid = proc.info.get("ppid")
        if ppid is not None:
            by_parent.setdefault(ppid, []).append(proc)
    return by_parent


def _children(parent: psutil.Process, children_of: dict[int, list[psutil.Process]]) -> list[psutil.Process]:
    try:
        born = parent.create_time()
    except psutil.Error:
        return []
    out = []
    for child in children_of.get(parent.pid, ()):
        try:
            # A "child" older than its parent holds a reused PID, as psutil's own children() reasons.
            if child.create_time() >= born:
                out.append(child)
        except psutil.Error:
            continue
    return out


class ProcessTree:
    """The record of every process seen in the target's tree over the run."""

    def __init__(self) -> None:
        self._known: dict[int, ProcInfo] = {}
        self._root: ProcInfo | None = None

    @property
    def root(self) -> ProcInfo | None:
        return self._root

    def known(self) -> tuple[ProcInfo, ...]:
        return tuple(self._known.values())

    def snapshot(self, root_pid: int | None, *, now: float | None = None) -> tuple[ProcInfo, ...]:
        """Walk the tree from the root and every known process; drop the dead.

        Returns the processes alive now. Protected PIDs are never recorded.
        """
        now = time.time() if now is None else now
        protected = protected_pids()
        self._adopt_root(root_pid, protected, now)
        alive: dict[int, tuple[ProcInfo, psutil.Process]] = {}
        for info in list(self._known.values()):
            proc = same_process(info)
            if proc is None:
                del self._known[info.pid]
            else:
                alive[info.pid] = (info, proc)
        children_of = _children_by_parent() if alive else {}  # nothing known yet: no /proc pass
        frontier = [proc for _, proc in alive.values()]
        while frontier:
            proc = frontier.pop()
            for child in _children(proc, children_of):
                if child.pid in alive or child.pid in protected:
                    continue
                info = _info(child, via="descendant", now=now)
                if info is None:
                    continue
                self._known[info.pid] = info
                alive[info.pid] = (info, child)
                frontier.append(child)
        return tuple(info for info, _ in alive.values())

    def _adopt_root(self, root_pid: int | None, protected: frozenset[int], now: float) -> None:
        if root_pid is None or root_pid in protected:
            return
        if self._root is not None and self._root.pid == root_pid and same_process(self._root) is None:
            return  # the root we knew died; a process now holding its number is a stranger
        current = self._known.get(root_pid)
        if current is not None and same_process(current) is not None:
            if self._root is None or self._root.pid != root_pid:
                self._root = current
            return
        try:
            info = _info(psutil.Process(root_pid), via="root", now=now)
        except psutil.Error:
            return
        if info is not None:
            self._root = info
            self._known[root_pid] = info

    def watch(self, pid: int, *, create_time: float | None = None, now: float | None = None) -> ProcInfo | None:
        """Record ``pid`` as one more root (a server launched, or launched again);
        with ``create_time``, only if the PID still belongs to that process."""
        now = time.time() if now is None else now
        if pid in protected_pids():
            return None
        try:
            info = _info(psutil.Process(pid), via="root", now=now)
        except psutil.Error:
            return None
        if info is None or (create_time is not None and abs(info.create_time - create_time) > _SAME_START_S):
            return None  # gone, or the PID is someone else's already
        self._known[pid] = info
        return info

    def claim(self, pid: int, *, via: str, marker: tuple[str, str] | None = None,
              now: float | None = None) -> ProcInfo | None:
        """Add ``pid`` if it provably belongs to the target; return its record or None.

        It belongs when it is already known, when one of its ancestors is known,
        or when its environment carries the target's ownership marker (which
        every descendant inherits, reparented or not).
        """
        now = time.time() if now is None else now
        if pid in protected_pids():
            return None
        known = self._known.get(pid)
        if known is not None:
            return known if same_process(known) is not None else None
        try:
            proc = psutil.Process(pid)
        except psutil.Error:
            return None
        belongs = False
        try:
            for parent in proc.parents():
                info = self._known.get(parent.pid)
                if info is not None and same_process(info) is not None:
                    belongs = True
                    break
        except psutil.Error:
            return None
        if not belongs and marker is not None:
            try:
                belongs = proc.environ().get(marker[0]) == marker[1]
            except psutil.Error:
                belongs = False
        if not belongs:
            return None
        info = _info(proc, via=via, now=now)
        if info is not None:
            self._known[pid] = info
        return info

    def adopt(self, pids: Iterable[int], *, via: str, now: float | None = None) -> tuple[ProcInfo, ...]:
        """Record ``pids`` found by a proof the caller holds (the target's cgroup);
        protected PIDs never. ``decide`` judges them again before any signal."""
        now = time.time() if now is None else now
        protected = protected_pids()
        found = []
        for pid in pids:
            if pid in protected or pid in self._known:
                continue
            try:
                info = _info(psutil.Process(pid), via=via, now=now)
            except psutil.Error:
                continue
            if info is not None:
                self._known[pid] = info
                found.append(info)
        return tuple(found)

    def find_marked(self, marker: tuple[str, str], *, now: float | None = None) -> tuple[ProcInfo, ...]:
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
            info = _info(proc, via="marker", now=now)
            if info is not None:
                self._known[info.pid] = info
                found.append(info)
        return tuple(found)

    def pins(self) -> frozenset[Pin]:
        """Every recorded process by PID and start time: the members ``decide`` accepts."""
        return frozenset(Pin(info.pid, info.create_time) for info in self._known.values())

    def forget_dead(self) -> None:
        for info in list(self._known.values()):
            if same_process(info) is None:
                del self._known[info.pid]


def group_stragglers(pgid: int, *, now: float | None = None) -> tuple[ProcInfo, ...]:
    """The live members of the process group a reaped root ``pgid`` led.

    Never ``killpg`` a reaped root's number: once nothing of the group is left,
    the kernel may hand that number to a stranger who leads a group of its own
    (pid_max is often 32768), and the SIGKILL would be the stranger's. While one
    member of the group lives, the number stays taken; so a live process that
    holds it means the group is gone, and otherwise the members are listed one
    by one (each then killed by PID and start time, like every other kill).
    """
    if psutil.pid_exists(pgid):
        return ()
    now = time.time() if now is None else now
    protected = protected_pids()
    out = []
    for proc in psutil.process_iter():
        if proc.pid in protected:
            continue
        if _safe(os.getpgid, proc.pid) == pgid:
            info = _info(proc, via="session", now=now)
            if info is not None:
                out.append(info)
    return tuple(out)


def signal_if_allowed(pid: int, create_time: float, sig: int, *, target: TargetIdentity,
                      reader: ProcReader = read_table) -> KillDecision:
    """One signal (a graceful SIGTERM) to one process, only if ``decide`` allows it now."""
    verdict = decide(pid, create_time, reader(), target)
    if verdict.allowed:
        try:
            os.kill(pid, sig)
        except OSError as exc:
            return KillDecision(pid, False, Reason.GONE, f"pid {pid}: {exc.strerror or exc}")
    return verdict


def clean_leftovers(*, reader: ProcReader = read_table, timeout_s: float = 10.0) -> KillResult:
    """SIGKILL every process that carries this harness's ownership marker and whose
    owning harness is gone (a night that died without cleaning up: a daemonized
    server, a guardian killed too). Each one is allowed by ``decide`` as a
    ``LEFTOVER``: another live run's server, or a marker without an owner, never."""
    table = reader()
    now = time.time()
    candidates = [
        ProcInfo(f.pid, f.create_time, f.ppid, f.name, f.cmdline, None, f.sid, now, "leftover")
        for f in table.procs.values()
        if (f.marker is not None or f.cgroup is not None)
        and decide(f.pid, f.create_time, table, TargetIdentity(Proof.LEFTOVER)).allowed
    ]
    if not candidates:
        return KillResult((), (), (), None, None)
    return kill_processes(candidates, target=TargetIdentity(Proof.LEFTOVER), timeout_s=timeout_s, reader=reader)


def find_listener(port: int) -> int | None:
    """The PID listening on TCP ``port`` (any local address), or None."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.Error:
        return None
    for conn in conns:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return conn.pid
    return None


@dataclass(frozen=True)
class KillResult:
    killed: tuple[ProcInfo, ...]
    survivors: tuple[int, ...]
    notes: tuple[str, ...]
    # Wall-clock time the SIGKILLs were sent, and how long until all were gone.
    killed_at: float | None
    gone_after_s: float | None

    @property
    def killed_pids(self) -> tuple[int, ...]:
        return tuple(info.pid for info in self.killed)


def kill_processes(
    targets: Sequence[ProcInfo],
    *,
    target: TargetIdentity,
    timeout_s: float,
    reader: ProcReader = read_table,
    poll_s: float = 0.02,
    max_rounds: int = 10,
) -> KillResult:
    """SIGSTOP, then SIGKILL, every process in ``targets`` that
    ``soak.respond.belonging.decide`` allows for ``target`` on a fresh reading of
    the box (the one gate: a process it refuses is named in the notes, never signalled).

    Blocking (reads /proc): call it from a worker thread.
    """
    protected = protected_pids()
    notes: list[str] = []
    frozen: dict[int, tuple[ProcInfo, psutil.Process]] = {}

    def freeze(info: ProcInfo, table: ProcTable, identity: TargetIdentity) -> None:
        if info.pid in frozen:
            return
        verdict = decide(info.pid, info.create_time, table, identity)
        if not verdict.allowed:
            if verdict.reason not in (Reason.GONE, Reason.REUSED):
                notes.append(f"refused to signal pid {info.pid} ({info.name}): {verdict.detail}")
            return
        if info.pid in protected:  # belt and braces: decide() already refuses these
            notes.append(f"refused to signal protected pid {info.pid} ({info.name})")
            return
        proc = same_process(info)
        if proc is None:
            return
        try:
            proc.suspend()
        except psutil.NoSuchProcess:
            return
        except psutil.Error as exc:
            notes.append(f"SIGSTOP {info.pid}: {exc}")
        frozen[info.pid] = (info, proc)

    table = reader()
    for info in targets:
        freeze(info, table, target)
    # Children forked between the last snapshot and the freeze: descendants of a
    # process just allowed, judged on a new reading.
    for _ in range(max_rounds):
        new: list[ProcInfo] = []
        now = time.time()
        for _, proc in list(frozen.values()):
            try:
                children = proc.children()
            except psutil.Error:
                continue
            for child in children:
                if child.pid not in frozen and child.pid not in protected:
                    info = _info(child, via="descendant", now=now)
                    if info is not None:
                        new.append(info)
        if not new:
            break
        table = reader()
        grown = target.with_members(Pin(i.pid, i.create_time) for i, _ in frozen.values())
        for info in new:
            freeze(info, table, grown)

    killed: list[ProcInfo] = []
    killed_at = time.time() if frozen else None
    started = time.monotonic()
    for info, proc in frozen.values():
        try:
            proc.kill()
            killed.append(info)
        except psutil.NoSuchProcess:
            continue
        except psutil.Error as exc:
            notes.append(f"SIGKILL {info.pid}: {exc}")

    remaining = list(killed)
    deadline = started + timeout_s
    while remaining:
        remaining = [info for info in remaining if same_process(info) is not None]
        if not remaining or time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    gone_after = time.monotonic() - started if killed and not remaining else None
    if remaining:
        notes.append(
            "still alive after SIGKILL and %.1fs: %s"
            % (timeout_s, ", ".join(f"{i.pid} ({i.name})" for i in remaining))
        )
    return KillResult(
        killed=tuple(killed),
        survivors=tuple(info.pid for info in remaining),
        notes=tuple(notes),
        killed_at=killed_at,
        gone_after_s=gone_after,
    )


def merge(*groups: Iterable[ProcInfo]) -> tuple[ProcInfo, ...]:
    """One record per PID, first seen wins."""
    out: dict[int, ProcInfo] = {}
    for group in groups:
        for info in group:
            out.setdefault(info.pid, info)
    return tuple(out.values())


__all__ = [
    "KillResult",
    "clean_leftovers",
    "ProcInfo",
    "ProcessTree",
    "find_listener",
    "kill_processes",
    "merge",
    "protected_pids",
    "same_process",
]
