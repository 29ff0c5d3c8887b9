"""SIGKILL of the target's tree, and the other signals the harness sends.

Every path here asks ``soak.proc.belonging.decide`` on a fresh reading of the
box before a signal (the one gate: a process it refuses is named in the notes,
never signalled). The kill freezes the whole set with SIGSTOP first (so nothing
forks or respawns while we work), picks up children forked in the meantime,
then sends SIGKILL to every frozen process and waits, bounded, until each is
gone (a zombie counts as gone: it holds no memory and runs nothing).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Sequence

import psutil

from soak.proc.belonging import KillDecision, Proof, Reason, TargetIdentity, decide
from soak.proc.facts import Member, ProcTable
from soak.proc.read import ProcReader, live_process, protected_pids, read_table
from soak.proc.tree import member_of


def group_stragglers(pgid: int, *, now: float | None = None) -> tuple[Member, ...]:
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
        try:
            if os.getpgid(proc.pid) != pgid:
                continue
        except OSError:
            continue
        member = member_of(proc.pid, via="session", now=now)
        if member is not None:
            out.append(member)
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
        Member(f, now, "leftover")
        for f in table.procs.values()
        if (f.marker is not None or f.cgroup is not None)
        and decide(f.pid, f.create_time, table, TargetIdentity(Proof.LEFTOVER)).allowed
    ]
    if not candidates:
        return KillResult((), (), (), None, None)
    return kill_processes(candidates, target=TargetIdentity(Proof.LEFTOVER), timeout_s=timeout_s, reader=reader)


@dataclass(frozen=True)
class KillResult:
    killed: tuple[Member, ...]
    survivors: tuple[int, ...]
    notes: tuple[str, ...]
    # Wall-clock time the SIGKILLs were sent, and how long until all were gone.
    killed_at: float | None
    gone_after_s: float | None

    @property
    def killed_pids(self) -> tuple[int, ...]:
        return tuple(member.pid for member in self.killed)


def kill_processes(
    targets: Sequence[Member],
    *,
    target: TargetIdentity,
    timeout_s: float,
    reader: ProcReader = read_table,
    poll_s: float = 0.02,
    max_rounds: int = 10,
) -> KillResult:
    """SIGSTOP, then SIGKILL, every process in ``targets`` that
    ``soak.proc.belonging.decide`` allows for ``target`` on a fresh reading of
    the box (the one gate: a process it refuses is named in the notes, never signalled).

    Blocking (reads /proc): call it from a worker thread.
    """
    protected = protected_pids()
    notes: list[str] = []
    frozen: dict[int, tuple[Member, psutil.Process]] = {}

    def freeze(info: Member, table: ProcTable, identity: TargetIdentity) -> None:
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
        proc = live_process(info.pin)
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
        new: list[Member] = []
        now = time.time()
        for _, proc in list(frozen.values()):
            try:
                children = proc.children()
            except psutil.Error:
                continue
            for child in children:
                if child.pid not in frozen and child.pid not in protected:
                    info = member_of(child.pid, via="descendant", now=now)
                    if info is not None:
                        new.append(info)
        if not new:
            break
        table = reader()
        grown = target.with_members(i.pin for i, _ in frozen.values())
        for info in new:
            freeze(info, table, grown)

    killed: list[Member] = []
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
        remaining = [info for info in remaining if live_process(info.pin) is not None]
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


__all__ = ["KillResult", "clean_leftovers", "group_stragglers", "kill_processes", "signal_if_allowed"]
