"""Helpers for the responder tests (a module of its own name, so that no
``conftest`` import clashes with another test folder's)."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import psutil

from soak.samples import GpuReading, GpuSample, GpuSource

TREE_APP = Path(__file__).with_name("tree_app.py")
ROLES = ("api", "engine", "worker0", "worker1", "worker2", "helper")


@dataclass(frozen=True)
class Decision:
    """Shaped like soak.detect's Decision (rule, kind, onset_at, decided_at, reasons, evidence)."""

    rule: str
    kind: str
    onset_at: float
    decided_at: float
    reasons: tuple[str, ...] = ()
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class FakeTarget:
    """The attributes of soak.run's Target that the responder reads."""

    base_url: str
    root_pid: int | None
    log_path: Path | None = None
    flight_recorder_pipe_stem: str | None = None


@dataclass
class Tree:
    popen: subprocess.Popen
    state: Path
    pids: dict[str, int]
    port: int
    log_path: Path
    pipe_stem: str
    dump_prefix: str

    @property
    def all_pids(self) -> set[int]:
        return set(self.pids.values())

    def alive(self) -> set[int]:
        return {pid for pid in self.all_pids if is_alive(pid)}

    def release_helper(self, timeout_s: float = 10.0) -> None:
        """Make worker 2 exit so its helper is orphaned; wait until it reparented."""
        (self.state / "release").write_text("1")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if psutil.Process(self.pids["helper"]).ppid() != self.pids["worker2"]:
                    return
            except psutil.NoSuchProcess:
                raise AssertionError("the helper died with its parent") from None
            time.sleep(0.02)
        raise AssertionError("worker 2 did not exit")


def is_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Reaper:
    """Remembers (pid, create_time) of what a test started and kills the leftovers."""

    def __init__(self) -> None:
        self._procs: list[psutil.Process] = []
        self._popens: list[subprocess.Popen] = []

    def add(self, pid: int) -> None:
        try:
            self._procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass

    def add_popen(self, popen: subprocess.Popen) -> None:
        self._popens.append(popen)
        self.add(popen.pid)

    def close(self) -> None:
        for proc in self._procs:
            try:
                if proc.is_running():  # psutil compares create_time: never a reused PID
                    proc.kill()
            except psutil.Error:
                pass
        for popen in self._popens:
            try:
                popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def wait_for(predicate, timeout_s: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class ListedGpus:
    """A GPU source speaking GpuSample: each GPU lists the PIDs placed on it that are
    still alive, and holds ``mib_per_pid`` of memory for each (as NVML would show)."""

    def __init__(self, placement: Mapping[int, list[int]], *, mib_per_pid: Mapping[int, float] | None = None,
                 default_mib: float = 2048.0) -> None:
        self.placement = {gpu: list(pids) for gpu, pids in placement.items()}
        self.mib_per_pid = dict(mib_per_pid or {})
        self.default_mib = default_mib
        self.idle_mib = 0.0  # what the GPU shows with no process (the driver's reservation)
        self.reads = 0

    async def read(self) -> GpuSample:
        self.reads += 1
        readings = []
        for index, pids in sorted(self.placement.items()):
            live = tuple(p for p in pids if is_alive(p))
            mem = self.idle_mib + sum(self.mib_per_pid.get(p, self.default_mib) for p in live)
            readings.append(GpuReading(index=index, util_pct=100.0 if live else 0.0, mem_used_mib=mem,
                                       mem_total_mib=24576.0, pids=live))
        return GpuSample(time.time(), GpuSource.NVML, tuple(readings))
