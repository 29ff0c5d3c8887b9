"""May this PID be signalled? The one decision every kill path asks.

Invariant (CONTRACTS, "the kill hits the target or nothing"): a signal reaches a
process only when the process facts prove it belongs to the target; never PID 0
or 1, the harness or any of its ancestors, a forwarder in front of the server,
or a process whose only claim is a name, a title or a reused number.

``decide(pid, create_time, table, target)`` is pure: ``table`` is a snapshot of
the process facts (read from /proc by an injected ``ProcReader`` at the edge),
``target`` says what proves membership for this target:

- ``LAUNCHED``: the run's ownership marker in the process's environment (every
  descendant inherits it, also one that called ``setsid()`` or was reparented),
  the cgroup made for it, the launched root pinned by its start time, the
  processes recorded as its members over the run, the descendants of any of
  those, and the members of the session the live root leads;
- ``ATTACHED_PID``: the PID the config gave, checked against the URL's listener
  at start and pinned by its start time, and its tree;
- ``ATTACHED_URL``: the process listening on the URL's loopback port and its
  tree, unless that listener is a forwarder (it dials another local listener
  outside its own tree and is not a vLLM process tree): then nothing;
- ``LEFTOVER``: a process carrying this harness's marker whose owning harness
  (recorded beside the marker as PID and start time) is gone, or one in a
  target cgroup named with a harness that is gone.

A process in the table is pinned by PID and start time: the same number with
another start time is someone else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Mapping, Protocol

from soak.metric_names import parse_process_title
from soak.respond.cgroup import cgroup_of, cgroup_owner
from soak.respond.flight import ownership_variable as MARKER_VARIABLE

# Beside the marker: the harness that set it (PID@start time), so a later run can
# tell a leftover (its harness gone) from another live run's server.
OWNER_VARIABLE = "SOAK_TARGET_OWNER"
# psutil derives create_time from the boot time and /proc/PID/stat; the same
# process always reads within this of itself.
SAME_START_S = 0.05
_VLLM_ARG = re.compile(r"(^|[/.])vllm($|[/.])|^vllm\b", re.IGNORECASE)


@dataclass(frozen=True)
class Pin:
    """A process by PID and start time."""

    pid: int
    create_time: float

    def matches(self, pid: int, create_time: float) -> bool:
        return pid == self.pid and abs(create_time - self.create_time) <= SAME_START_S


@dataclass(frozen=True)
class ProcFacts:
    """What /proc says about one process, as far as this user may read it."""

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

    @property
    def pin(self) -> Pin:
        return Pin(self.pid, self.create_time)


@dataclass(frozen=True)
class ProcTable:
    """One snapshot of the box: every visible process, and who reads it (``me``)."""

    me: int
    procs: Mapping[int, ProcFacts]
    # Ports whose listener this user cannot see (another user's process).
    unseen_listeners: frozenset[int] = frozenset()

    def ancestors(self, pid: int) -> tuple[int, ...]:
        out: list[int] = []
        seen = {pid}
        cur = self.procs.get(pid)
        while cur is not None and cur.ppid not in seen and cur.ppid > 0:
            out.append(cur.ppid)
            seen.add(cur.ppid)
            cur = self.procs.get(cur.ppid)
        return tuple(out)

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

    def descendants(self, pid: int) -> frozenset[int]:
        root = self.procs.get(pid)
        if root is None:
            return frozenset()
        out = {pid}
        changed = True
        while changed:
            changed = False
            for facts in self.procs.values():
                if facts.pid not in out:
                    parent = self.parent_of(facts)
                    if parent is not None and parent.pid in out:
                        out.add(facts.pid)
                        changed = True
        return frozenset(out)

    def listeners(self, port: int) -> tuple[ProcFacts, ...]:
        return tuple(f for f in self.procs.values() if port in f.listens)


class Proof(str, Enum):
    LAUNCHED = "launched"
    ATTACHED_PID = "attached_pid"
    ATTACHED_URL = "attached_url"
    LEFTOVER = "leftover"


@dataclass(frozen=True)
class TargetIdentity:
    """What proves that a process is this target's."""

    proof: Proof
    marker: str | None = None
    root: Pin | None = None
    members: frozenset[Pin] = field(default_factory=frozenset)
    # ATTACHED_URL: the loopback port whose listener is the root.
    port: int | None = None
    # LAUNCHED: the session the launched root leads (started with setsid()).
    session: int | None = None
    # LAUNCHED: the cgroup made for it (soak.respond.cgroup), where one could be made.
    cgroup: str | None = None

    def with_members(self, pins: Iterable[Pin]) -> "TargetIdentity":
        return TargetIdentity(self.proof, self.marker, self.root, self.members | frozenset(pins), self.port,
                              self.session, self.cgroup)


class Reason(str, Enum):
    ROOT = "root"
    MEMBER = "member"
    MARKER = "marker"
    DESCENDANT = "descendant"
    SESSION = "session"
    CGROUP = "cgroup"
    LEFTOVER = "leftover"
    INIT = "init"
    HARNESS = "harness"
    ANCESTOR = "ancestor"
    GONE = "gone"
    REUSED = "reused"
    FORWARDER = "forwarder"
    OWNER_ALIVE = "owner_alive"
    NO_PROOF = "no_proof"


@dataclass(frozen=True)
class KillDecision:
    pid: int
    allowed: bool
    reason: Reason
    detail: str


def is_vllm(facts: ProcFacts) -> bool:
    """A vLLM process by its title or command line (``VLLM::EngineCore``, ``vllm serve``,
    ``-m vllm.entrypoints...``). Only ever used to spare a server, never to pick a victim."""
    if parse_process_title(facts.cmdline or (facts.name,)) is not None:
        return True
    return any(_VLLM_ARG.search(arg) for arg in facts.cmdline[:4])


def forwards_to(facts: ProcFacts, table: ProcTable) -> tuple[int, ...]:
    """The local listener ports outside its own tree that ``facts`` is connected to,
    unless its tree is a vLLM server's (whose engine may talk to local services)."""
    own = table.descendants(facts.pid)
    mine = {port for pid in own for port in table.procs[pid].listens}
    ports = []
    for port in sorted(facts.dials):
        if port in mine:
            continue
        owners = table.listeners(port)
        if port in table.unseen_listeners or any(o.pid not in own for o in owners):
            ports.append(port)
    if not ports or any(is_vllm(table.procs[pid]) for pid in own):
        return ()
    return tuple(ports)


def owner_alive(owner: str | None, table: ProcTable) -> bool | None:
    """The harness named by ``OWNER_VARIABLE`` (``PID@CREATE_TIME``) is alive; None: not recorded."""
    if not owner or "@" not in owner:
        return None
    pid_text, _, time_text = owner.partition("@")
    try:
        pin = Pin(int(pid_text), float(time_text))
    except ValueError:
        return None
    facts = table.procs.get(pin.pid)
    return facts is not None and pin.matches(facts.pid, facts.create_time)


def owner_stamp(pid: int, create_time: float) -> str:
    return f"{pid}@{create_time:.3f}"


def decide(pid: int, create_time: float | None, table: ProcTable, target: TargetIdentity) -> KillDecision:
    """Whether ``pid`` (seen with ``create_time``; None: not pinned) may be signalled."""

    def no(reason: Reason, detail: str) -> KillDecision:
        return KillDecision(pid, False, reason, detail)

    def yes(reason: Reason, detail: str) -> KillDecision:
        return KillDecision(pid, True, reason, detail)

    if pid <= 1:
        return no(Reason.INIT, f"pid {pid} is never signalled")
    if pid == table.me:
        return no(Reason.HARNESS, f"pid {pid} is the harness itself")
    if pid in table.ancestors(table.me):
        return no(Reason.ANCESTOR, f"pid {pid} is a parent of the harness")
    facts = table.procs.get(pid)
    if facts is None:
        return no(Reason.GONE, f"pid {pid} is gone")
    if create_time is not None and not Pin(pid, create_time).matches(pid, facts.create_time):
        return no(Reason.REUSED, f"pid {pid} now belongs to another process (started at another time)")

    if target.proof is Proof.LEFTOVER:
        mine = table.procs.get(table.me)
        if facts.pid_ns != (mine.pid_ns if mine is not None else None):
            # Its owner's PID is another namespace's (a harness in a container): from here
            # "not found" cannot tell a dead harness from a live one.
            return no(Reason.NO_PROOF, f"pid {pid} is not in this harness's PID namespace: its owner cannot be seen")
        cgroup_owned = cgroup_owner(facts.cgroup)
        if cgroup_owned is not None and owner_alive(cgroup_owned, table) is False:
            # In the cgroup a harness made for its target, named with that harness: gone.
            return yes(Reason.LEFTOVER, f"pid {pid} is in the cgroup of a harness that is gone ({cgroup_owned})")
        if facts.marker is None:
            return no(Reason.NO_PROOF, f"pid {pid} carries no {MARKER_VARIABLE}")
        alive = owner_alive(facts.owner, table)
        if alive is None:
            return no(Reason.NO_PROOF, f"pid {pid} carries {MARKER_VARIABLE} but no owning harness")
        if alive:
            return no(Reason.OWNER_ALIVE, f"pid {pid} belongs to a harness that is still running ({facts.owner})")
        return yes(Reason.LEFTOVER, f"pid {pid} carries the marker of a harness that is gone ({facts.owner})")

    if target.proof is Proof.LAUNCHED and target.marker and facts.marker == target.marker:
        return yes(Reason.MARKER, f"pid {pid} carries the run's ownership marker")
    if target.proof is Proof.LAUNCHED and target.cgroup is not None and facts.cgroup == target.cgroup:
        # Nobody leaves a cgroup without write access to another: the harness made this one for the target.
        return yes(Reason.CGROUP, f"pid {pid} is in the launched server's cgroup {target.cgroup}")
    if target.proof is Proof.LAUNCHED and target.session is not None and facts.sid == target.session:
        # Only while the pinned root still leads it: once the root is gone its number
        # may lead a stranger's session later, and a match would be a guess.
        holder = table.procs.get(target.session)
        if holder is not None and target.root is not None and target.root.matches(holder.pid, holder.create_time):
            return yes(Reason.SESSION, f"pid {pid} is in the launched server's session {target.session}")

    proven: set[int] = set()
    if target.proof is Proof.ATTACHED_URL:
        if target.port is None:
            return no(Reason.NO_PROOF, "no port to find the attached server by")
        listeners = table.listeners(target.port)
        for listener in listeners:
            ports = forwards_to(listener, table)
            if ports:
                where = ", ".join(f"127.0.0.1:{p}" for p in ports)
                return no(Reason.FORWARDER, f"port {target.port} is served by pid {listener.pid} "
                                            f"({' '.join(listener.cmdline)[:120] or listener.name}), "
                                            f"which forwards to {where}: not the server")
        if target.port in table.unseen_listeners:
            return no(Reason.NO_PROOF, f"port {target.port} has a listener this user cannot see")
        proven.update(listener.pid for listener in listeners)
    if target.root is not None:
        root = table.procs.get(target.root.pid)
        if root is not None and target.root.matches(root.pid, root.create_time):
            proven.add(root.pid)
    for pin in target.members:
        member = table.procs.get(pin.pid)
        if member is not None and pin.matches(member.pid, member.create_time):
            proven.add(member.pid)

    if target.proof is Proof.ATTACHED_PID and target.root is not None and target.root.pid in proven:
        ports = forwards_to(table.procs[target.root.pid], table)
        if ports:
            return no(Reason.FORWARDER, f"target.pid {target.root.pid} forwards to "
                                        f"{', '.join(f'127.0.0.1:{p}' for p in ports)}: not the server")

    harness_side = {table.me, *table.ancestors(table.me)}
    for i, up in enumerate(table.lineage(facts)):
        if up.pid in harness_side:
            break  # the harness's own side of the tree proves nothing
        if up.pid in proven:
            if i > 0:
                return yes(Reason.DESCENDANT, f"pid {pid} descends from the target's pid {up.pid}")
            if (target.root is not None and target.root.pid == pid) or target.proof is Proof.ATTACHED_URL:
                return yes(Reason.ROOT, f"pid {pid} is the target's root")
            return yes(Reason.MEMBER, f"pid {pid} is a recorded member of the target")
    return no(Reason.NO_PROOF, f"pid {pid} ({' '.join(facts.cmdline)[:120] or facts.name}) is not proven the target's")


class ProcReader(Protocol):
    def __call__(self) -> ProcTable: ...


def read_table(*, with_env: bool = True) -> ProcTable:
    """The box now, from /proc (psutil): the default ``ProcReader``."""
    import os

    import psutil

    listens: dict[int, set[int]] = {}
    dials: dict[int, set[int]] = {}
    unseen: set[int] = set()
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        conns = []
    listening_ports: set[int] = set()
    for conn in conns:
        if conn.status == psutil.CONN_LISTEN and conn.laddr:
            listening_ports.add(conn.laddr.port)
            if conn.pid is None:
                unseen.add(conn.laddr.port)
            else:
                listens.setdefault(conn.pid, set()).add(conn.laddr.port)
    local = _local_addresses()
    for conn in conns:
        if (conn.status == psutil.CONN_ESTABLISHED and conn.pid is not None and conn.raddr
                and conn.raddr.port in listening_ports and _is_local(conn.raddr.ip, local)):
            dials.setdefault(conn.pid, set()).add(conn.raddr.port)
    procs: dict[int, ProcFacts] = {}
    attrs = ["pid", "ppid", "create_time", "name", "cmdline"] + (["environ"] if with_env else [])
    for proc in psutil.process_iter(attrs, ad_value=None):
        info = proc.info
        if info.get("create_time") is None or info.get("ppid") is None:
            continue
        env = info.get("environ") or {}
        cmdline = tuple(info.get("cmdline") or ())
        while cmdline and not cmdline[-1]:
            cmdline = cmdline[:-1]
        try:
            sid = os.getsid(info["pid"])
        except OSError:
            sid = None
        cgroup = cgroup_of(info["pid"])
        try:
            pid_ns = os.readlink(f"/proc/{info['pid']}/ns/pid")
        except OSError:
            pid_ns = None
        procs[info["pid"]] = ProcFacts(
            pid=info["pid"], ppid=info["ppid"], create_time=info["create_time"], cmdline=cmdline[:16],
            name=info.get("name") or "", sid=sid, marker=env.get(MARKER_VARIABLE), owner=env.get(OWNER_VARIABLE),
            listens=frozenset(listens.get(info["pid"], ())), dials=frozenset(dials.get(info["pid"], ())),
            cgroup=cgroup, pid_ns=pid_ns,
        )
    return ProcTable(me=os.getpid(), procs=procs, unseen_listeners=frozenset(unseen - set().union(*listens.values())))


def _local_addresses() -> set[str]:
    import psutil

    try:
        return {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    except (psutil.Error, OSError):
        return set()


def _is_local(ip: str, local: set[str]) -> bool:
    return ip.startswith("127.") or ip == "::1" or ip.startswith("::ffff:127.") or ip in local


__all__ = [
    "KillDecision", "MARKER_VARIABLE", "OWNER_VARIABLE", "Pin", "ProcFacts", "ProcReader", "ProcTable", "Proof",
    "Reason", "TargetIdentity", "decide", "forwards_to", "is_vllm", "owner_alive", "owner_stamp", "read_table",
]
