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


def Decision(rule: str, kind: str, onset_at: float, decided_at: float, reasons: tuple[str, ...] = (),
             evidence: Mapping[str, Any] | None = None):
    """The detector's own Decision record (soak.records), as the run loop hands it over."""
    from soak.records import Decision as DetectorDecision, IncidentKind

    return DetectorDecision(rule=rule, kind=IncidentKind(kind), onset_at=onset_at, decided_at=decided_at,
                            reasons=tuple(reasons), evidence=dict(evidence or {}))


@dataclass
class FakeTarget:
    """The attributes of soak.run's Target that the responder reads."""

    base_url: str
    root_pid: int | None
    log_path: Path | None = None
    flight_recorder_pipe_stem: str | None = None
    identity: None = None  # not checked at start: the responder takes root_pid as given


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


# --- soak run as a real subprocess, watched from outside ------------------------------


def sim_state(base_url: str) -> dict | None:
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(base_url + "/sim/state", timeout=2) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


@dataclass
class Watched:
    """What a watcher saw of the target while ``soak run`` ran."""

    pids: set[int] = field(default_factory=set)         # every process seen in a target tree
    sessions: dict[int, int] = field(default_factory=dict)  # pid -> session id
    roots: list[int] = field(default_factory=list)      # root PIDs, in order (restarts)
    hung_ignoring_sigterm: bool = False                 # seen: deadlock on, every process ignoring SIGTERM
    returncode: int | None = None
    stderr: str = ""


class SoakRunWatcher:
    """Runs ``soak run CONFIG --out DIR`` and, in a thread, records the target's
    tree as it goes (root from events.jsonl or given, its descendants, and the
    simulator's own process list), so a test can check every PID it ever saw."""

    def __init__(self, reaper: "Reaper", config_path: Path, run_dir: Path, *, base_url: str | None = None,
                 root_pid: int | None = None) -> None:
        import sys
        import threading

        self.run_dir = run_dir
        self.reaper = reaper
        self.seen = Watched()
        self._base_url = base_url
        self._fixed_root = root_pid
        self._done = threading.Event()
        self._out = open(run_dir.parent / f"{run_dir.name}.out", "w")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "soak", "run", str(config_path), "--out", str(run_dir), "--no-html"],
            stdout=self._out, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        reaper.add_popen(self.popen)
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _roots(self) -> list[tuple[int, str]]:
        import json

        if self._fixed_root is not None:
            return [(self._fixed_root, self._base_url or "")]
        out = []
        try:
            for line in (self.run_dir / "events.jsonl").read_text().splitlines():
                event = json.loads(line)
                if event.get("type") in ("target_ready", "restart_done") and event.get("root_pid"):
                    out.append((event["root_pid"], event.get("base_url") or self._base_url or ""))
                if event.get("type") == "target_ready" and event.get("base_url"):
                    self._base_url = event["base_url"]
        except (OSError, ValueError):
            pass
        return out

    def _remember(self, proc: psutil.Process) -> None:
        if proc.pid not in self.seen.pids:
            self.seen.pids.add(proc.pid)
            self.reaper.add(proc.pid)
            try:
                self.seen.sessions[proc.pid] = os.getsid(proc.pid)
            except OSError:
                pass

    def _watch(self) -> None:
        deadline = time.monotonic() + 120
        while not self._done.is_set() and time.monotonic() < deadline:
            for root, _ in self._roots():
                if root not in self.seen.roots:
                    self.seen.roots.append(root)
                try:
                    proc = psutil.Process(root)
                    for p in [proc, *proc.children(recursive=True)]:
                        if p.status() != psutil.STATUS_ZOMBIE:
                            self._remember(p)
                except psutil.Error:
                    pass
            state = sim_state(self._base_url) if self._base_url else None
            if state:
                procs = state.get("processes", {})
                for pid in [procs.get("api_server"), procs.get("engine_core"), *procs.get("workers", [])]:
                    if pid:
                        try:
                            self._remember(psutil.Process(pid))
                        except psutil.Error:
                            pass
                tree = state.get("tree") or {}
                states = tree.get("worker_states") or []
                if (state.get("fault", {}).get("active") and tree.get("engine_ignores_sigterm")
                        and states and all(s in ("spin", "hold") for s in states)):
                    self.seen.hung_ignoring_sigterm = True
            time.sleep(0.05)

    def wait(self, timeout_s: float = 90.0) -> Watched:
        try:
            _, self.seen.stderr = self.popen.communicate(timeout=timeout_s)
        finally:
            self._done.set()
            self._thread.join(timeout=5)
            self._out.close()
        self.seen.returncode = self.popen.returncode
        return self.seen
