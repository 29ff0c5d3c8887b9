"""May this PID be signalled? The one decision every kill path asks.

Invariant (CONTRACTS, "the kill hits the target or nothing"): a signal reaches a
process only when the process facts prove it belongs to the target; never PID 0
or 1, the harness or any of its ancestors, a forwarder in front of the server,
or a process whose only claim is a name, a title or a reused number.

``decide(pid, create_time, table, target)`` is pure: ``table`` is a snapshot of
the process facts (read from /proc by an injected ``ProcReader``, ``soak.proc.read``, at the edge),
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
from typing import Iterable

from soak.metric_names import parse_process_title
from soak.proc.cgroup import cgroup_owner
from soak.proc.facts import BOOT_CLOCK_TAG, MARKER_VARIABLE, OWNER_VARIABLE, Pin, ProcFacts, ProcTable, owner_stamp
from soak.redact import clip

_VLLM_ARG = re.compile(r"(^|[/.])vllm($|[/.])|^vllm\b", re.IGNORECASE)


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
    # LAUNCHED: the cgroup made for it (soak.proc.cgroup), where one could be made.
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


def _owner_pin(owner: str | None, table: ProcTable) -> Pin | None:
    """The harness an ``OWNER_VARIABLE`` stamp (``PID@START``) names, on ``table``'s clock;
    None: not recorded, or stamped on another clock (an older harness's wall-clock
    stamp), which cannot tell a live harness from a dead one."""
    if not owner or "@" not in owner:
        return None
    pid_text, _, time_text = owner.partition("@")
    if time_text.startswith(BOOT_CLOCK_TAG) != table.boot_clock:
        return None
    try:
        return Pin(int(pid_text), float(time_text.removeprefix(BOOT_CLOCK_TAG)))
    except ValueError:
        return None


def owner_alive(owner: str | None, table: ProcTable) -> bool | None:
    """The harness named by ``OWNER_VARIABLE`` (``PID@START``) is alive; None: not
    recorded, or recorded on another clock than ``table``'s."""
    pin = _owner_pin(owner, table)
    if pin is None:
        return None
    facts = table.procs.get(pin.pid)
    return facts is not None and pin.matches(facts.pid, facts.create_time)


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
        if facts.time_ns != (mine.time_ns if mine is not None else None):
            # Start ticks since boot carry each time namespace's boot-time offset: its
            # owner's stamp was taken on another clock than this reader's.
            return no(Reason.NO_PROOF, f"pid {pid} is not in this harness's time namespace: its owner's stamp "
                                       f"does not compare")
        cgroup_owned = cgroup_owner(facts.cgroup)
        lineage = set(table.ancestors(pid))
        for stamp in (cgroup_owned, facts.owner):
            owner = _owner_pin(stamp, table)
            if owner is not None and owner.pid in lineage:
                # The kernel's parent chain proves it without any start time (a wall-clock
                # step once moved every start time psutil reports, and one CI night's new
                # runs killed three live runs' servers as leftovers; pins are now ticks
                # since boot, and this stays as proof that needs no clock at all).
                return no(Reason.OWNER_ALIVE, f"pid {pid} descends from its harness (pid {owner.pid}), "
                                              f"which is running")
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
                                            f"({clip(' '.join(listener.cmdline), 120) or clip(listener.name, 120)}), "
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
    return no(Reason.NO_PROOF, f"pid {pid} ({clip(' '.join(facts.cmdline), 120) or clip(facts.name, 120)}) is not proven the target's")


__all__ = [
    "KillDecision", "MARKER_VARIABLE", "OWNER_VARIABLE", "Pin", "ProcFacts", "ProcTable", "Proof", "Reason",
    "TargetIdentity", "decide", "forwards_to", "is_vllm", "owner_alive", "owner_stamp",
]
