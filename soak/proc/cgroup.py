"""A cgroup (v2) of its own for a launched target, where this user may make one.

A process can leave its session (``setsid``) and scrub its environment (``env
-i``, a daemon that resets it), but it cannot leave its cgroup without write
access to another one. So where the harness may create a child of its own cgroup
(root on a box with the unified hierarchy mounted read-write, a delegated
systemd scope), the launched server starts inside ``soak-<token>``, and every
process in it is the target's (``belonging.decide``: ``Reason.CGROUP``). Where it
may not (most unprivileged sessions), nothing changes: the session and the
ownership marker still hold (docs/response.md).

The server is moved before its command runs: ``wrap()`` prefixes the command
with ``sh -c 'echo 0 > .../cgroup.procs; exec "$@"'``, so even a fork on the
first instruction (``setsid -f``) lands inside. A failed write is ignored.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Cgroup:
    path: Path  # the directory under the cgroup2 mount
    name: str  # as /proc/PID/cgroup names it ("0::<name>")

    def pids(self) -> tuple[int, ...]:
        try:
            text = (self.path / "cgroup.procs").read_text()
        except OSError:
            return ()
        return tuple(int(line) for line in text.split() if line.isdigit())

    def remove(self) -> bool:
        """rmdir, which the kernel allows only once no process is left in it."""
        try:
            self.path.rmdir()
            return True
        except OSError:
            return False

    def wrap(self, command: Sequence[str]) -> list[str]:
        procs = str(self.path / "cgroup.procs").replace("'", "'\\''")
        return ["/bin/sh", "-c", f"{{ echo 0 > '{procs}'; }} 2>/dev/null; exec \"$@\"", "soak-launch", *command]


def _mount() -> Path | None:
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if " - cgroup2 " in line and len(fields) > 4:
            return Path(fields[4])
    return None


def cgroup_of(pid: int | str = "self") -> str | None:
    """The process's cgroup v2 name, or None (no v2 hierarchy, gone, not readable)."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


def _parent() -> Path | None:
    mount, mine = _mount(), cgroup_of()
    if mount is None or mine is None:
        return None
    return mount / mine.lstrip("/")


def remove_empty_leftovers() -> list[str]:
    """rmdir every empty ``soak-*`` cgroup beside where this harness makes its own:
    those of nights killed hard (their processes are gone or cleaned by the marker).
    The kernel refuses a cgroup that still holds a process, so no live run loses
    one that is in use."""
    parent = _parent()
    removed: list[str] = []
    if parent is None:
        return removed
    try:
        entries = [p for p in parent.iterdir() if p.name.startswith("soak-") and p.is_dir()]
    except OSError:
        return removed
    for path in entries:
        try:
            if (path / "cgroup.procs").read_text().strip():
                continue
            path.rmdir()
            removed.append(path.name)
        except OSError:
            continue
    return removed


OWNER_SEPARATOR = "~"


def cgroup_owner(name: str | None) -> str | None:
    """The owner stamp (``PID@START``) a harness put in its target's cgroup name, or None."""
    if not name:
        return None
    leaf = name.rsplit("/", 1)[-1]
    if not leaf.startswith("soak-") or OWNER_SEPARATOR not in leaf:
        return None
    return leaf.rsplit(OWNER_SEPARATOR, 1)[1] or None


def create(token: str, *, owner: str | None = None) -> Cgroup | None:
    """A new child of the harness's own cgroup, or None where that is not possible.
    ``owner`` (the harness's ``PID@START``) goes into the name, so a later run can
    tell the cgroup of a harness that is gone (its members are leftovers)."""
    mount, mine = _mount(), cgroup_of()
    if mount is None or mine is None or not Path("/bin/sh").exists():
        return None
    leaf = "soak-" + _SAFE.sub("-", token)[:80] + (OWNER_SEPARATOR + owner if owner else "")
    path = mount / mine.lstrip("/") / leaf
    try:
        path.mkdir()
    except OSError:
        return None
    if not os.access(path / "cgroup.procs", os.W_OK):
        try:
            path.rmdir()
        except OSError:
            pass
        return None
    return Cgroup(path, (mine.rstrip("/") + "/" + leaf) if mine != "/" else "/" + leaf)
