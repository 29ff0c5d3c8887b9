"""Reading /proc (through psutil): the edge of soak.proc, the only module here that
lists every process.

- ``read_table(full=...)`` is one pass over /proc: a ``ProcTable``. The light pass
  (``full=False``: ppid, start time, zombie) is what a tree walk and a liveness
  check need; the full one adds the command line, session, environment marker,
  cgroup, namespace and TCP sockets that ``belonging.decide`` judges by.
- ``tcp_sockets`` / ``listeners`` are the one scan of listening sockets.
- The per-process reads (``facts_of``, ``pin_of``, ``running``) touch one PID's
  files, never the whole of /proc.

A process's facts come from one life of it. The light pass reads each PID's
/proc/PID/stat once (ppid, state, start: one file, one read). The full pass and
``facts_of`` read several files, so they read the start before and after the rest
and leave out a PID whose start moved between (it died and the PID was reused
mid-read; the next pass sees the new process whole): else a dead process of the
target's environment marker or command line could be pinned to the new one's start.

Every start time here (``ProcFacts.create_time``, a ``Pin``, an owner stamp) is
seconds since boot, from /proc/PID/stat's ``starttime``: psutil's figure adds the
boot time, which the kernel moves with the wall clock, so one clock step made a
live run's harness read as gone and a target's own processes as reused PIDs.
Where there is no procfs (macOS) it is psutil's wall-clock figure; either way
one box gives one kind, so pins compare like with like.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import psutil

from soak.proc.cgroup import cgroup_of
from soak.proc.facts import MARKER_VARIABLE, OWNER_VARIABLE, Pin, ProcFacts, ProcTable


# Start times read here are on the boot clock (procfs), else psutil's wall clock.
BOOT_CLOCK = os.path.exists("/proc/self/stat")
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Stat:
    """The fields of one /proc/PID/stat line that a pin and a tree walk need."""

    state: str  # R, S, D, Z, ...
    ppid: int
    start_ticks: int  # starttime: clock ticks since boot

    def started_s(self, ticks_per_s: int = _TICKS_PER_S) -> float:
        return self.start_ticks / ticks_per_s


def parse_stat(line: str) -> Stat:
    """Fields 3 (state), 4 (ppid) and 22 (starttime) of a /proc/PID/stat line. The
    command name (field 2) may hold spaces and parentheses, so fields are counted
    from its last ``)``. ValueError on anything else."""
    head, sep, rest = line.rpartition(")")
    fields = rest.split()
    if not sep or not head or len(fields) < 20:
        raise ValueError(f"not a /proc/PID/stat line: {line[:80]!r}")
    state, ppid, ticks = fields[0], int(fields[1]), int(fields[19])  # fields[0] is field 3
    if ticks < 0 or ppid < 0:
        raise ValueError(f"negative ppid or starttime in {line[:80]!r}")
    return Stat(state=state, ppid=ppid, start_ticks=ticks)


def start_since_boot(stat: str, *, ticks_per_s: int) -> float:
    """Field 22 (``starttime``) of a /proc/PID/stat line, in seconds since boot."""
    if ticks_per_s <= 0:
        raise ValueError(f"ticks per second {ticks_per_s}")
    return parse_stat(stat).started_s(ticks_per_s)


def read_stat(pid: int) -> Stat | None:
    """``pid``'s /proc/PID/stat now, or None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return parse_stat(f.read())
    except (OSError, ValueError):
        return None


def one_life(before: Stat | None, after: Stat | None) -> bool:
    """Whether what was read between two reads of a PID's stat is one process's:
    both read, and the same start (a reused PID starts later)."""
    return before is not None and after is not None and before.start_ticks == after.start_ticks


def started(proc: psutil.Process) -> float:
    """When ``proc`` started, as every pin reads it (see the module's docstring);
    psutil.NoSuchProcess when it is gone."""
    if not BOOT_CLOCK:
        return proc.create_time()
    stat = read_stat(proc.pid)
    if stat is None:
        raise psutil.NoSuchProcess(proc.pid)
    return stat.started_s()


class ProcReader(Protocol):
    def __call__(self) -> ProcTable: ...


def tcp_sockets() -> list[Any]:
    """Every TCP socket of the box (psutil's view of /proc/net/tcp* and each process's fds)."""
    try:
        return psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return []


def listeners(port: int, conns: list[Any] | None = None) -> list[int | None]:
    """The PIDs owning a LISTEN socket on TCP ``port`` (any address); None for a
    socket whose owner this user cannot see. Empty: nothing listens."""
    out: list[int | None] = []
    for conn in tcp_sockets() if conns is None else conns:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid not in out:
            out.append(conn.pid)
    return out


def find_listener(port: int) -> int | None:
    """The PID listening on TCP ``port`` (any local address), or None."""
    return next((pid for pid in listeners(port) if pid), None)


def local_addresses() -> set[str]:
    try:
        return {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    except (psutil.Error, OSError):
        return set()


def _is_local(ip: str, local: set[str]) -> bool:
    return ip.startswith("127.") or ip == "::1" or ip.startswith("::ffff:127.") or ip in local


def _sockets_by_pid() -> tuple[dict[int, set[int]], dict[int, set[int]], set[int]]:
    """Ports each PID listens on, local listener ports each PID is connected to, and
    the listening ports whose owner this user cannot see."""
    conns = tcp_sockets()
    listens: dict[int, set[int]] = {}
    dials: dict[int, set[int]] = {}
    unseen: set[int] = set()
    listening_ports: set[int] = set()
    for conn in conns:
        if conn.status == psutil.CONN_LISTEN and conn.laddr:
            listening_ports.add(conn.laddr.port)
            if conn.pid is None:
                unseen.add(conn.laddr.port)
            else:
                listens.setdefault(conn.pid, set()).add(conn.laddr.port)
    local = local_addresses()
    for conn in conns:
        if (conn.status == psutil.CONN_ESTABLISHED and conn.pid is not None and conn.raddr
                and conn.raddr.port in listening_ports and _is_local(conn.raddr.ip, local)):
            dials.setdefault(conn.pid, set()).add(conn.raddr.port)
    return listens, dials, unseen - set().union(*listens.values())


def _safe(fn, pid: int) -> int | None:
    try:
        return fn(pid)
    except OSError:
        return None


def _trimmed(cmdline: Any) -> tuple[str, ...]:
    # setproctitle pads the title with empty arguments
    args = tuple(cmdline or ())
    while args and not args[-1]:
        args = args[:-1]
    return args[:16]


def read_table(*, full: bool = True, with_env: bool = True,
               stat_of: Callable[[int], Stat | None] = read_stat) -> ProcTable:
    """The box now: one pass over /proc. The default ``ProcReader`` (full).
    ``stat_of`` reads a PID's stat (injected where a test plays a PID's reuse)."""
    if not BOOT_CLOCK:
        return _read_table_psutil(full=full, with_env=with_env)
    if not full:
        procs = {}
        for pid in psutil.pids():
            stat = stat_of(pid)
            if stat is not None:
                procs[pid] = ProcFacts(pid=pid, ppid=stat.ppid, create_time=stat.started_s(),
                                       zombie=stat.state == "Z")
        return ProcTable(me=os.getpid(), procs=procs, boot_clock=True)
    listens, dials, unseen = _sockets_by_pid()
    procs = {}
    attrs = ["name", "cmdline"] + (["environ"] if with_env else [])
    for pid in psutil.pids():
        before = stat_of(pid)
        if before is None:
            continue
        try:
            info = psutil.Process(pid).as_dict(attrs, ad_value=None)
        except psutil.Error:
            continue
        facts = _full_facts(pid, ppid=before.ppid, create_time=before.started_s(), zombie=before.state == "Z",
                            info=info, listens=listens, dials=dials)
        if one_life(before, stat_of(pid)):
            procs[pid] = facts
    return ProcTable(me=os.getpid(), procs=procs, unseen_listeners=frozenset(unseen), boot_clock=True)


def _full_facts(pid: int, *, ppid: int, create_time: float, zombie: bool, info: dict,
                listens: dict[int, set[int]], dials: dict[int, set[int]]) -> ProcFacts:
    """One process's row of the full table: what ``belonging.decide`` judges by."""
    env = info.get("environ") or {}
    return ProcFacts(
        pid=pid, ppid=ppid, create_time=create_time, cmdline=_trimmed(info.get("cmdline")),
        name=info.get("name") or "", sid=_safe(os.getsid, pid), marker=env.get(MARKER_VARIABLE),
        owner=env.get(OWNER_VARIABLE), listens=frozenset(listens.get(pid, ())),
        dials=frozenset(dials.get(pid, ())), cgroup=cgroup_of(pid), pid_ns=_namespace(pid, "pid"),
        time_ns=_namespace(pid, "time"), zombie=zombie,
    )


def _read_table_psutil(*, full: bool, with_env: bool) -> ProcTable:
    """Without procfs (macOS, a developer's laptop): psutil's view, its wall-clock starts."""
    procs = {}
    if not full:
        for proc in psutil.process_iter(["ppid", "status"], ad_value=None):
            info = proc.info
            start = _started_or_none(proc)
            if start is None or info.get("ppid") is None:
                continue
            procs[proc.pid] = ProcFacts(pid=proc.pid, ppid=info["ppid"], create_time=start,
                                        zombie=info.get("status") == psutil.STATUS_ZOMBIE)
        return ProcTable(me=os.getpid(), procs=procs, boot_clock=False)
    listens, dials, unseen = _sockets_by_pid()
    attrs = ["ppid", "name", "cmdline", "status"] + (["environ"] if with_env else [])
    for proc in psutil.process_iter(attrs, ad_value=None):
        info = proc.info
        start = _started_or_none(proc)
        if start is None or info.get("ppid") is None:
            continue
        procs[proc.pid] = _full_facts(proc.pid, ppid=info["ppid"], create_time=start,
                                      zombie=info.get("status") == psutil.STATUS_ZOMBIE, info=info,
                                      listens=listens, dials=dials)
    return ProcTable(me=os.getpid(), procs=procs, unseen_listeners=frozenset(unseen), boot_clock=False)


def _namespace(pid: int, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:  # gone, not ours to read, or a kernel without that namespace (time: before 5.6)
        return None


def _started_or_none(proc: psutil.Process) -> float | None:
    try:
        return started(proc)
    except psutil.Error:
        return None


def facts_of(pid: int, *, stat_of: Callable[[int], Stat | None] = read_stat) -> ProcFacts | None:
    """One process's ppid, start time, name, command line, group and session (its
    own files only); None when it is gone or unreadable, or its PID was reused while
    it was read."""
    before = stat_of(pid) if BOOT_CLOCK else None
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            create_time = before.started_s() if before else started(proc)
            ppid = before.ppid if before else proc.ppid()
            name = proc.name()
            try:
                cmdline = _trimmed(proc.cmdline())
            except psutil.AccessDenied:
                cmdline = ()
    except psutil.Error:
        return None
    facts = ProcFacts(pid=pid, ppid=ppid, create_time=create_time, cmdline=cmdline, name=name,
                      sid=_safe(os.getsid, pid), pgid=_safe(os.getpgid, pid))
    if BOOT_CLOCK and not one_life(before, stat_of(pid)):
        return None
    return facts


def live_process(pin: Pin) -> psutil.Process | None:
    """The live process ``pin`` names, or None (gone, a zombie, or the PID reused)."""
    try:
        proc = psutil.Process(pin.pid)
        if not pin.matches(pin.pid, started(proc)) or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None


def running(pin: Pin) -> bool:
    return live_process(pin) is not None


def pin_of(pid: int) -> Pin | None:
    """``pid`` pinned by its start time now; None when there is no such process."""
    try:
        return Pin(pid, started(psutil.Process(pid)))
    except psutil.Error:
        return None


def protected_pids() -> frozenset[int]:
    """PIDs no signal may ever reach: 0, 1, the harness and its ancestors."""
    me = psutil.Process()
    pids = {0, 1, me.pid}
    try:
        pids.update(p.pid for p in me.parents())
    except psutil.Error:
        pass
    return frozenset(pids)


def describe(pid: int | None) -> str:
    """``pid 123 (python3 -m http.server 8000)`` for a one-line message."""
    if pid is None:
        return "an unknown process (its owner is not visible to this user)"
    facts = facts_of(pid)
    if facts is None:
        return f"pid {pid} (gone)"
    from soak.redact import clip

    # redacted whole, then cut: a cut first could split ``user:password@`` or a secret past every rule
    text = clip(" ".join(a for a in facts.cmdline if a), 160) or clip(facts.name, 160)
    return f"pid {pid} ({text})"


__all__ = ["ProcReader", "describe", "facts_of", "find_listener", "listeners", "live_process", "local_addresses",
           "pin_of", "protected_pids", "read_table", "running", "tcp_sockets"]
