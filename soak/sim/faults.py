"""Injectable faults: when they fire (seeded) and what they do to the server.

Each configured fault fires once, at the first of its triggers: ``at``
(simulated seconds after start-up), ``after_requests`` (when request N+1
arrives), or a draw from an exponential with mean ``mtbf`` (seeded by the
config's seed and the fault's position). A ``pp_deadlock`` or
``all_idle_deadlock`` due by ``at``, ``mtbf`` or ``wall_mtbf`` while the engine
idles fires with its next step (the real ones happen in a forward pass); ``after_requests`` fires as request
N+1 arrives, and ``POST /sim/fault`` at once, whatever the engine does. ``pp_deadlock`` also takes
``wall_mtbf``: the same draw in wall seconds from the first request, the
harness's time at risk, untouched by ``time_scale`` (a simulated build's hang
rate for ``soak bisect``). ``POST /sim/fault`` fires one now.
The onset's wall time is published in ``/sim/state`` so benches can compute
detection latency.

What each does (log lines as FACTS.md, intervals scaled by time_scale):

- ``pp_deadlock``: no more engine steps; stages 0..pp-2 spin (100%), the last
  stage idles (0%); every process ignores SIGTERM. With ``jit_kernel`` the last
  stage first logs vLLM's jit_monitor line for it. The engine core prints the
  shm-broadcast message every ``ringbuffer_warning_interval`` (the fault's,
  else the server's: VLLM_RINGBUFFER_WARNING_INTERVAL, default 60 s); after
  ``watchdog_timeout`` each spinning rank prints PyTorch's watchdog lines;
  after ``execute_timeout`` the engine core prints ``TimeoutError: RPC call to
  execute_model timed out.`` (``sample_tokens`` as 0.33) and the API server
  ``EngineDeadError``; /health then answers 503 and about 5 s later the API
  server shuts itself down (connection refused) unless
  ``keep_alive_on_engine_death``; the hung engine core's workers linger as orphans.
- ``all_idle_deadlock``: no more steps, every GPU 0%, shm message every interval.
- ``crash``: the engine core dies, EngineDeadError, /health 503, and after
  ``exit_delay`` (default: the server's ``engine_death_shutdown``, 5 s) the API
  server exits with ``exit_code``, unless ``keep_alive_on_engine_death``.
- ``slow``: one healthy pause of ``pause`` (every stage busy, no tokens).
- ``metrics_stall``: /metrics stops answering (for ``duration``, or for good).
- ``corrupt_output``, ``corrupt_then_deadlock``, ``lying_usage``, ``other_model``,
  ``replay``, ``collapse``: the server answers, wrongly (``soak.sim.claims``).
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError

from soak.sim.config import (
    FAULT_KINDS,
    AllIdleDeadlockFault,
    CorruptOutputFault,
    CrashFault,
    FaultConfig,
    MetricsStallFault,
    PpDeadlockFault,
    SlowFault,
)
from soak.sim import claims
from soak.sim.gpus import Activity

if TYPE_CHECKING:
    from soak.sim.server import SimServer

_FAULT_ADAPTER: TypeAdapter = TypeAdapter(FaultConfig)

SHM_MESSAGE = (
    "No available shared memory broadcast block found in {secs} seconds. This typically happens "
    "when some processes are hanging or doing some time-consuming work (e.g. compilation, "
    "weight/kv cache quantization)."
)
# vLLM's jit_monitor (a warning; 0.32's vllm/utils/jit_monitor.py words it so).
JIT_MESSAGE = ("Triton kernel JIT compilation during inference: {kernel}. This causes a latency spike; "
               "consider extending warmup to cover this shape/config.")
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."


def parse_fault(data: Any) -> FaultConfig:
    """A fault from JSON; an unknown kind says which kinds exist."""
    if isinstance(data, dict) and data.get("kind") not in FAULT_KINDS:
        raise ValueError(f"unknown kind {data.get('kind')!r}, known: {', '.join(FAULT_KINDS)}")
    try:
        return _FAULT_ADAPTER.validate_python(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"][1:]) or "fault"
        raise ValueError(f"{where}: {first['msg']}") from exc


def _prefixed(log, who: str, pid: int, lines: tuple[str, ...]) -> str:
    """A traceback as vLLM's workers print it: every line carries ``(who pid=N)``."""
    return "".join(f"{log.prefix(who, pid)}{line}\n" for line in lines)


class _Armed:
    def __init__(self, spec: FaultConfig, due_at: float | None) -> None:
        self.spec = spec
        self.due_at = due_at  # simulated seconds, or None (only after_requests)
        self.wall_due: float | None = None  # wall seconds after the first request (wall_mtbf)
        self.fired = False
        self.active = False
        self.onset_at: float | None = None  # unix wall seconds
        self.ended_at: float | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.spec.kind,
            "active": self.active,
            "fired": self.fired,
            "onset_at": self.onset_at,
            "ended_at": self.ended_at,
            "due_at_sim": self.due_at,
            "after_requests": self.spec.after_requests,
            "due_after_first_request_wall_s": self.wall_due,
        }


def _wall_seed(seed: int, position: int, launch: int) -> str:
    """The wall_mtbf draw's seed: launch 0 as the config's seed alone gives it, a restart its own."""
    return f"soak-sim-fault/{seed}/{position}/wall" + (f"/{launch}" if launch else "")


class FaultController:
    def __init__(self, server: "SimServer") -> None:
        self.server = server
        self.armed: list[_Armed] = []
        for i, spec in enumerate(server.config.faults):
            due = [t for t in (spec.at,) if t is not None]
            if spec.mtbf is not None:
                due.append(random.Random(f"soak-sim-fault/{server.config.seed}/{i}").expovariate(1.0 / spec.mtbf))
            wall = getattr(spec, "wall_mtbf", None)
            if not due and spec.after_requests is None and wall is None:
                due.append(0.0)
            self.armed.append(_Armed(spec, min(due) if due else None))
            # wall seconds after the first request (None: no such trigger)
            self.armed[-1].wall_due = (None if wall is None else
                                       random.Random(_wall_seed(server.config.seed, i, server.config.launch)).expovariate(1.0 / wall))
        self._tasks: set[asyncio.Task] = set()
        self.ignore_sigterm = False

    # ---- triggers
    def start(self) -> None:
        for armed in self.armed:
            if armed.due_at is not None:
                self._spawn(self._fire_when_due(armed))

    async def _fire_when_due(self, armed: _Armed) -> None:
        await self.server.sleep_sim(armed.due_at - self.server.sim_now())
        await self._in_a_step(armed)
        if not armed.fired:
            self.fire(armed)

    async def _fire_after_wall(self, armed: _Armed) -> None:
        await asyncio.sleep(armed.wall_due)  # wall seconds: time_scale compresses the server's work, not this
        await self._in_a_step(armed)
        if not armed.fired:
            self.fire(armed)

    async def _in_a_step(self, armed: _Armed) -> None:
        """A deadlock happens inside a forward pass: one due while the engine idles
        (before the load, between an agent's turns) fires with the next step, so its
        onset is never a moment no request could have seen (as the replay recorder,
        tests/fixtures/traces/make.py, has it)."""
        if isinstance(armed.spec, (PpDeadlockFault, AllIdleDeadlockFault, CorruptOutputFault)):
            await self.server.stepping.wait()  # a misalignment too: it is in the step's sampled tokens

    def on_request(self, number: int) -> None:
        if number == 1:  # load has started: the harness's time at risk runs from here
            for armed in self.armed:
                if armed.wall_due is not None and not armed.fired:
                    self._spawn(self._fire_after_wall(armed))
        for armed in self.armed:
            n = armed.spec.after_requests
            if n is not None and not armed.fired and number > n:
                self.fire(armed)

    def inject(self, data: Any) -> dict[str, Any]:
        return self.fire_spec(parse_fault(data)).describe()

    def fire_spec(self, spec: FaultConfig) -> _Armed:
        """Fire ``spec`` now, listed in /sim/state (a fault's second act: corrupt_then_deadlock)."""
        armed = _Armed(spec, None)
        self.armed.append(armed)
        self.fire(armed)
        return armed

    def spawn(self, coro) -> None:
        self._spawn(coro)

    def finish(self, armed: _Armed) -> None:
        self._finish(armed)

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass

    # ---- state
    def describe(self) -> dict[str, Any]:
        for armed in self.armed:
            if armed.active:
                return armed.describe()
        for armed in reversed(self.armed):
            if armed.fired:
                return armed.describe()
        if self.armed:
            return self.armed[0].describe()
        return {"kind": None, "active": False, "fired": False, "onset_at": None}

    def describe_all(self) -> list[dict[str, Any]]:
        return [a.describe() for a in self.armed]

    # ---- effects
    def fire(self, armed: _Armed) -> None:
        server = self.server
        armed.fired = True
        armed.active = True
        armed.onset_at = server.clock.now()
        spec = armed.spec
        server.log.info("sim/faults.py:1", f"simulator: fault {spec.kind} fires", who="SimFault")
        if isinstance(spec, PpDeadlockFault):
            server.frozen = True
            self.ignore_sigterm = True
            server.set_activity(Activity.PP_DEADLOCK)
            if server.tree is not None:
                server.tree.ignore_sigterm()
            self._spawn(self._pp_deadlock(armed, spec))
        elif isinstance(spec, AllIdleDeadlockFault):
            server.frozen = True
            server.set_activity(Activity.ALL_IDLE_DEADLOCK)
            self._spawn(self._shm_messages(self._ringbuffer_interval(spec), None))
        elif isinstance(spec, CrashFault):
            self._spawn(self._crash(armed, spec))
        elif isinstance(spec, SlowFault):
            server.pause_until = server.sim_now() + spec.pause
            server.on_pause_end = lambda: self._finish(armed)
            server.wake()
            self._spawn(self._end_after(armed, spec.pause))
        elif isinstance(spec, MetricsStallFault):
            server.metrics_stalled = True
            if spec.duration is not None:
                self._spawn(self._end_metrics_stall(armed, spec.duration))
        elif isinstance(spec, claims.OUTPUT_FAULTS):
            claims.fire(self, armed, spec)

    async def _end_after(self, armed: _Armed, seconds: float) -> None:
        await self.server.sleep_sim(seconds)
        self._finish(armed)

    def _finish(self, armed: _Armed) -> None:
        if armed.active:
            armed.active = False
            armed.ended_at = self.server.clock.now()

    async def _end_metrics_stall(self, armed: _Armed, seconds: float) -> None:
        await self._end_after(armed, seconds)
        self.server.metrics_stalled = False

    def _engine_core_pid(self) -> int:
        tree = self.server.tree
        pid = tree.engine_core_pid() if tree is not None else None
        return pid if pid is not None else self.server.log.pid

    def _worker_pid(self, rank: int) -> int:
        pids = self.server.worker_pids()
        pid = pids[rank] if rank < len(pids) else None
        return pid if pid is not None else self.server.log.pid

    def _ringbuffer_interval(self, spec: PpDeadlockFault | AllIdleDeadlockFault) -> float:
        """The fault's own interval, else the server's (VLLM_RINGBUFFER_WARNING_INTERVAL)."""
        own = spec.ringbuffer_warning_interval
        return self.server.config.ringbuffer_interval_s if own is None else own

    async def _shm_messages(self, interval: float, until: float | None) -> None:
        """The shm-broadcast message every interval, from the engine core, until ``until`` (sim s)."""
        server = self.server
        if interval <= 0:
            return
        waited = 0.0
        while until is None or waited + interval < until:
            await server.sleep_sim(interval)
            waited += interval
            server.log.info(
                "shm_broadcast.py:466",
                SHM_MESSAGE.format(secs=f"{interval:g}"),
                who="EngineCore_DP0",
                pid=self._engine_core_pid(),
            )

    async def _pp_deadlock(self, armed: _Armed, spec: PpDeadlockFault) -> None:
        """One timeline, so lines due at the same moment keep their real order."""
        server = self.server
        start = server.sim_now()
        events: list[tuple[float, int, str]] = []
        if spec.jit_kernel:
            last = server.config.pp_size - 1
            server.log.warning("jit_monitor.py:140", JIT_MESSAGE.format(kernel=spec.jit_kernel),
                               who=f"Worker_PP{last}", pid=self._worker_pid(last))
        interval = self._ringbuffer_interval(spec)
        if interval > 0:
            k = 1
            while k * interval < spec.execute_timeout:
                events.append((k * interval, 0, "shm"))
                k += 1
        if spec.watchdog_timeout < spec.execute_timeout:
            events.append((spec.watchdog_timeout, 1, "watchdog"))
        events.append((spec.execute_timeout, 2, "dead"))
        events.sort()
        for at, _, what in events:
            await server.sleep_sim(start + at - server.sim_now())
            if what == "shm":
                self._log_shm(interval)
            elif what == "watchdog":
                self._log_watchdog(spec)
            else:
                self._log_rpc_timeout(spec.rpc_method or ("execute_model" if server.config.vllm_version.startswith("0.11") else "sample_tokens"))
                self._engine_dead()
                await server.shutdown_after_engine_death(delay=server.config.engine_death_shutdown, code=0, orphans=True)

    def _log_shm(self, interval: float) -> None:
        self.server.log.info(
            "shm_broadcast.py:466",
            SHM_MESSAGE.format(secs=f"{interval:g}"),
            who="EngineCore_DP0",
            pid=self._engine_core_pid(),
        )

    def _log_watchdog(self, spec: PpDeadlockFault) -> None:
        log = self.server.log
        ran_ms = int(spec.watchdog_timeout * 1000) + 12
        timeout_ms = int(spec.watchdog_timeout * 1000)
        seq = spec.seq_id
        for rank in range(self.server.config.pp_size - 1):  # the last rank never joined the broadcast
            who, pid = f"Worker_PP{rank}", self._worker_pid(rank)
            pg = f"[PG ID 8 PG GUID 85(pp_broadcast) Rank {rank}]"
            log.nccl(
                rank,
                f"{pg} Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=BROADCAST, "
                f"NumelIn=6, NumelOut=6, Timeout(ms)={timeout_ms}) ran for {ran_ms} milliseconds before timing out.",
                who=who,
                pid=pid,
            )
            log.nccl(
                rank,
                f"{pg} failure detected by watchdog at work sequence id: {seq} PG status: last enqueued work: "
                f"{seq + 5}, last started work: -1, last completed work: {seq - 1}",
                where="ProcessGroupNCCL.cpp:2271",
                who=who,
                pid=pid,
            )

    def _log_rpc_timeout(self, method: str) -> None:
        log = self.server.log
        core = self._engine_core_pid()
        log.error("core.py:710", "EngineCore encountered a fatal error.", who="EngineCore_DP0", pid=core)
        log.raw(
            _prefixed(self.server.log, "EngineCore_DP0", core, (
                "Traceback (most recent call last):",
                '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 701, in run_engine_core',
                "    engine_core.run_busy_loop()",
                '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/executor/multiproc_executor.py", line 262, in get_response',
                '    raise TimeoutError(f"RPC call to {method} timed out.") from e',
                f"TimeoutError: RPC call to {method} timed out.",
            ))
        )

    def _engine_dead(self) -> None:
        server = self.server
        server.log.error("async_llm.py:480", "AsyncLLM output_handler failed.")
        server.log.raw(
            _prefixed(server.log, "APIServer", server.log.pid, (
                "Traceback (most recent call last):",
                '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/async_llm.py", line 439, in output_handler',
                "    outputs = await engine_core.get_output_async()",
                f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD}",
            ))
        )
        server.dead = True
        server.end_all_streams()

    async def _crash(self, armed: _Armed, spec: CrashFault) -> None:
        server = self.server
        core = self._engine_core_pid()
        server.log.error("core.py:710", "EngineCore encountered a fatal error.", who="EngineCore_DP0", pid=core)
        server.log.raw(
            _prefixed(self.server.log, "EngineCore_DP0", core, (
                "Traceback (most recent call last):",
                '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 701, in run_engine_core',
                "    engine_core.run_busy_loop()",
                "RuntimeError: CUDA error: an illegal memory access was encountered",
            ))
        )
        server.set_activity(Activity.DEAD)
        if server.tree is not None:
            await server.tree.crash_engine_core()
        self._engine_dead()
        delay = spec.exit_delay if spec.exit_delay is not None else server.config.engine_death_shutdown
        await server.shutdown_after_engine_death(delay=delay, code=spec.exit_code, orphans=False)
