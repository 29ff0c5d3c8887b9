"""What the detector remembers between samples.

``SignalTracker.observe`` folds each sample into a handful of facts (when each
progress signal last moved, since when the server has been busy, the current run
of the pipeline-tail pattern, the healthy gaps seen so far). The rules read
these facts and never change them. No clock is read here: every time comes from
a sample's ``ts``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Deque

from soak.detect import evidence as ev
from soak.detect.config import DetectorConfig
from soak.detect.evidence_table import TABLE
from soak.detect.stage_shapes import ShapeRun, classify, fold, stage_levels
from soak.logsignatures import JIT_COMPILE, SHM_BROADCAST_WAIT
from soak.numbers import finite
from soak.records import Topology
from soak.samples import (
    CanarySample,
    CanaryVerdict,
    ClientSample,
    GpuSample,
    GpuSource,
    HealthSample,
    LogSample,
    ProcessSample,
    Sample,
    ServerSample,
)

# Server counters and gauges that move while the engine makes progress. The
# engine publishes scheduler stats every step, so KV usage moves through a cold
# chunked prefill while the token counters stand still; prefix-cache queries
# move only when a request is admitted and the iteration_tokens_total count only
# on steps with output (vLLM 0.11.2), so they add evidence but never carry a
# prefill on their own.
SERVER_PROGRESS_KEYS: tuple[str, ...] = (
    "generation_tokens",
    "prompt_tokens",
    "kv_cache_usage_perc",
    "prefix_cache_queries",
    "request_success",
    "spec_decode_num_drafts",
    "iteration_tokens_total_count",
)
GENERATION_KEY = "generation_tokens"
# What moves while a long prompt is prefilled, before its first token: the KV cache
# fills chunk by chunk. The prompt counter does not (vLLM and the simulator count a
# prompt at its first token). A /metrics without it (a proxy's own, a server that is
# not vLLM, an allowlisted scrape) cannot tell a prefill from a stop.
PREFILL_KEYS: tuple[str, ...] = ("kv_cache_usage_perc",)
MAX_FATAL_LINES = 50
_GOOD_CANARY = frozenset(v.value for v in (CanaryVerdict.MATCH, CanaryVerdict.EXPLAINED, CanaryVerdict.REFERENCE))
_BAD_CANARY = frozenset(v.value for v in (CanaryVerdict.CORRUPT, CanaryVerdict.CROSSTALK))
MAX_SHM_LINES = 64


@dataclass
class TailRun:
    """A run of GPU points where the last stage is low and every upstream stage high."""

    since: float
    last: float
    points: int
    tail_pct: float
    upstream_pct: float
    dipped: bool = False  # stage CPU: the latest point was out of marks (one is a blip)


@dataclass
class HealthRun:
    since: float
    last: float
    failures: int
    status: int | None
    error: str | None


class SignalTracker:
    def __init__(self, config: DetectorConfig, topology: Topology) -> None:
        self.config = config
        self.topology = topology
        gen = config.generation_frozen
        self.progress_gaps: Deque[float] = deque(maxlen=gen.history)
        self.client_gaps: Deque[float] = deque(maxlen=config.client_stall.history)
        # Gaps while a server life works through its first requests (cold caches, every
        # session's first long prompt at once, lazy compiles) are kept apart: they guard
        # the next cold start, but one such pause must not set the threshold for a whole
        # night (seen on the real vLLM: 7 s at each start, 1-1.6 s after).
        self.cold_gaps: Deque[float] = deque(maxlen=gen.history)
        self.reset(float("-inf"))

    def reset(self, now: float) -> None:
        """Forget the target's state; the healthy gaps learned so far are kept."""
        self.started_at = now
        # GPUs
        self.gpu_ts: float | None = None
        self.gpu_source: GpuSource | None = None
        self.gpu_levels: dict[int, float] = {}
        self.gpu_error: str | None = None
        self.tail_run: TailRun | None = None
        self._last_gpu_point: float = float("-inf")
        # GPU readings' sequential evidence for pp_tail_stall (soak.detect.evidence)
        self.evidence = ev.Cusum()
        # Stage CPU: the current run of a stuck shape (the tail asleep, or one stage spinning alone)
        self.stage_run: ShapeRun | None = None
        # Server metrics
        self.server_ts: float | None = None
        self.server_values: dict[str, float] = {}
        self.server_error: str | None = None
        self.prefill_visible = False  # the latest scrape carries a signal a prefill moves
        self.running: float | None = None
        self.busy_since: float | None = None
        self.last_change: dict[str, float] = {}
        # When the engine was last seen making progress, as the sequential evidence reads it
        # (soak.detect.evidence, fitted with the same dating): a client token at its arrival;
        # a scrape whose counters moved, at its own time until a later scrape shows them
        # still, then at the scrape before it (the move may have come any time after that,
        # and a stopped engine moves once: the scrape after the stop carries its last step).
        self.client_alive_at: float | None = None
        self.server_move: tuple[float, float] | None = None  # (the scrape before, the scrape)
        self.server_still_since_move = False
        self.generated_since_start = False
        # This life's first requests: how many were in flight at its first token, and
        # the client's done count then (None: no client progress seen yet).
        self.cold_requests: int = 0
        self.cold_done_base: int | None = None
        # Client progress
        self.client: ClientSample | None = None
        self._client_prev: dict[str, float] = {}
        self.streaming_since: float | None = None
        self.last_bytes_change: float | None = None
        # Health and process
        self.health_run: HealthRun | None = None
        self.health_ts: float | None = None
        self.process_dead: ProcessSample | None = None
        # Log signatures since the reset
        self.fatal_logs: list[LogSample] = []
        self.last_nonfatal_log: LogSample | None = None
        # vLLM's shm-broadcast waits, the newest last (the log rule counts those after
        # the last progress).
        self.shm_waits: Deque[LogSample] = deque(maxlen=MAX_SHM_LINES)
        self.forget_canaries(now, quiet=False)

    def forget_canaries(self, now: float, *, quiet: bool = True) -> None:
        """The corruption rule's memory only: canaries before ``now`` are ignored.
        ``quiet`` (a corruption the run soaks through): the rule fires again only
        after a good canary, so one corruption episode is one incident."""
        self.canaries_since = now
        self.canary_good_at: float | None = None  # the start of the last good canary (MATCH, EXPLAINED, REFERENCE)
        self.canary_bad: CanarySample | None = None  # the first bad one since (CORRUPT, CROSSTALK)
        self.canary_bad_before: float | None = None  # the good canary's start before that bad one
        self.canaries_bad = 0
        self.canary_quiet = quiet

    # -- derived facts -------------------------------------------------------------

    @property
    def alive_at(self) -> float | None:
        """When the engine was last seen making progress (the sequential evidence's dating)."""
        server = None
        if self.server_move is not None:
            server = self.server_move[0] if self.server_still_since_move else self.server_move[1]
        known = [x for x in (server, self.client_alive_at) if x is not None]
        return max(known) if known else None

    @property
    def last_progress_at(self) -> float | None:
        return max(self.last_change.values()) if self.last_change else None

    @property
    def shm_waits_since_progress(self) -> list[LogSample]:
        """The shm-broadcast waits logged after the last progress signal moved."""
        last = self.last_progress_at
        return [x for x in self.shm_waits if last is None or x.ts > last]

    @property
    def shm_waits_needed(self) -> int:
        """Waits that settle a hang: one more while the server life's first requests
        still run (lazy compiles and cold prefills pause it for seconds: 7 s seen on
        the real vLLM, one line at a 5-s interval)."""
        return self.config.log_signature.shm_broadcast_repeats + (1 if self.cold else 0)

    @property
    def in_flight(self) -> bool | None:
        """Requests in flight: the server's running gauge, else the client's count."""
        if self.running is not None:
            return self.running > 0 or bool(self.client and self.client.in_flight > 0)
        if self.client is not None:
            return self.client.in_flight > 0
        return None

    @property
    def requests_in_flight(self) -> int | None:
        """How many of the client's requests are in flight, whatever the running gauge
        says (a stuck engine publishes no new stats); the gauge only without a client."""
        if self.client is not None:
            return self.client.in_flight
        return None if self.running is None else int(self.running)

    @property
    def cold(self) -> bool:
        """Some of the requests in flight at the server life's first token are still
        prefilling: fewer streams have started (or ended) since than were in flight."""
        if not self.generated_since_start or self.cold_done_base is None or self.client is None:
            return False
        done_since = self.client.requests_done - self.cold_done_base
        return self.client.streaming + done_since < self.cold_requests

    @property
    def learned_gap_s(self) -> float:
        """The longest healthy gap that bounds silence now: steady gaps, and cold-start
        gaps as well while the server is still cold."""
        steady = max(self.progress_gaps, default=0.0)
        return max(steady, max(self.cold_gaps, default=0.0)) if self.cold else steady

    @property
    def learned_client_gap_s(self) -> float:
        return max(self.client_gaps, default=0.0)

    # -- folding samples in --------------------------------------------------------

    def observe(self, sample: Sample) -> bool:
        """Fold ``sample`` in; True when it settles a rule at once (a fatal log
        line, the server process gone), so the caller need not wait for its
        next assessment tick."""
        if sample.ts < self.started_at:
            return False
        if isinstance(sample, GpuSample):
            return self._observe_gpu(sample)
        elif isinstance(sample, ServerSample):
            self._observe_server(sample)
        elif isinstance(sample, ClientSample):
            self._observe_client(sample)
        elif isinstance(sample, HealthSample):
            self._observe_health(sample)
        elif isinstance(sample, ProcessSample):
            if not sample.alive and self.process_dead is None:
                self.process_dead = sample
                return True
        elif isinstance(sample, CanarySample):
            return self._observe_canary(sample)
        elif isinstance(sample, LogSample):
            if sample.fatal:
                if len(self.fatal_logs) < MAX_FATAL_LINES:  # a dying server repeats itself
                    self.fatal_logs.append(sample)
                return len(self.fatal_logs) == 1
            if sample.signature == JIT_COMPILE:
                return False  # a precursor for the timeline, not a sign of a hang by itself
            self.last_nonfatal_log = sample
            if sample.signature == SHM_BROADCAST_WAIT:
                self.shm_waits.append(sample)
                # Enough waits since the last progress may settle the log rule now.
                return (self.generated_since_start
                        and len(self.shm_waits_since_progress) >= self.shm_waits_needed)
        return False

    def _observe_canary(self, sample: CanarySample) -> bool:
        """True when it is the first bad canary since the last good one (the rule fires now)."""
        if sample.ts < self.canaries_since:
            return False
        verdict, start = str(sample.verdict), sample.started_at if sample.started_at is not None else sample.ts
        if verdict in _GOOD_CANARY:
            self.canary_good_at = start if self.canary_good_at is None else max(self.canary_good_at, start)
            self.canary_quiet = False
            return False
        if verdict not in _BAD_CANARY or self.canary_quiet:
            return False  # UNJUDGED (a failed request, no logprobs) is no verdict on the answers
        self.canaries_bad += 1
        if self.canary_bad is not None:
            return False
        self.canary_bad, self.canary_bad_before = sample, self.canary_good_at
        return True

    def _progress(self, key: str, ts: float, read_before: float | None = None) -> None:
        """Signal ``key`` moved at ``ts`` (since its reading at ``read_before``); a healthy
        gap is learned from it."""
        previous = self.last_progress_at
        self.last_change[key] = ts
        hung_from = self.evidence.first_hung_at
        if hung_from is not None and read_before is not None and read_before >= hung_from:
            # It moved after a reading taken once the tail looked stuck: tokens came after
            # the pattern began, which a stopped engine cannot do. The excursion ends.
            self.evidence = ev.cleared(self.evidence)
        if self.busy_since is None or not self.generated_since_start:
            return  # idle gaps and start-up pauses are not healthy gaps to learn from
        start = max(previous, self.busy_since) if previous is not None else self.busy_since
        if ts > start:
            (self.cold_gaps if self.cold else self.progress_gaps).append(ts - start)

    def _observe_gpu(self, sample: GpuSample) -> bool:
        """True when the reading's evidence reached pp_tail_stall's bound."""
        if sample.error is not None or not sample.gpus:
            self.gpu_error = sample.error or "no GPUs in the sample"
            return False
        window = self.config.pp_tail_stall.window
        if sample.fresh_at is not None and sample.ts - sample.fresh_at > window:
            # A reading older than the window (an exporter collecting every 30 s) is
            # missing, never a 0% or 100%: a repeated 0%/100% must not grow a tail run.
            age = sample.ts - sample.fresh_at
            self.gpu_error = (f"stale GPU readings: {age:.1f}s old, older than the {window:g}s window "
                              f"(the {sample.source.value} source refreshes too slowly)")
            self.tail_run = None
            self.gpu_levels = {}
            return False
        self.gpu_error = None
        self.gpu_ts = sample.ts
        self.gpu_source = sample.source
        readings = {g.index: g for g in sample.gpus}
        self.gpu_levels = {g.index: g.util_pct for g in sample.gpus}
        if sample.source is GpuSource.STAGE_CPU:
            self._observe_stage_shape(sample.ts)
        tail = [readings[i] for i in self.topology.last_stage if i in readings]
        upstream = [readings[i] for i in self.topology.upstream if i in readings]
        if not tail or not upstream:
            return False
        cfg = self.config.pp_tail_stall
        series_tail = [g.util_samples or (g.util_pct,) for g in tail]
        series_up = [g.util_samples or (g.util_pct,) for g in upstream]
        n = min(len(s) for s in series_tail + series_up)
        # A repeated collection is one point in time (when it was collected), not a
        # new one each read: its 0%/100% must not stretch into a window.
        taken = sample.fresh_at if sample.fresh_at is not None else sample.ts
        crossed = False
        for k in range(n):
            t = taken - (n - 1 - k) * cfg.util_sample_period
            if t <= self._last_gpu_point:
                continue
            gap, self._last_gpu_point = t - self._last_gpu_point, t
            tail_pct = max(s[len(s) - n + k] for s in series_tail)
            up_pct = min(s[len(s) - n + k] for s in series_up)
            busiest_up = max(s[len(s) - n + k] for s in series_up)
            low_pct, high_pct, _ = cfg.marks(sample.source)
            if sample.source is not GpuSource.STAGE_CPU:
                span = cfg.util_sample_period if tail[0].util_samples else cfg.sequential.reading_span
                # Not hung over this reading's span: the tail at work, or an idle pipeline (a
                # hung one's upstream spins; with requests in flight every upstream stage of
                # a small pipeline can miss a short window on a shared GPU).
                rules_out_hang = tail_pct > low_pct or (busiest_up <= low_pct and not self.in_flight)
                crossed |= self._fold_evidence(t, ev.tail_bin(tail_pct, up_pct, low_pct=low_pct, high_pct=high_pct),
                                               span=span, weight=min(1.0, gap / TABLE.period_s),
                                               rules_out_hang=rules_out_hang)
            if tail_pct <= low_pct and up_pct >= high_pct:
                if self.tail_run is None:
                    self.tail_run = TailRun(t, t, 0, tail_pct, up_pct)
                run = self.tail_run
                run.last, run.points, run.tail_pct, run.upstream_pct = t, run.points + 1, tail_pct, up_pct
                run.dipped = False
            elif sample.source is GpuSource.STAGE_CPU and self.tail_run is not None and not self.tail_run.dipped:
                # On a loaded box the kernel books a thread's run-queue wait when it next
                # runs: a spinner that waited out a reading reads low there, a sleeper's
                # wake-up reads high. One reading out of marks keeps the run (as in
                # stage_cpu_stall's shapes); two in a row end it.
                self.tail_run.dipped = True
            else:
                self.tail_run = None
        return crossed and cfg.sequential.enabled

    def _fold_evidence(self, t: float, tail: str, *, span: float, weight: float, rules_out_hang: bool) -> bool:
        """One fresh GPU reading's evidence (a stale one never gets here: it adds nothing);
        True when it reaches the bound."""
        if not self.in_flight:
            # Nothing in flight: no progress to expect, but a tail dark beside a spinning
            # upstream is still the signature (an idle healthy pipeline reads dark
            # everywhere, which clears it); the rule decides once requests come.
            self.evidence = ev.step(self.evidence, at=t, bins={ev.TAIL: tail}, table=TABLE, span_s=span,
                                    weight=weight, rules_out_hang=rules_out_hang)
            return False
        known = [x for x in (self.alive_at, self.busy_since) if x is not None]
        age = max(0.0, t - max(known)) if known else 0.0
        bins = {ev.TAIL: tail, ev.PROGRESS: ev.progress_bin(age, moved_during_pattern=False)}
        self.evidence = ev.step(self.evidence, at=t, bins=bins, table=TABLE, span_s=span, weight=weight,
                                rules_out_hang=rules_out_hang)
        return self.evidence.total >= ev.bound_for_arl0(self.config.pp_tail_stall.sequential.arl0_hours * 3600.0,
                                                        TABLE.period_s)

    def _observe_stage_shape(self, ts: float) -> None:
        # A failed reading leaves the run as it is: the next reading's delta spans the
        # gap (soak.probes.stage_cpu), so an asleep reading after it was asleep through it.
        levels = stage_levels(self.gpu_levels, self.topology)
        cfg = self.config.stage_cpu_stall
        reading = None if levels is None else classify(levels, asleep_pct=cfg.asleep_pct, spin_pct=cfg.spin_pct)
        self.stage_run = fold(self.stage_run, reading, ts=ts, levels=levels or (),
                              in_flight=self.requests_in_flight or 0)

    def _observe_server(self, sample: ServerSample) -> None:
        if not sample.ok:
            self.server_error = sample.error or "scrape failed"
            return
        self.server_error = None
        values = sample.values
        self.prefill_visible = any(finite(values.get(key)) is not None for key in PREFILL_KEYS)
        running = finite(values.get("num_requests_running"))
        if running is not None:
            self.running = running
            if running > 0 and self.busy_since is None:
                self.busy_since = sample.ts
            elif running <= 0 and not (self.client and self.client.in_flight > 0):
                self.busy_since = None
        first, read_before = self.server_ts is None, self.server_ts
        moved = False
        self.server_ts = sample.ts
        for key in SERVER_PROGRESS_KEYS:
            value = finite(values.get(key))
            if value is None:  # absent, or junk: a NaN never equals itself, so it moved every scrape
                continue
            old = self.server_values.get(key)
            self.server_values[key] = value
            if old is None or value == old:
                continue
            if key == GENERATION_KEY and not first:
                self._generated()
            self._progress(key, sample.ts, read_before)
            moved = True
        if not first:
            if moved and read_before is not None:
                self.server_move, self.server_still_since_move = (read_before, sample.ts), False
            elif not moved:
                self.server_still_since_move = True
        for key in ("num_requests_running", "num_requests_waiting"):
            if key in values:
                self.server_values[key] = values[key]

    def _observe_client(self, sample: ClientSample) -> None:
        previous_tokens = self._client_prev.get("client_tokens", float(sample.tokens_total))
        current = {
            "client_bytes": float(sample.bytes_total),
            "client_tokens": float(sample.tokens_total),
            "client_requests_done": float(sample.requests_done),
        }
        if sample.streaming > 0:
            if self.streaming_since is None:
                self.streaming_since = sample.ts
        else:
            self.streaming_since = None
        for key, value in current.items():
            old = self._client_prev.get(key)
            if old is not None and value != old:
                if key == "client_tokens":
                    # The token's own time feeds the sequential evidence only: the window
                    # rules keep the probe's time, the one their goals were measured with.
                    self._client_gap(sample.ts)
                    at = self._token_time(sample)
                    stepped_back = self.client is not None and sample.ts < self.client.ts
                    self.client_alive_at = (at if self.client_alive_at is None or stepped_back
                                            else max(at, self.client_alive_at))
                if key in ("client_requests_done", "client_bytes"):
                    # Progress is generated tokens (soak.load.progress). Bytes alone are
                    # keep-alive comments or a trickle: a server that sends ": ping" and
                    # nothing else read as healthy for a whole soak. A request that ends
                    # without a token is a failure (the client's own stall timeout on a
                    # hung server, seen on the real vLLM), not progress: counting it
                    # restarted the clock and taught a 60 s "healthy" gap.
                    continue
                self._progress(key, sample.ts, self.client.ts if self.client else None)
        if sample.in_flight > 0 and self.busy_since is None:
            # No server metrics, or a running gauge of 0 while our requests wait:
            # an engine stuck inside a step publishes no new stats, so a hang that
            # begins while the server is between requests leaves the gauge at 0
            # (seen on the real vLLM: SIGSTOP of the last stage between turns).
            self.busy_since = sample.ts
        elif sample.in_flight == 0 and not (self.running and self.running > 0):
            self.busy_since = None
        self._client_prev = current
        self.client = sample
        if self.generated_since_start and self.cold_done_base is None:
            self._open_cold_period(sample)  # the first token was seen before any client progress
        if self.running is None and sample.tokens_total > previous_tokens:
            self._generated()

    def _token_time(self, sample: ClientSample) -> float:
        """When the newest token arrived: the sample dates it (``token_silence_s``) inside
        (the previous sample, this one]; a sample without it, or with junk, says its own time."""
        silence = finite(sample.token_silence_s)
        if silence is None or silence < 0:
            return sample.ts
        at = sample.ts - silence
        if self.client is not None:
            at = max(at, self.client.ts)
        return min(at, sample.ts)

    def _generated(self) -> None:
        """A token was generated: the first one of a server life opens its cold period,
        which lasts until every request in flight then has streamed."""
        if self.generated_since_start:
            return
        self.generated_since_start = True
        if self.client is not None:
            self._open_cold_period(self.client)

    def _open_cold_period(self, sample: ClientSample) -> None:
        self.cold_requests = sample.in_flight
        self.cold_done_base = sample.requests_done

    def _client_gap(self, ts: float) -> None:
        """Generated tokens arrived at ``ts`` (the attribute keeps its old name)."""
        previous = self.last_bytes_change
        self.last_bytes_change = ts
        if self.streaming_since is None:
            return
        start = max(previous, self.streaming_since) if previous is not None else self.streaming_since
        if ts > start:
            self.client_gaps.append(ts - start)

    def _observe_health(self, sample: HealthSample) -> None:
        self.health_ts = sample.ts
        if sample.ok:
            self.health_run = None
            return
        if self.health_run is None:
            self.health_run = HealthRun(sample.ts, sample.ts, 0, sample.status, sample.error)
        run = self.health_run
        run.last, run.failures, run.status, run.error = sample.ts, run.failures + 1, sample.status, sample.error
