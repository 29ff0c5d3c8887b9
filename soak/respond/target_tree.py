"""Who the target is, for the responder: its process tree as recorded over the
run, the /dev/shm segments that tree holds, and what proves a process is the
target's (``soak.proc.belonging``).

A server given by URL alone is found by the listener on its loopback port; that
listener is read with one request held open through the port, so a forwarder in
front of the server (a proxy, a tunnel) shows its upstream connection and is
refused as a kill target.
"""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from soak.errors import TargetMismatch
from soak.proc.belonging import Proof, Reason, TargetIdentity, decide
from soak.proc.facts import Member, Pin, ProcTable
from soak.proc.read import ProcReader, find_listener, running
from soak.proc.shm import ShmLedger
from soak.proc.snapshots import ProcSnapshots
from soak.proc.tree import ProcessTree
from soak.samples import GpuSample

_LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


class TargetLike(Protocol):
    """What the responder reads of soak.run's Target."""

    base_url: str
    root_pid: int | None
    # The root process as checked at start (None: not checked, e.g. attached without a PID).
    identity: Pin | None
    log_path: Path | None
    flight_recorder_pipe_stem: str | None


class TargetTree:
    """The target's processes as the responder knows them. The /proc reads are
    blocking: callers on the event loop run them in a thread."""

    def __init__(self, target: TargetLike, *, marker: tuple[str, str] | None, find_root_by_port: bool,
                 proc: ProcSnapshots) -> None:
        self.target = target
        self.marker = marker
        self._find_root_by_port = find_root_by_port
        # The /proc reader this process's users share (the process probe's too, through wiring).
        self.proc = proc
        self.tree = ProcessTree(reader=proc)
        # /dev/shm segments the tree held, removed after its SIGKILL (soak/proc/shm.py)
        self.shm = ShmLedger()
        self.root_lost: str | None = None

    def root_pid(self) -> int | None:
        pid = self.target.root_pid
        identity = self.target.identity
        if pid is not None and identity is not None and identity.pid == pid and not running(identity):
            # The process checked at start is gone; its number may be a stranger's now.
            self.root_lost = f"root pid {pid} is no longer the process checked at start (gone or reused): not adopted"
            return None
        if pid is None and self._find_root_by_port:
            port = _loopback_port(self.target.base_url)
            if port is not None:
                pid = find_listener(port)
        return pid

    def track(self) -> tuple[Member, ...]:
        """One snapshot of the target's tree and of the /dev/shm segments it holds (blocking /proc reads)."""
        alive = self.tree.snapshot(self.root_pid())
        self.shm.record(info.pid for info in alive)
        return alive

    def identity(self) -> TargetIdentity:
        """What proves a process is the target's, for ``belonging.decide``: the
        run's marker for a server the harness started; the PID checked at start
        for an attached one; else the listener on the URL's loopback port (never
        a forwarder), or nothing at all."""
        members = self.tree.pins()
        pinned = self.target.identity
        root = Pin(pinned.pid, pinned.create_time) if pinned is not None else None
        if self.marker is not None:
            cgroup = getattr(self.target, "cgroup", None)
            return TargetIdentity(Proof.LAUNCHED, marker=self.marker[1], root=root, members=members,
                                  session=root.pid if root is not None else None,
                                  cgroup=cgroup.name if cgroup is not None else None)
        if root is not None:
            return TargetIdentity(Proof.ATTACHED_PID, root=root, members=members)
        port = _loopback_port(self.target.base_url) if self._find_root_by_port else None
        return TargetIdentity(Proof.ATTACHED_URL, port=port, members=members if port is not None else frozenset())

    def check_kill_target(self, reader: ProcReader | None = None) -> None:
        """An attached server given by URL alone: the listener on its port must be
        the server, not a forwarder (a proxy, a tunnel) in front of it. The check
        holds one HTTP request open through the port, so a forwarder has its
        upstream connection open while /proc is read. Refused with one line
        (exit 3) rather than run with a kill aimed at the wrong process."""
        identity = self.identity()
        if identity.proof is not Proof.ATTACHED_URL or identity.port is None:
            return
        with _held_request(identity.port):
            table = (reader or self.proc.full)()
        for listener in table.listeners(identity.port):
            verdict = decide(listener.pid, listener.create_time, table, identity)
            if verdict.reason is Reason.FORWARDER:
                raise TargetMismatch(
                    f"target.base_url {self.target.base_url}: {verdict.detail}; give target.pid naming the "
                    "real server, or set response.find_root_by_port: false to run with no kill target"
                )

    def claim_gpu_processes(self, sample: GpuSample | None) -> set[int]:
        """Add the GPU processes that belong to the target; return those that do not."""
        if sample is None:
            return set()
        foreign: set[int] = set()
        for gpu in sample.gpus:
            for pid in gpu.pids:
                if self.tree.claim(pid, via="gpu", marker=self.marker) is None:
                    foreign.add(pid)
        return foreign

    def adopt_marked(self) -> None:
        """A launched target: every process carrying the run's marker, and every
        member of its cgroup (one that scrubbed its environment is still there)."""
        if self.marker is None:
            return
        self.tree.find_marked(self.marker)
        cgroup = getattr(self.target, "cgroup", None)
        if cgroup is not None:
            self.tree.adopt(cgroup.pids(), via="cgroup")

    def kill_reader(self, identity: TargetIdentity) -> ProcReader:
        """For a server found by its port, each reading is taken with a request held
        open through that port: a forwarder then shows its upstream connection even
        when no stream of the run is in flight."""
        port = identity.port
        if identity.proof is not Proof.ATTACHED_URL or port is None:
            return self.proc.full

        def read() -> ProcTable:
            with _held_request(port, timeout_s=0.5):
                return self.proc.full()

        return read

    def shm_releasable(self) -> set[int] | None:
        """After the target stopped: the PIDs whose /dev/shm segments may go, or
        None while any process of the tree (or holding a segment) still runs."""
        if not self.shm.segments():
            return None
        members = self.tree.known()
        if any(running(info.pin) for info in members):
            return None
        pids = {pid for seg in self.shm.segments() for pid in seg.pids} | {info.pid for info in members}
        if any(same_process_pid(pid) for pid in pids):
            return None
        return pids


def same_process_pid(pid: int) -> bool:
    """Whether ``pid`` is a live, non-zombie process (PID reuse makes this conservative)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@contextlib.contextmanager
def _held_request(port: int, timeout_s: float = 2.0):
    """One ``GET /health`` sent to 127.0.0.1:``port`` and its answer's first bytes
    read, the connection kept open for the body of the ``with``."""
    sock = None
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: keep-alive\r\n\r\n".encode())
        sock.recv(1024)
    except OSError:
        pass  # the reading below judges what it sees; a dead port shows no listener
    try:
        yield
    finally:
        if sock is not None:
            sock.close()


def _loopback_port(base_url: str) -> int | None:
    try:
        parts = urlsplit(base_url)
    except ValueError:
        return None
    if parts.hostname not in _LOOPBACK:
        return None
    if parts.port is not None:
        return parts.port
    return 443 if parts.scheme == "https" else 80
