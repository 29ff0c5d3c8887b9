"""The guardian: a small process that outlives the harness and takes the server
it launched down with it.

A harness killed with SIGKILL (the OOM killer, a CI job's hard timeout) runs no
cleanup; the server it launched lives in its own session and would keep the GPUs.
So before the first launch the harness starts ``python -m soak.run.guardian``
in a session of its own, holding the read end of a pipe whose only write end is
in the harness. The harness sends one JSON line per launched root
(``{"watch": pid, "create_time": t}``); the guardian walks the descendants of
every root and of every process it has already seen, every ``--interval``
seconds, and keeps each one with its start time (a worker that calls
``setsid()`` or whose parent dies is still in the record). When the pipe reads
EOF without a ``{"done": true}`` first (the harness died), or its parent is
gone, it SIGSTOPs and then SIGKILLs every recorded process that still has its
recorded start time, plus children forked meanwhile and any process carrying
the run's ownership marker in its environment, and exits.

Why a process and not only ``PR_SET_PDEATHSIG``: the death signal reaches only
the direct child (the API server), fires when the parent *thread* exits, and is
cleared by the child's own exec of a setuid binary; the engine core and the
workers below it would reparent and live on (vllm#55510). A subreaper would
collect those orphans only while the subreaper is alive, and the harness is the
one that died. The guardian records the tree from outside and needs nothing of
the server's cooperation. It keeps the record and kills through the responder's
own ``soak.proc`` (one light /proc pass per walk), so it never signals PID 0 or
1, itself, or any of its own ancestors.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from soak.proc.belonging import Proof, TargetIdentity
from soak.proc.cgroup import Cgroup
from soak.proc.kill import kill_processes  # the one kill path of the target's tree
from soak.proc.read import pin_of
from soak.proc.snapshots import ProcSnapshots
from soak.proc.tree import ProcessTree  # the one record of the target's tree
from soak.run.signals import INTERRUPT_SIGNALS


def kill_all(tree: ProcessTree, marker: tuple[str, str] | None, cgroup: Cgroup | None = None) -> list[int]:
    """SIGSTOP then SIGKILL every recorded process still alive, the children
    forked meanwhile, every process carrying the ownership marker, and every
    member of the target's cgroup (one that scrubbed its environment)."""
    tree.snapshot(None, fresh=True)
    if marker is not None:
        tree.find_marked(marker)
    if cgroup is not None:
        tree.adopt(cgroup.pids(), via="cgroup")
    target = TargetIdentity(Proof.LAUNCHED, marker=marker[1] if marker is not None else None, members=tree.pins(),
                            cgroup=cgroup.name if cgroup is not None else None)
    killed = list(kill_processes(tree.known(), target=target, timeout_s=2.0).killed_pids)
    if cgroup is not None:
        for _ in range(50):  # the last member's exit lets go of the cgroup a moment after it is gone
            if cgroup.remove() or cgroup.pids():
                break
            time.sleep(0.02)
    return killed


def serve(stream: IO[bytes], *, parent: int, interval: float, marker: tuple[str, str] | None,
          log: IO[str] | None = None, reader: ProcSnapshots | None = None) -> int:
    # Its own process, so its own reader: a walk every ``interval`` reads /proc afresh.
    tree = ProcessTree(reader=reader if reader is not None else ProcSnapshots(max_age_s=0))
    cgroup: Cgroup | None = None
    buf = b""
    fd = stream.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], interval)
        if ready:
            data = os.read(fd, 65536)
            if not data:
                break  # EOF: the harness is gone (or closed without saying done)
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if msg.get("done"):
                    return 0
                if isinstance(msg.get("watch"), int):
                    tree.watch(msg["watch"], create_time=msg.get("create_time"))
                if isinstance(msg.get("cgroup"), str) and isinstance(msg.get("name"), str):
                    cgroup = Cgroup(Path(msg["cgroup"]), msg["name"])
        if os.getppid() != parent:
            break  # reparented: the harness died without its pipe closing (inherited fd)
        tree.snapshot(None)  # every known process's children: a worker is recorded before it can be orphaned
    killed = kill_all(tree, marker, cgroup)
    if log is not None:
        print(f"soak guardian: harness {parent} gone; SIGKILL to {len(killed)} processes: {killed}",
              file=log, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m soak.run.guardian")
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--marker", default=None, help="NAME=VALUE: the ownership marker in the server's env")
    args = parser.parse_args(argv)
    for sig in INTERRUPT_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # a Ctrl-C to the terminal is the harness's to handle
    marker = tuple(args.marker.split("=", 1)) if args.marker and "=" in args.marker else None
    return serve(sys.stdin.buffer, parent=args.parent, interval=args.interval, marker=marker,  # type: ignore[arg-type]
                 log=sys.stderr)


class Guardian:
    """The harness's side: ``start()``, ``watch(pid)`` per launched root, ``close()``."""

    def __init__(self, *, marker: tuple[str, str] | None = None, interval_s: float = 0.5,
                 log_path: str | None = None) -> None:
        self._marker = marker
        self._interval = interval_s
        self._log_path = log_path
        self._proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        if self._proc is not None:
            return
        cmd = [sys.executable, "-m", "soak.run.guardian", "--parent", str(os.getpid()),
               "--interval", str(self._interval)]
        if self._marker is not None:
            cmd += ["--marker", f"{self._marker[0]}={self._marker[1]}"]
        log = open(self._log_path, "ab") if self._log_path else subprocess.DEVNULL
        try:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log,
                start_new_session=True,  # a kill of the harness's process group spares it
                close_fds=True,
            )
        finally:
            if log is not subprocess.DEVNULL:
                log.close()

    def watch(self, pid: int) -> None:
        pin = pin_of(pid)
        if pin is not None:
            self._send({"watch": pid, "create_time": pin.create_time})

    def watch_cgroup(self, cgroup: Cgroup) -> None:
        """The launched server's cgroup: its members die with the harness too."""
        self._send({"cgroup": str(cgroup.path), "name": cgroup.name})

    def _send(self, msg: dict) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdin.closed:
            return
        try:
            proc.stdin.write((json.dumps(msg) + "\n").encode())
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def close(self) -> None:
        """The harness stopped its servers itself: the guardian leaves without killing."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None and not proc.stdin.closed:
            try:
                proc.stdin.write(b'{"done": true}\n')
                proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())
