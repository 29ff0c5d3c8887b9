"""The API server's side of the process tree: starts the engine core, tracks its workers.

``ProcessTree.start()`` spawns ``python -m soak.sim.enginecore`` (which spawns
the workers) and waits for the worker PIDs. Pipeline activity becomes worker
states (busy / idle / spin / hold), sent only when it changes, so the workers
sleep between commands. Acks are tracked, so ``/sim/state`` tells a test when
every process ignores SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from soak.proc.belonging import Proof, TargetIdentity
from soak.proc.kill import kill_processes
from soak.proc.tree import ProcessTree as ProcessRecord
from soak.sim.config import SimConfig
from soak.sim.gpus import Activity
from soak.sim.logs import SimLog

START_TIMEOUT_S = 60.0


def worker_commands(activity: Activity, pp_size: int, decode_util_pct: float) -> list[dict[str, Any]]:
    """The state each rank should be in for a pipeline activity."""
    if activity in (Activity.PREFILL, Activity.PAUSE):
        return [{"state": "busy", "util": 1.0}] * pp_size
    if activity is Activity.DECODE:
        return [{"state": "busy", "util": decode_util_pct / 100.0}] * pp_size
    if activity is Activity.PP_DEADLOCK:
        return [{"state": "spin"}] * (pp_size - 1) + [{"state": "hold"}]
    return [{"state": "idle"}] * pp_size


class ProcessTree:
    def __init__(self, config: SimConfig, *, log: SimLog | None = None) -> None:
        self.config = config
        self.log = log
        self._proc: asyncio.subprocess.Process | None = None
        self._workers: list[int] = []
        self.worker_states: list[str | None] = [None] * config.pp_size
        self.engine_ignores_sigterm = False
        self._sent: list[dict] = []
        self._reader_task: asyncio.Task | None = None
        self._ready = asyncio.Event()
        self._crashed = False
        self._closed = False
        self._orphans = False
        # The engine core and its workers with their start times, for the one kill path.
        self._record = ProcessRecord()

    async def start(self) -> None:
        c = self.config
        status_r, status_w = os.pipe()
        cmd = [sys.executable, "-m", "soak.sim.enginecore", "--pp-size", str(c.pp_size), "--status-fd", str(status_w),
               "--worker-backend", c.worker_backend, "--title-prefix", c.process_name_prefix]
        if c.worker_own_session is not None:
            cmd += ["--worker-own-session", str(c.worker_own_session)]
        env = {**os.environ, "SOAK_SIM_LOG_COLOR": "1" if c.profile.ansi_log_prefix else "0"}
        self._proc = await asyncio.create_subprocess_exec(*cmd, stdin=asyncio.subprocess.PIPE, pass_fds=(status_w,), env=env)
        os.close(status_w)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(status_r, "rb"))
        self._reader_task = asyncio.create_task(self._read_status(reader))
        try:
            await asyncio.wait_for(self._ready.wait(), START_TIMEOUT_S)
        except asyncio.TimeoutError:
            await self.close()
            raise RuntimeError("the simulated engine core did not start its workers") from None
        await asyncio.to_thread(self._record.snapshot, self._proc.pid)
        self._sent = worker_commands(Activity.IDLE, c.pp_size, c.decode_util_pct)

    async def _read_status(self, reader: asyncio.StreamReader) -> None:
        while True:
            line = await reader.readline()
            if not line:
                self._ready.set()
                return
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "workers" in msg:
                self._workers = [int(p) for p in msg["workers"]]
            elif msg.get("ack") == "engine":
                self.engine_ignores_sigterm = True
            elif isinstance(msg.get("ack"), int) and 0 <= msg["ack"] < len(self.worker_states):
                self.worker_states[msg["ack"]] = msg.get("state")
            if self._workers and all(s is not None for s in self.worker_states):
                self._ready.set()  # every worker is titled and listening

    def _send(self, obj: dict) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.returncode is not None or self._crashed:
            return
        try:
            proc.stdin.write((json.dumps(obj) + "\n").encode())
        except (OSError, RuntimeError):
            pass

    # ---- what the server asks
    def set_activity(self, activity: Activity) -> None:
        wanted = worker_commands(activity, self.config.pp_size, self.config.decode_util_pct)
        if wanted == self._sent:
            return
        if all(w == wanted[0] for w in wanted) and len(set(json.dumps(s) for s in self._sent)) <= 1:
            self._send({"workers": wanted[0]})
        else:
            for rank, (old, new) in enumerate(zip(self._sent, wanted)):
                if old != new:
                    self._send({"rank": rank, "worker": new})
        self._sent = wanted

    def leave_orphans(self) -> None:
        """The API server is leaving without its hung children: the engine core is
        killed (vLLM's shutdown gives up on it), hung workers stay, reparented."""
        self._orphans = True

    def ignore_sigterm(self) -> None:
        self._send({"ignore_sigterm": True})

    async def crash_engine_core(self, code: int = 1) -> None:
        """The engine core dies (its workers with it)."""
        self._send({"exit": code})
        self._crashed = True
        if self._proc is not None:
            try:
                await asyncio.wait_for(self._proc.wait(), 10.0)
            except asyncio.TimeoutError:
                self._proc.kill()

    def engine_core_pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def worker_pids(self) -> list[int | None]:
        if not self._workers:
            return [None] * self.config.pp_size
        return list(self._workers)

    def workers_alive(self) -> list[bool]:
        out = []
        for pid in self.worker_pids():
            out.append(pid is not None and _alive(pid))
        return out

    def returncode(self) -> int | None:
        return self._proc.returncode if self._proc is not None else None

    def snapshot(self) -> dict[str, Any]:
        return {
            "worker_states": list(self.worker_states),
            "engine_ignores_sigterm": self.engine_ignores_sigterm,
            "engine_core_returncode": self.returncode(),
        }

    async def close(self) -> None:
        """Healthy shutdown: workers exit, then the engine core; stragglers are killed."""
        if self._closed:
            return
        self._closed = True
        proc = self._proc
        if self.engine_ignores_sigterm and proc is not None:  # hung: nobody would leave on request
            if self._orphans:
                if proc.returncode is None:
                    proc.kill()  # the engine core alone: its hung workers stay behind, reparented
            else:
                members = await asyncio.to_thread(self._record.snapshot, proc.pid)
                # Our own children, proven by the record (the call had no target and raised TypeError).
                ours = TargetIdentity(Proof.LAUNCHED, members=self._record.pins())
                await asyncio.to_thread(kill_processes, members, target=ours, timeout_s=5.0)
        if proc is not None and proc.returncode is None:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
            except (OSError, RuntimeError):
                pass
            try:
                await asyncio.wait_for(proc.wait(), 8.0)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
        if self._reader_task is not None:
            self._reader_task.cancel()
            try:
                await self._reader_task
            except (asyncio.CancelledError, Exception):
                pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False
