"""The pure engine model: a vLLM v1-style scheduler under a virtual clock.

``Engine.step(now)`` schedules one step (running requests first: decodes with
their speculative tokens, then prefill chunks, then newly admitted requests,
all inside ``max_num_batched_tokens``), commits its effects and returns the
step's duration and per-request deltas. Nothing here sleeps, reads a clock or
does I/O; an async driver (``soak.sim.server``) sleeps ``duration / time_scale``
between steps, and a trace generator can call ``step`` in a tight loop.

Step time: ``pp_size * (stage_time + stage_time_per_token * tokens)``; with
the defaults a 256-token chunk step is ~28 ms, so a cold 230K-token prefill
(~900 chunks) takes ~25 s and a 94%-cached one ~1.5 s.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol, Sequence

from soak.sim import greedy
from soak.sim.config import SimConfig
from soak.sim.greedy import WORDS  # noqa: F401  (re-exported: the sim's output vocabulary)
from soak.sim.prefix_cache import Allocation, BlockPool

class Phase(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class SimRequest:
    request_id: str
    prompt_tokens: int
    hashes: list[int]
    stop_at: int  # output tokens to produce
    finish_reason: str  # "length" (max_tokens) or "stop" (EOS)
    arrival: float
    # The prompt's content (soak.sim.greedy.prompt_digest): the answer is a function of it.
    digest: int = 0
    number: int = 0  # the server's request counter (fault corrupt_output's one_in)
    # top_logprobs asked (None: no logprobs): only then is each position's state kept
    logprobs: int | None = None
    phase: Phase = Phase.WAITING
    num_computed: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    registered_blocks: int = 0
    alloc: Allocation = field(default_factory=Allocation)
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    tokens: bytearray = field(default_factory=bytearray)  # word indices into WORDS
    state: int = field(default=0, init=False)  # the next position's state (greedy.advance)
    # per position, the state whose distribution the logprobs report (None: not asked)
    dists: list[int] | None = field(default=None, init=False)
    # own samples kept while misaligned (a lone request receives its own, pp_size back)
    history: list[tuple[int, int]] | None = field(default=None, init=False, repr=False)
    history_from: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        self.state = self.digest
        if self.logprobs is not None:
            self.dists = []

    @property
    def prefilling(self) -> bool:
        return self.num_computed < self.prompt_tokens

    def output_text(self, start: int, n: int) -> str:
        words = greedy.WORDS
        return "".join([words[t] for t in self.tokens[start:start + n]])


@dataclass(frozen=True)
class Delta:
    request: SimRequest
    new_tokens: int  # tokens emitted this step (0 during prefill)
    first: bool
    finished: bool


@dataclass(frozen=True)
class StepResult:
    started_at: float
    duration: float
    num_tokens: int  # scheduled tokens (prefill chunks + decode tokens incl. drafts)
    prefill_tokens: int
    decode_requests: int
    deltas: tuple[Delta, ...]

    @property
    def ends_at(self) -> float:
        return self.started_at + self.duration

    @property
    def has_prefill(self) -> bool:
        return self.prefill_tokens > 0


class EngineObserver(Protocol):
    """What the metrics and logs hear from the engine (all times engine seconds)."""

    def on_step(self, engine: "Engine", result: StepResult) -> None: ...
    def on_prefix_query(self, queries: int, hits: int) -> None: ...
    def on_spec_decode(self, drafts: int, draft_tokens: int, accepted_per_pos: Sequence[int]) -> None: ...
    def on_first_token(self, req: SimRequest, at: float) -> None: ...
    def on_tokens(self, req: SimRequest, n: int, at: float, since_last: float | None) -> None: ...
    def on_finished(self, req: SimRequest, at: float) -> None: ...
    def on_preempted(self, req: SimRequest) -> None: ...


class Engine:
    def __init__(self, config: SimConfig, *, observer: EngineObserver | None = None) -> None:
        self.config = config
        self.pool = BlockPool(capacity_blocks=config.kv_cache_blocks, block_size=config.block_size)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.observer = observer
        self._rng = random.Random(config.seed)
        self.steps = 0
        self.requests_added = 0
        self.tie_threshold = greedy.tie_threshold(config.near_tie_rate)
        self.near_tie_flip = config.near_tie_flip
        self.misalign: greedy.Misalignment | None = None  # fault corrupt_output, from its onset
        self.slowdown = 1.0  # fault collapse: every step this many times slower

    # ---- requests
    def add_request(self, req: SimRequest) -> None:
        self.requests_added += 1
        self.waiting.append(req)

    def abort(self, request_id: str) -> None:
        for req in self.running:
            if req.request_id == request_id:
                self.running.remove(req)
                self.pool.release(req.alloc)
                req.phase = Phase.FINISHED
                return
        for req in self.waiting:
            if req.request_id == request_id:
                self.waiting.remove(req)
                req.phase = Phase.FINISHED
                return

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def step_duration(self, num_tokens: int) -> float:
        c = self.config
        return c.pp_size * (c.stage_time + c.stage_time_per_token * num_tokens) * self.slowdown

    # ---- one step
    def step(self, now: float) -> StepResult:
        c = self.config
        budget = c.max_num_batched_tokens
        spec = c.num_speculative_tokens
        bs = c.block_size
        plan: list[tuple[SimRequest, int]] = []  # (request, tokens scheduled)

        # running requests first, in arrival order; preempt from the back when out of blocks
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if req.prefilling:
                n = min(req.prompt_tokens - req.num_computed, budget)
                need = -(-(req.num_computed + n) // bs)
            else:
                n = min(1 + spec, budget)
                need = -(-(req.prompt_tokens + req.output_tokens + n) // bs)
            while not self.pool.grow(req.alloc, need):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is req:
                    break
            if req.phase is not Phase.RUNNING:
                continue  # preempted itself; list shrank
            plan.append((req, n))
            budget -= n
            i += 1

        # admit waiting requests
        while self.waiting and budget > 0 and len(self.running) < c.max_num_seqs:
            req = self.waiting[0]
            first_time = req.num_computed == 0 and req.scheduled_at is None
            hits = self.pool.lookup(req.hashes, req.prompt_tokens)
            computed = hits * bs
            n = min(req.prompt_tokens - computed, budget)
            need = -(-(computed + n) // bs)
            extra = need - hits
            if self.pool.free_blocks - self._evictable_in(req.hashes[:hits]) < extra:
                break
            self.waiting.popleft()
            self.pool.acquire_cached(req.hashes[:hits], req.alloc)
            if not self.pool.grow(req.alloc, need):  # cannot happen after the check; be safe
                self.pool.release(req.alloc)
                self.waiting.appendleft(req)
                break
            req.num_computed = computed
            req.registered_blocks = hits
            req.cached_tokens = computed
            req.phase = Phase.RUNNING
            if req.scheduled_at is None:
                req.scheduled_at = now
            if first_time and self.observer:
                self.observer.on_prefix_query(req.prompt_tokens, computed)
            self.running.append(req)
            plan.append((req, n))
            budget -= n

        num_tokens = sum(n for _, n in plan)
        duration = self.step_duration(num_tokens)
        end = now + duration
        deltas: list[Delta] = []
        prefill_tokens = 0
        decode_requests = 0
        drafts = draft_tokens = 0
        accepted_per_pos = [0] * spec
        finished: list[SimRequest] = []
        emitting: list[tuple[SimRequest, int]] = []
        for req, n in plan:
            if req.prefilling:
                prefill_tokens += n
                req.num_computed += n
                full = min(req.num_computed // bs, len(req.hashes))
                while req.registered_blocks < full:
                    self.pool.register(req.alloc, req.hashes[req.registered_blocks])
                    req.registered_blocks += 1
                if req.prefilling:
                    continue
                emitted = 1
            else:
                decode_requests += 1
                k = n - 1
                accepted = sum(1 for _ in range(k) if self._rng.random() < c.spec_acceptance)
                if k:
                    drafts += 1
                    draft_tokens += k
                    for pos in range(accepted):
                        accepted_per_pos[pos] += 1
                emitted = 1 + accepted
            emitted = min(emitted, req.stop_at - req.output_tokens)
            if emitted > 0:
                emitting.append((req, emitted))
            first = req.output_tokens == 0
            since = None if first else end - (req.last_token_at or end)
            req.output_tokens += emitted
            req.last_token_at = end
            done = req.output_tokens >= req.stop_at
            if first:
                req.first_token_at = end
                if self.observer:
                    self.observer.on_first_token(req, end)
            if self.observer and emitted:
                self.observer.on_tokens(req, emitted, end, since)
            if done:
                finished.append(req)
            deltas.append(Delta(req, emitted, first, done))

        if emitting:  # which tokens: the batch's composition decides near ties (and a misalignment)
            greedy.sample_batch(self.steps, len(plan), emitting, threshold=self.tie_threshold,
                                flip=self.near_tie_flip, misalign=self.misalign, pp=c.pp_size)
        for req in finished:
            self.running.remove(req)
            self.pool.release(req.alloc)
            req.phase = Phase.FINISHED
            req.finished_at = end
            if self.observer:
                self.observer.on_finished(req, end)
        if self.observer and drafts:
            self.observer.on_spec_decode(drafts, draft_tokens, accepted_per_pos)
        self.steps += 1
        result = StepResult(now, duration, num_tokens, prefill_tokens, decode_requests, tuple(deltas))
        if self.observer:
            self.observer.on_step(self, result)
        return result

    def _evictable_in(self, hashes: Sequence[int]) -> int:
        """Cached blocks in ``hashes`` that are free now but stop being free once acquired."""
        refs = self.pool._refs
        return sum(1 for h in hashes if refs.get(h) == 0)

    def _preempt(self, req: SimRequest) -> None:
        # vLLM v1 recomputes a preempted request from scratch (its cached blocks may survive)
        self.running.remove(req)
        self.pool.release(req.alloc)
        req.phase = Phase.WAITING
        req.num_computed = 0
        req.registered_blocks = 0
        self.waiting.appendleft(req)
        if self.observer:
            self.observer.on_preempted(req)
