"""The simulated server's state: the engine, its async driver, the metrics registry, the GPUs and the faults.

``SimServer`` is what the HTTP handlers (``soak.sim.openai_api``, ``soak.sim.app``)
act on; the app keeps one as ``app[SIM_KEY]``.

Times: the engine runs on simulated seconds, ``time_scale`` times faster than
the wall clock; histograms are in simulated seconds, while everything stamped
with a date (logs, ``onset_at``, ``created``) is unix wall time.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any, Callable

from aiohttp import web

from soak.clock import Clock, SystemClock
from soak.tokens import tokenizer
from soak.sim.claims import ClaimState
from soak.sim.config import SimConfig
from soak.sim.engine import Delta, Engine, SimRequest, StepResult
from soak.sim.gpus import Activity, gpu_readings
from soak.sim.logs import SimLog
from soak.sim.metrics import SimMetrics

SIM_KEY = web.AppKey("sim", object)


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}
        return web.json_response(body, status=self.status)


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "BadRequestError", param)


class RequestStream:
    """One request's channel from the driver to its HTTP handler."""

    __slots__ = ("req", "queue")

    def __init__(self, req: SimRequest) -> None:
        self.req = req
        self.queue: asyncio.Queue[Delta | None] = asyncio.Queue()


class SimServer:
    def __init__(
        self,
        config: SimConfig,
        *,
        clock: Clock | None = None,
        log: SimLog | None = None,
        tree: Any = None,
    ) -> None:
        from soak.sim.faults import FaultController  # faults drive the server; import here avoids a cycle

        self.config = config
        self.clock = clock or SystemClock()
        self.log = log or SimLog(clock=self.clock, pid=os.getpid(), ansi=config.profile.ansi_log_prefix)
        self.metrics = SimMetrics(config)
        self.section_memo = tokenizer.SectionMemo()
        self.engine = Engine(config, observer=self.metrics)
        self.tree = tree  # soak.sim.proctree.ProcessTree or None
        # set by `soak sim` only: in-process the "API server" is the test itself, never to be killed
        self.api_server_pid: int | None = None
        self.activity = Activity.IDLE
        self.frozen = False  # hung: no engine steps, streams stall
        self.dead = False  # engine dead: /health 503, requests fail
        self.metrics_stalled = False
        self.pause_until: float | None = None  # sim time of the end of a healthy pause
        # Called when the engine resumes after a pause, before any paused request
        # moves on, so the fault reads ended by the time its requests finish.
        self.on_pause_end: Callable[[], None] | None = None
        self.started_wall = self.clock.now()
        self._mono0 = self.clock.monotonic()
        self._last_end = 0.0
        self._streams: dict[str, RequestStream] = {}
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        # Set while an engine step runs: vLLM's PP deadlock happens inside a forward pass.
        self.stepping = asyncio.Event()
        self._driver: asyncio.Task | None = None
        self._stats_task: asyncio.Task | None = None
        self.stats = _StatsWindow()
        self.exit_code: int | None = None  # set when the server must stop (crash)
        self.stop_event = asyncio.Event()
        self.claims = ClaimState()  # the work-claim faults (lying usage, another model, replay)
        self.faults = FaultController(self)

    # ---- time
    def sim_now(self) -> float:
        return (self.clock.monotonic() - self._mono0) * self.config.time_scale

    def wall_of(self, sim_t: float) -> float:
        return self.started_wall + sim_t / self.config.time_scale

    async def sleep_sim(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.config.time_scale)

    @property
    def ready(self) -> bool:
        return not self.dead and self.sim_now() >= self.config.startup_delay

    # ---- lifecycle
    async def start(self) -> None:
        self._driver = asyncio.create_task(self._drive(), name="sim-engine-driver")
        self._driver.add_done_callback(self._driver_ended)
        self._stats_task = asyncio.create_task(self._log_stats_loop(), name="sim-stats-log")
        self.faults.start()

    async def close(self) -> None:
        await self.faults.close()
        for task in (self._driver, self._stats_task):
            if task is not None:
                task.cancel()
        for task in (self._driver, self._stats_task):
            if task is not None:
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
        for stream in list(self._streams.values()):
            stream.queue.put_nowait(None)

    def _driver_ended(self, task: asyncio.Task) -> None:
        """A simulator bug must not pass for a deadlock: the traceback goes to the log."""
        if not task.cancelled() and task.exception() is not None:
            import traceback

            self.log.error("sim/server.py:1", "simulator: the engine driver failed (a simulator bug)")
            self.log.raw("".join(traceback.format_exception(task.exception())))

    def wake(self) -> None:
        self._wake.set()

    def end_all_streams(self) -> None:
        """The engine died: every open request ends with an error."""
        for stream in list(self._streams.values()):
            stream.queue.put_nowait(None)

    def request_exit(self, code: int) -> None:
        self.exit_code = code
        self.stop_event.set()

    async def shutdown_after_engine_death(self, *, delay: float, code: int, orphans: bool) -> None:
        """vLLM's API server checks every 5 s whether the engine died and then shuts
        itself down (/health goes from 503 to connection refused), unless
        VLLM_KEEP_ALIVE_ON_ENGINE_DEATH is set. ``orphans``: hung workers ignore
        the shutdown and linger, reparented, until killed."""
        if self.config.keep_alive_on_engine_death:
            return
        await self.sleep_sim(delay)
        self.log.info("launcher.py:143", "Engine is dead: shutting down the API server (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH unset).")
        if orphans and self.tree is not None:
            self.tree.leave_orphans()
        self.request_exit(code)

    def set_activity(self, activity: Activity) -> None:
        if activity is self.activity:
            return
        self.activity = activity
        if self.tree is not None:
            self.tree.set_activity(activity)

    # ---- the driver: one engine step at a time, sleeping its duration
    async def _drive(self) -> None:
        while True:
            if self.frozen or self.dead or not self.engine.has_work:
                if not (self.frozen or self.dead):
                    self.set_activity(Activity.IDLE)
                    self.stepping.clear()
                self._wake.clear()
                await self._wake.wait()
                continue
            if self.pause_until is not None:
                self.set_activity(Activity.PAUSE)
                self.stepping.set()  # a long step: every stage busy
                await self.sleep_sim(self.pause_until - self.sim_now())
                self.pause_until = None
                if self.on_pause_end is not None:
                    self.on_pause_end()
                continue
            now = max(self._last_end, self.sim_now())
            result = self.engine.step(now)
            if result.num_tokens == 0:  # nothing fits now: wait for a request to finish or arrive
                self.set_activity(Activity.IDLE)
                self.stepping.clear()
                self._wake.clear()
                await self._wake.wait()
                continue
            self.set_activity(Activity.PREFILL if result.has_prefill else Activity.DECODE)
            self.stepping.set()
            self._last_end = result.ends_at
            await self.sleep_sim(result.ends_at - self.sim_now())
            if self.frozen or self.dead:
                continue  # the step never completes: its tokens are never delivered
            self._deliver(result)

    def _deliver(self, result: StepResult) -> None:
        self.stats.add_step(result)
        if any(d.finished for d in result.deltas):
            self._wake.set()  # blocks were freed: a waiting request may fit now
        for d in result.deltas:
            stream = self._streams.get(d.request.request_id)
            if stream is not None:
                stream.queue.put_nowait(d)

    # ---- requests
    def new_request(self, *, prompt_tokens: int, hashes: list[int], max_tokens: int | None, min_tokens: int, ignore_eos: bool,
                    prefix: str, digest: int = 0, logprobs: int | None = None) -> RequestStream:
        """``hashes``: the prompt's full blocks' chained hashes (soak.sim.prefix_cache);
        ``digest``: its content (soak.sim.greedy.prompt_digest); ``logprobs``: top
        alternatives asked per position (None: no logprobs)."""
        c = self.config
        n = prompt_tokens
        if n > c.max_model_len or (max_tokens is not None and n + max_tokens > c.max_model_len):
            if max_tokens is not None and n <= c.max_model_len:
                msg = (
                    f"This model's maximum context length is {c.max_model_len} tokens. However, you requested "
                    f"{n + max_tokens} tokens ({n} in the messages, {max_tokens} in the completion). "
                    "Please reduce the length of the messages or completion."
                )
            else:
                msg = (
                    f"This model's maximum context length is {c.max_model_len} tokens. However, your request has "
                    f"{n} input tokens. Please reduce the length of the input messages."
                )
            raise bad_request(msg, "messages" if prefix == "chatcmpl" else "prompt")
        if max_tokens is not None:
            stop_at, reason = max_tokens, "length"
        elif ignore_eos:
            stop_at, reason = c.max_model_len - n, "length"
        else:
            stop_at = max(min_tokens, min(c.default_output_tokens, c.max_model_len - n))
            reason = "stop" if stop_at < c.max_model_len - n else "length"
        blocks = -(-(n + stop_at) // c.block_size)
        if blocks > c.kv_cache_blocks:
            raise bad_request(
                f"The request needs {blocks} KV cache blocks ({n} prompt + {stop_at} output tokens), "
                f"more than the {c.kv_cache_blocks} the cache holds."
            )
        number = next(self._ids)
        req = SimRequest(
            request_id=f"{prefix}-{number:08x}{c.seed & 0xffff:04x}",
            prompt_tokens=n,
            hashes=hashes,
            stop_at=max(stop_at, 1),
            finish_reason=reason,
            arrival=self.sim_now(),
            digest=digest,
            number=number,
            logprobs=logprobs,
        )
        stream = RequestStream(req)
        self._streams[req.request_id] = stream
        self.faults.on_request(self.engine.requests_added + 1)
        self.engine.add_request(req)
        self.wake()
        return stream

    def forget(self, stream: RequestStream) -> None:
        if self._streams.pop(stream.req.request_id, None) is None or stream.req.phase.value == "finished":
            return
        if not (self.frozen or self.dead):  # a hung engine core never processes the abort
            self.engine.abort(stream.req.request_id)

    # ---- state
    def worker_pids(self) -> list[int | None]:
        return self.tree.worker_pids() if self.tree is not None else [None] * self.config.pp_size

    def gpus(self):
        held = self.tree.workers_alive() if self.tree is not None else [not self.dead] * self.config.pp_size
        activity = Activity.DEAD if self.dead and not self.frozen else self.activity
        return gpu_readings(self.config, activity, self.worker_pids(), held)

    def energy_mj(self, gpus) -> list[float]:
        """DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION: each GPU's power integrated over wall time."""
        now = self.clock.monotonic()
        last = getattr(self, "_energy_at", None)
        totals = getattr(self, "_energy", None) or [0.0] * len(gpus)
        if last is not None:
            for g in gpus:
                if g.index < len(totals):
                    totals[g.index] += g.power_w * (now - last) * 1000.0
        self._energy, self._energy_at = totals, now
        return list(totals)

    def state(self) -> dict[str, Any]:
        return {
            "gpus": [g.to_json() for g in self.gpus()],
            "processes": {
                "api_server": self.api_server_pid,
                "engine_core": self.tree.engine_core_pid() if self.tree is not None else None,
                "workers": [p for p in self.worker_pids() if p is not None],
            },
            "fault": self.faults.describe(),
            "faults": self.faults.describe_all(),
            "tree": self.tree.snapshot() if self.tree is not None else None,
            "time_scale": self.config.time_scale,
            "sim_time": self.sim_now(),
            "activity": self.activity.value,
            "engine": {
                "running": len(self.engine.running),
                "waiting": len(self.engine.waiting),
                "steps": self.engine.steps,
                "kv_cache_usage": self.engine.pool.usage,
                "alive": not self.dead,
                "hung": self.frozen,
            },
        }

    # ---- the periodic stats line (vLLM's LoggingStatLogger)
    async def _log_stats_loop(self) -> None:
        interval = self.config.log_stats_interval
        if interval <= 0:
            return
        while True:
            await self.sleep_sim(interval)
            if self.dead and not self.frozen:
                continue
            self.stats.log(self, interval)


class _StatsWindow:
    """Counts between two periodic log lines."""

    def __init__(self) -> None:
        self.prompt = self.generation = 0
        self.queries = self.hits = 0
        self.spec_base: tuple[int, int, list[int]] = (0, 0, [])

    def add_step(self, result: StepResult) -> None:
        for d in result.deltas:
            if d.first:
                self.prompt += d.request.prompt_tokens
                self.queries += d.request.prompt_tokens
                self.hits += d.request.cached_tokens
            self.generation += d.new_tokens

    def log(self, server: SimServer, interval: float) -> None:
        engine = server.engine
        hit = 100.0 * self.hits / self.queries if self.queries else 0.0
        server.log.info(
            "loggers.py:127",
            f"Engine 000: Avg prompt throughput: {self.prompt / interval:.1f} tokens/s, "
            f"Avg generation throughput: {self.generation / interval:.1f} tokens/s, "
            f"Running: {len(engine.running)} reqs, Waiting: {len(engine.waiting)} reqs, "
            f"GPU KV cache usage: {100.0 * engine.pool.usage:.1f}%, Prefix cache hit rate: {hit:.1f}%",
        )
        m = server.metrics
        if server.config.spec_decode:
            drafts = m.spec_drafts - self.spec_base[0]
            drafted = m.spec_draft_tokens - self.spec_base[1]
            base_pos = self.spec_base[2] or [0] * len(m.spec_accepted_per_pos)
            per_pos = [a - b for a, b in zip(m.spec_accepted_per_pos, base_pos)]
            accepted = sum(per_pos)
            if drafts:
                rates = ", ".join(f"{n / drafts:.3f}" for n in per_pos)
                server.log.info(
                    "metrics.py:96",
                    f"SpecDecoding metrics: Mean acceptance length: {1 + accepted / drafts:.2f}, "
                    f"Accepted throughput: {accepted / interval:.2f} tokens/s, Drafted throughput: {drafted / interval:.2f} tokens/s, "
                    f"Accepted: {accepted} tokens, Drafted: {drafted} tokens, Per-position acceptance rate: {rates}, "
                    f"Avg Draft acceptance rate: {100.0 * accepted / drafted:.1f}%",
                )
        self.__init__()
        self.spec_base = (m.spec_drafts, m.spec_draft_tokens, list(m.spec_accepted_per_pos))


def server_of(request: web.Request) -> SimServer:
    return request.app[SIM_KEY]  # type: ignore[return-value]
