"""The target's POSIX shared-memory segments: learned while it runs, removed after a SIGKILL.

vLLM's shared-memory broadcast rings (and anything else built on Python's
``multiprocessing.shared_memory``) live in ``/dev/shm``. A clean shutdown
unlinks them; a SIGKILL of the whole tree, resource tracker included, leaves
them behind, each holding its size in RAM until someone removes it. Only the
segments the killed tree held may be removed, never another program's.

So ownership is learned, not guessed from names: ``ShmLedger.record(pids)``
reads ``/proc/PID/maps`` and ``/proc/PID/fd`` of the target's processes (while
they are alive, before the kill) and keeps each ``/dev/shm`` file they mapped or
held open with its device and inode. ``cleanup(killed_pids)`` then unlinks a
recorded segment only when

- the same file is still there (same device and inode: a file later created
  under the same name is someone else's);
- no live process outside the killed set maps it or holds it open.

Blocking (/proc reads): call from a worker thread.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

SHM_DIR = "/dev/shm"


@dataclass(frozen=True)
class ShmSegment:
    path: str
    dev: int
    inode: int
    size: int
    pids: tuple[int, ...]

    def to_json(self) -> dict:
        return {"path": self.path, "dev": self.dev, "inode": self.inode, "size": self.size, "pids": list(self.pids)}


@dataclass(frozen=True)
class ShmCleanup:
    removed: tuple[ShmSegment, ...] = ()
    # path -> why it was left alone
    kept: dict[str, str] = field(default_factory=dict)

    @property
    def removed_bytes(self) -> int:
        return sum(s.size for s in self.removed)

    def to_json(self) -> dict:
        return {
            "removed": [s.to_json() for s in self.removed],
            "removed_bytes": self.removed_bytes,
            "kept": dict(self.kept),
        }


def _maps_paths(pid: int, proc_root: str) -> set[str]:
    out: set[str] = set()
    try:
        with open(f"{proc_root}/{pid}/maps", "r", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                idx = line.find(SHM_DIR + "/")
                if idx < 0:
                    continue
                path = line[idx:].rstrip("\n")
                if path.endswith(" (deleted)"):
                    continue
                out.add(path)
    except OSError:
        pass
    return out


def _fd_paths(pid: int, proc_root: str) -> set[str]:
    out: set[str] = set()
    fd_dir = f"{proc_root}/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError:
            continue
        if target.startswith(SHM_DIR + "/") and not target.endswith(" (deleted)"):
            out.add(target)
    return out


def shm_paths_of(pid: int, *, proc_root: str = "/proc") -> set[str]:
    """The /dev/shm files ``pid`` maps or holds open now (empty when it is gone)."""
    return _maps_paths(pid, proc_root) | _fd_paths(pid, proc_root)


def _stat(path: str) -> os.stat_result | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st


class ShmLedger:
    """The /dev/shm segments the target's processes were seen to hold."""

    def __init__(self, *, proc_root: str = "/proc") -> None:
        self._proc_root = proc_root
        self._segments: dict[str, ShmSegment] = {}

    def segments(self) -> tuple[ShmSegment, ...]:
        return tuple(self._segments.values())

    def record(self, pids: Iterable[int]) -> int:
        """Add what ``pids`` hold now; returns how many segments are known."""
        for pid in pids:
            for path in shm_paths_of(pid, proc_root=self._proc_root):
                if Path(path).parent != Path(SHM_DIR):
                    continue  # only files directly in /dev/shm (POSIX shm names)
                st = _stat(path)
                if st is None:
                    continue
                old = self._segments.get(path)
                if old is not None and (old.dev, old.inode) == (st.st_dev, st.st_ino):
                    if pid not in old.pids:
                        self._segments[path] = ShmSegment(path, old.dev, old.inode, st.st_size, old.pids + (pid,))
                    continue
                self._segments[path] = ShmSegment(path, st.st_dev, st.st_ino, st.st_size, (pid,))
        return len(self._segments)

    def _held_elsewhere(self, killed: set[int]) -> dict[tuple[int, int], int]:
        """(dev, inode) of every /dev/shm file a live process outside ``killed`` holds -> one such pid."""
        held: dict[tuple[int, int], int] = {}
        wanted = {(s.dev, s.inode) for s in self._segments.values()}
        if not wanted:
            return held
        try:
            entries = os.listdir(self._proc_root)
        except OSError:
            return held
        for entry in entries:
            if not entry.isdigit():
                continue
            pid = int(entry)
            if pid in killed:
                continue
            if _is_zombie_or_gone(pid, self._proc_root):
                continue
            for path in shm_paths_of(pid, proc_root=self._proc_root):
                st = _stat(path)
                if st is not None and (st.st_dev, st.st_ino) in wanted:
                    held.setdefault((st.st_dev, st.st_ino), pid)
        return held

    def cleanup(self, killed_pids: Iterable[int]) -> ShmCleanup:
        """Unlink the recorded segments that only the killed processes held."""
        killed = set(killed_pids)
        held = self._held_elsewhere(killed)
        removed: list[ShmSegment] = []
        kept: dict[str, str] = {}
        for seg in list(self._segments.values()):
            st = _stat(seg.path)
            if st is None:
                del self._segments[seg.path]  # already unlinked (a clean shutdown)
                continue
            if (st.st_dev, st.st_ino) != (seg.dev, seg.inode):
                kept[seg.path] = "another file now has this name"
                del self._segments[seg.path]
                continue
            other = held.get((seg.dev, seg.inode))
            if other is not None:
                kept[seg.path] = f"still held by pid {other}, outside the killed tree"
                continue
            try:
                os.unlink(seg.path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                kept[seg.path] = f"unlink failed: {exc}"
                continue
            removed.append(ShmSegment(seg.path, seg.dev, seg.inode, st.st_size, seg.pids))
            del self._segments[seg.path]
        return ShmCleanup(tuple(removed), kept)


def _is_zombie_or_gone(pid: int, proc_root: str) -> bool:
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return True
    # the state follows the parenthesised command name, which may hold spaces
    close = data.rfind(b")")
    return close < 0 or data[close + 2:close + 3] in (b"Z", b"X")


__all__ = ["ShmCleanup", "ShmLedger", "ShmSegment", "shm_paths_of"]
