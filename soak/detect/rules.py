"""The named rules: each a small pure function of the tracked signals and ``now``
that returns a typed RuleStatus with its reasons and the thresholds in force.
"""

from __future__ import annotations

from typing import Callable

from soak.detect.config import DetectorConfig
from soak.detect.seq_rule import pp_tail_sequential
from soak.detect.signals import SignalTracker
from soak.detect.stage_rule import stage_cpu_stall
from soak.records import IncidentKind, RuleState, RuleStatus
from soak.redact import clip
from soak.samples import GpuSource

Rule = Callable[[SignalTracker, DetectorConfig, float], RuleStatus]

# Log signatures (soak.probes.logwatch) that say the engine is dead rather than stuck.
CRASH_SIGNATURES = frozenset({"engine_dead"})


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def pp_tail_stall(s: SignalTracker, config: DetectorConfig, now: float) -> RuleStatus:
    cfg = config.pp_tail_stall
    name = "pp_tail_stall"
    stage_cpu = s.gpu_source is GpuSource.STAGE_CPU
    low_pct, high_pct, window = cfg.marks(s.gpu_source)
    thresholds = {"low_pct": low_pct, "high_pct": high_pct, "window_s": window}
    what = "stage CPU" if stage_cpu else "GPU"
    if not cfg.enabled:
        return RuleStatus(name, RuleState.INACTIVE, reasons=("disabled",))
    if len(s.topology.stages) < 2:
        return RuleStatus(name, RuleState.INACTIVE, reasons=("one pipeline stage: no tail to stall",))
    if s.gpu_ts is None:
        return RuleStatus(name, RuleState.INACTIVE, reasons=(f"no GPU or stage CPU readings ({s.gpu_error or 'none yet'})",))
    if s.gpu_error is not None and s.gpu_error.startswith("stale"):
        return RuleStatus(name, RuleState.INACTIVE, reasons=(s.gpu_error,))
    if not stage_cpu and cfg.sequential.enabled:
        return pp_tail_sequential(s, config, now)
    run = s.tail_run
    if run is None:
        return RuleStatus(name, RuleState.CLEAR, threshold_s=window, evidence={"thresholds": thresholds})
    if stage_cpu and cfg.stage_cpu.after_first_token and not s.generated_since_start:
        return RuleStatus(
            name, RuleState.CLEAR, threshold_s=window,
            reasons=("stage CPU: before this server life's first token (start-up, compiles, cold prefill)",),
            evidence={"thresholds": thresholds},
        )
    if not s.in_flight:
        return RuleStatus(
            name, RuleState.CLEAR, threshold_s=window, reasons=("no requests in flight",),
            evidence={"thresholds": thresholds},
        )
    last_progress = s.last_progress_at
    # Progress past the grace (a scrape that lands just after the stop reports the last
    # tokens before it) restarts the clock at that progress: a pattern that began while
    # the pipeline still moved (a loaded box's readings, a run the blips kept) is timed
    # from when it stopped moving, not cleared for as long as the pattern lasts.
    moved = last_progress is not None and last_progress > run.since + cfg.progress_grace
    start = last_progress if moved else run.since
    elapsed = run.last - start
    if moved and elapsed < window:
        return RuleStatus(
            name, RuleState.CLEAR, threshold_s=window,
            reasons=(f"progress {last_progress - run.since:.1f}s into the {what} pattern; "
                     f"{max(0.0, elapsed):.1f}s without since",),
            evidence={"thresholds": thresholds},
        )
    tail = ",".join(str(i) for i in s.topology.last_stage)
    reasons = (
        (f"last stage {len(s.topology.stages) - 1} CPU at {run.tail_pct:g}% of a core "
         f"(<= {low_pct:g}%) while every upstream stage is at >= {run.upstream_pct:g}% (>= {high_pct:g}%) "
         f"for {elapsed:.1f}s (stage CPU, no GPUs)" if stage_cpu else
         f"last stage GPU {tail} at {run.tail_pct:g}% (<= {low_pct:g}%) while upstream GPUs "
         f"are at >= {run.upstream_pct:g}% (>= {high_pct:g}%) for {elapsed:.1f}s"),
        "no progress signal moved since" if last_progress is None or last_progress <= run.since
        else f"last progress {last_progress - run.since:.1f}s after the pattern began (grace {cfg.progress_grace:g}s)",
        f"requests running: {s.running if s.running is not None else 'unknown'}; "
        f"client in flight: {s.client.in_flight if s.client else 'unknown'}",
    )
    evidence = {
        "signals": {
            ("stage_cpu_pct" if stage_cpu else "gpu_util_pct"): {str(k): v for k, v in sorted(s.gpu_levels.items())},
            "source": s.gpu_source.value if s.gpu_source else None,
            "tail_stage": len(s.topology.stages) - 1,
            "tail_gpus": list(s.topology.last_stage),
            "upstream_gpus": list(s.topology.upstream),
            "points": run.points,
            "running": s.running,
            "last_progress_at": last_progress,
        },
        "since": run.since,
        "thresholds": {**thresholds, "progress_grace_s": cfg.progress_grace},
    }
    state = RuleState.FIRED if elapsed >= window else RuleState.PENDING
    return RuleStatus(name, state, IncidentKind.HANG, run.since, _round(elapsed), window, reasons, evidence)


def generation_frozen(s: SignalTracker, config: DetectorConfig, now: float) -> RuleStatus:
    cfg = config.generation_frozen
    name = "generation_frozen"
    if not cfg.enabled:
        return RuleStatus(name, RuleState.INACTIVE, reasons=("disabled",))
    if s.server_ts is None and s.client is None:
        return RuleStatus(name, RuleState.INACTIVE, reasons=("no server metrics or client progress yet",))
    if s.server_error is not None:
        # Without KV usage and prefix-cache queries a healthy cold prefill looks
        # frozen; client_stall and pp_tail_stall keep watching meanwhile.
        return RuleStatus(name, RuleState.INACTIVE, reasons=(f"server metrics unavailable: {s.server_error}",))
    if s.busy_since is None:
        return RuleStatus(name, RuleState.INACTIVE, reasons=("no requests running",))
    observed_until = max(t for t in (s.server_ts, s.client.ts if s.client else None) if t is not None)
    last_progress = s.last_progress_at
    since = max(last_progress, s.busy_since) if last_progress is not None else s.busy_since
    elapsed = max(0.0, observed_until - since)
    learned = s.learned_gap_s
    if s.generated_since_start:
        threshold = cfg.threshold(learned)
        basis = f"longest healthy gap {learned:.1f}s x {cfg.safety_factor:g}, clamped to [{cfg.floor:g}s, {cfg.ceiling:g}s]"
        if s.cold:
            basis += " (the server's first requests are still running: cold-start gaps count)"
    else:
        threshold = max(cfg.startup_grace, cfg.floor)
        basis = f"start-up grace {cfg.startup_grace:g}s (no token generated since start)"
    prefill_unseen = (not s.prefill_visible and s.client is not None and s.client.in_flight > 0
                      and s.client.streaming == 0 and threshold < cfg.unseen_prefill_grace)
    if prefill_unseen:
        threshold = cfg.unseen_prefill_grace
        basis = (f"no stream is past its first token and /metrics shows nothing a prefill moves "
                 f"(no KV usage): a prefill unseen is allowed {threshold:g}s")
    moved = {k: round(observed_until - t, 3) for k, t in sorted(s.last_change.items())}
    evidence = {
        "signals": {
            "generation_tokens": s.server_values.get("generation_tokens"),
            "running": s.running,
            "kv_cache_usage_perc": s.server_values.get("kv_cache_usage_perc"),
            "prefix_cache_queries": s.server_values.get("prefix_cache_queries"),
            "client_bytes": s.client.bytes_total if s.client else None,
            "seconds_since_each_signal_moved": moved,
        },
        "since": since,
        "thresholds": {
            "threshold_s": threshold,
            "learned_gap_s": learned,
            "cold_start": s.cold,
            "safety_factor": cfg.safety_factor,
            "floor_s": cfg.floor,
            "ceiling_s": cfg.ceiling,
            "startup_grace_s": cfg.startup_grace,
            "prefill_unseen": prefill_unseen,
        },
    }
    reasons = (
        f"no progress signal moved for {elapsed:.1f}s with requests running "
        f"(generation counter, KV usage, prefix-cache queries, client tokens all flat)",
        f"threshold {threshold:.1f}s: {basis}",
    )
    return _against_threshold(name, elapsed, threshold, cfg.suspect_fraction, since, reasons, evidence)


def _against_threshold(name, elapsed, threshold, suspect_fraction, since, reasons, evidence) -> RuleStatus:
    """Fired past the threshold, pending past its suspect fraction, else clear."""
    if elapsed >= threshold:
        state = RuleState.FIRED
    elif elapsed >= threshold * suspect_fraction:
        state = RuleState.PENDING
    else:
        return RuleStatus(name, RuleState.CLEAR, elapsed_s=_round(elapsed), threshold_s=threshold, evidence=evidence)
    return RuleStatus(name, state, IncidentKind.HANG, since, _round(elapsed), threshold, reasons, evidence)


def client_stall(s: SignalTracker, config: DetectorConfig, now: float) -> RuleStatus:
    cfg = config.client_stall
    name = "client_stall"
    if not cfg.enabled:
        return RuleStatus(name, RuleState.INACTIVE, reasons=("disabled",))
    client = s.client
    if client is None:
        return RuleStatus(name, RuleState.INACTIVE, reasons=("no client progress yet",))
    if client.in_flight <= 0 or s.streaming_since is None:
        return RuleStatus(name, RuleState.INACTIVE, reasons=("no stream past its first token",))
    since = max(s.last_bytes_change, s.streaming_since) if s.last_bytes_change is not None else s.streaming_since
    elapsed = max(0.0, client.ts - since)
    learned = s.learned_client_gap_s
    threshold = cfg.threshold(learned)
    evidence = {
        "signals": {
            "in_flight": client.in_flight,
            "streaming": client.streaming,
            "bytes_total": client.bytes_total,
            "max_silence_s": client.max_silence_s,
        },
        "since": since,
        "thresholds": {
            "threshold_s": threshold,
            "learned_gap_s": learned,
            "safety_factor": cfg.safety_factor,
            "floor_s": cfg.floor,
            "ceiling_s": cfg.ceiling,
        },
    }
    reasons = (
        f"no generated token arrived on any of {client.in_flight} in-flight streams for {elapsed:.1f}s",
        f"threshold {threshold:.1f}s: longest healthy gap {learned:.1f}s x {cfg.safety_factor:g}, "
        f"clamped to [{cfg.floor:g}s, {cfg.ceiling:g}s]",
    )
    return _against_threshold(name, elapsed, threshold, cfg.suspect_fraction, since, reasons, evidence)


def log_signature(s: SignalTracker, config: DetectorConfig, now: float) -> RuleStatus:
    cfg = config.log_signature
    name = "log_signature"
    if not cfg.enabled:
        return RuleStatus(name, RuleState.INACTIVE, reasons=("disabled",))
    if s.fatal_logs:
        first = s.fatal_logs[0]
        kind = IncidentKind.CRASH if first.signature in CRASH_SIGNATURES else IncidentKind.HANG
        onset = _log_onset(s, first, cfg.execute_model_timeout)
        evidence = {
            "signals": {
                "lines": [{"ts": x.ts, "signature": x.signature, "line": x.line, "fields": dict(x.fields)}
                          for x in s.fatal_logs[:20]],
                "last_progress_at": s.last_progress_at,
            },
            "since": onset,
            "thresholds": {"fatal": True},
        }
        reasons = (f"fatal log signature {first.signature}: {clip(first.line.strip(), 300)}",)
        return RuleStatus(name, RuleState.FIRED, kind, onset, _round(now - onset), 0.0, reasons, evidence)
    waits = s.shm_waits_since_progress
    # Before a server life's first token the workers may still compile (vLLM logs the
    # line through a healthy start-up): generation_frozen's start-up grace covers that.
    if len(waits) >= s.shm_waits_needed and s.in_flight and s.generated_since_start:
        return _shm_broadcast_hang(s, config, waits, now)
    last = s.last_nonfatal_log
    if last is not None and now - last.ts < cfg.suspect_for:
        return RuleStatus(
            name, RuleState.PENDING, IncidentKind.HANG, None, _round(now - last.ts), None,
            (f"warning log signature {last.signature}: {clip(last.line.strip(), 300)}",),
            {"signals": {"line": last.line, "signature": last.signature, "ts": last.ts},
             "thresholds": {"suspect_for_s": cfg.suspect_for}},
        )
    return RuleStatus(name, RuleState.CLEAR)


def _shm_broadcast_hang(s: SignalTracker, config: DetectorConfig, waits: list, now: float) -> RuleStatus:
    """vLLM's own word that no broadcast block moved, repeated while the counters stood
    still and requests were running: the engine is stuck, not slow."""
    cfg = config.log_signature
    first, latest = waits[0], waits[-1]
    last_progress = s.last_progress_at
    wait_s = first.fields.get("wait_s")
    if last_progress is not None and last_progress <= first.ts:
        onset = last_progress
    elif isinstance(wait_s, (int, float)):
        onset = first.ts - wait_s
    else:
        onset = first.ts
    interval = f"{wait_s:g}s" if isinstance(wait_s, (int, float)) else "unknown"
    needed = s.shm_waits_needed
    cold = " while the server life's first requests still run" if needed > cfg.shm_broadcast_repeats else ""
    reasons = (
        f"shm-broadcast wait logged {len(waits)} times (>= {needed}{cold}) since the last progress: "
        f"vLLM found no shared memory broadcast block for {interval} each time "
        f"(VLLM_RINGBUFFER_WARNING_INTERVAL)",
        "no progress signal moved since" if last_progress is None
        else f"last progress {max(0.0, latest.ts - last_progress):.1f}s before the latest wait "
             f"(generation counter, KV usage, client tokens all flat)",
        f"requests running: {s.running if s.running is not None else 'unknown'}; "
        f"client in flight: {s.client.in_flight if s.client else 'unknown'}",
        f"latest line: {clip(latest.line.strip(), 300)}",
    )
    evidence = {
        "signals": {
            "signature": latest.signature,
            "lines": [{"ts": x.ts, "signature": x.signature, "line": x.line, "fields": dict(x.fields)} for x in waits[:20]],
            "last_progress_at": last_progress,
            "running": s.running,
            "generation_tokens": s.server_values.get("generation_tokens"),
        },
        "since": onset,
        "thresholds": {"shm_broadcast_repeats": cfg.shm_broadcast_repeats, "needed": needed},
    }
    return RuleStatus("log_signature", RuleState.FIRED, IncidentKind.HANG, onset, _round(now - onset),
                      None, reasons, evidence)


def _log_onset(s: SignalTracker, line, execute_timeout: float) -> float:
    """When progress stopped: the last progress seen, else what the line implies."""
    if s.last_progress_at is not None and s.last_progress_at <= line.ts:
        return s.last_progress_at
    timeout_ms = line.fields.get("timeout_ms")
    if isinstance(timeout_ms, (int, float)):
        return line.ts - timeout_ms / 1000.0
    if line.signature == "sample_tokens_timeout":
        return line.ts - execute_timeout
    return line.ts


def server_gone(s: SignalTracker, config: DetectorConfig, now: float) -> RuleStatus:
    cfg = config.server_gone
    name = "server_gone"
    if not cfg.enabled:
        return RuleStatus(name, RuleState.INACTIVE, reasons=("disabled",))
    thresholds = {"health_failures": cfg.health_failures, "health_window_s": cfg.health_window}
    dead = s.process_dead
    if dead is not None:
        return RuleStatus(
            name, RuleState.FIRED, IncidentKind.CRASH, dead.ts, _round(now - dead.ts), 0.0,
            (f"server process {dead.pid} exited (code {dead.exit_code})",),
            {"signals": {"pid": dead.pid, "exit_code": dead.exit_code}, "since": dead.ts, "thresholds": thresholds},
        )
    run = s.health_run
    if s.health_ts is None and s.server_ts is None:
        return RuleStatus(name, RuleState.INACTIVE, reasons=("no health check yet",))
    if run is None:
        return RuleStatus(name, RuleState.CLEAR, evidence={"thresholds": thresholds})
    span = run.last - run.since
    evidence = {
        "signals": {"failures": run.failures, "status": run.status, "error": run.error},
        "since": run.since,
        "thresholds": thresholds,
    }
    reasons = (
        f"/health failed {run.failures} times in a row over {span:.1f}s "
        f"(last: {run.status if run.status is not None else run.error})",
    )
    fired = run.failures >= cfg.health_failures and span >= cfg.health_window
    state = RuleState.FIRED if fired else RuleState.PENDING
    return RuleStatus(name, state, IncidentKind.SERVER_GONE, run.since, _round(span), cfg.health_window, reasons, evidence)


def corruption(s: SignalTracker, config: DetectorConfig, now: float) -> RuleStatus:
    """A canary answer the oracle could not explain (CORRUPT) or that carried another
    canary's answer (CROSSTALK) fires at once: the server answers, wrongly. The onset
    lies between the last good canary's start and the end of this one's answer
    (a misalignment can strike mid-answer; before any good canary: since the
    detector's reset, when that is known)."""
    name = "corruption"
    bad = s.canary_bad
    if bad is None:
        if s.canary_good_at is None:
            return RuleStatus(name, RuleState.INACTIVE, reasons=("no canary judged yet",))
        return RuleStatus(name, RuleState.CLEAR)
    latest = bad.ts  # the bad answer was judged as it ended: the misalignment came before
    earliest = s.canary_bad_before
    if earliest is None and s.started_at != float("-inf"):
        earliest = min(s.started_at, latest)
    onset = earliest if earliest is not None else latest
    judgement = (bad.evidence or {}).get("judgement") or {}
    reason = judgement.get("reason") or (bad.evidence or {}).get("reason") or f"canary {bad.canary_id}: {bad.verdict}"
    reasons = (clip(str(reason), 600),
               f"canary {bad.canary_id} ({'long' if bad.long else 'short'}), verdict {bad.verdict}, "
               f"reference from {bad.reference_source or 'unknown'}"
               + (f", crosstalk with {bad.crosstalk_with}" if bad.crosstalk_with else ""))
    evidence = {
        "signals": {"canary": {"canary_id": bad.canary_id, "verdict": str(bad.verdict), "long": bad.long,
                               "started_at": bad.started_at, "ts": bad.ts, "position": bad.position,
                               "reference_source": bad.reference_source, "crosstalk_with": bad.crosstalk_with,
                               "prompt_tokens": bad.prompt_tokens, "share": bad.share},
                    "bad_canaries": s.canaries_bad, "last_good_canary_at": s.canary_bad_before},
        "canary": dict(bad.evidence or {}),
        "since": onset,
        "onset_interval": {"earliest": earliest, "latest": latest},
        "thresholds": {"fires_on": ["corrupt", "crosstalk"]},
    }
    return RuleStatus(name, RuleState.FIRED, IncidentKind.CORRUPTION, onset, _round(max(0.0, now - onset)), 0.0,
                      reasons, evidence)


# Evaluated in this order; when several fire at once the first one names the incident.
RULES: tuple[tuple[str, Rule], ...] = (
    ("server_gone", server_gone),
    ("log_signature", log_signature),
    ("pp_tail_stall", pp_tail_stall),
    ("stage_cpu_stall", stage_cpu_stall),
    ("generation_frozen", generation_frozen),
    ("client_stall", client_stall),
    # Last: a hang decided on the same tick names the incident (it needs the kill).
    ("corruption", corruption),
)
