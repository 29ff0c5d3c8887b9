"""summary.json, computed only from what the run directory recorded.

The run loop calls ``summarize(run_dir)`` at the end and ``soak report`` calls
it again, so a run cut off by SIGKILL gets the same summary it would have had,
with ``cut_off: true`` (no ``run_ended`` event) and a verdict from what was
recorded: ``fail`` if an incident was recorded, else ``aborted``.

Counting rules:
- ``requests``: every line of requests.jsonl (warm-up included: a warm-up
  failure is still a failure); ``ok`` is outcome ``ok``, ``failed`` the rest.
- ``tokens``: prompt tokens (as the server reported them in usage, else as
  planned) and generated tokens over every request, warm-up included: what the
  server was asked to process, comparable with its own counters.
- ``latency`` and ``throughput``: warm-up requests excluded.
- ``prefix_cache_hit_ratio``: the server's counters over the run,
  delta(prefix_cache_hits) / delta(prefix_cache_queries), summing increases
  across counter resets (a restarted server starts again from zero). Never
  hits / prompt_tokens.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

from soak.store.jsonl import read_jsonl
from soak.store.store import EVENTS, REQUESTS, SAMPLES

INCIDENT_FIELDS = ("kind", "rule", "onset_at", "detected_at", "killed_pids", "gpus_released", "evidence")


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), ``q`` in 0..100."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _stats(values: list[float]) -> dict[str, float | None]:
    return {
        "mean": sum(values) / len(values) if values else None,
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values) if values else None,
    }


class CounterDelta:
    """The increase of a monotonic counter across samples, through resets."""

    __slots__ = ("total", "_last")

    def __init__(self) -> None:
        self.total = 0.0
        self._last: float | None = None

    def add(self, value: float) -> None:
        if self._last is not None:
            # A drop means the server restarted and counts from zero again.
            self.total += value - self._last if value >= self._last else value
        self._last = value

    @property
    def seen(self) -> bool:
        return self._last is not None


def server_counter_deltas(samples: Iterable[dict[str, Any]], keys: Iterable[str]) -> dict[str, CounterDelta]:
    deltas = {key: CounterDelta() for key in keys}
    for sample in samples:
        if sample.get("kind") != "server" or not sample.get("ok"):
            continue
        values = sample.get("values") or {}
        for key, delta in deltas.items():
            value = values.get(key)
            if isinstance(value, (int, float)):
                delta.add(float(value))
    return deltas


def summarize(run_dir: str | Path) -> dict[str, Any]:
    run_dir = Path(run_dir)
    read_stats: dict[str, int] = {}

    started_at = ended_at = load_started = load_stopped = None
    last_ts: float | None = None
    run_started: dict[str, Any] = {}
    run_ended: dict[str, Any] | None = None
    incidents: list[dict[str, Any]] = []
    restarts = 0
    build: dict[str, Any] = {}
    for event in read_jsonl(run_dir / EVENTS, stats=read_stats):
        ts = event.get("ts")
        if isinstance(ts, (int, float)):
            last_ts = ts if last_ts is None else max(last_ts, ts)
        kind = event.get("type")
        if kind == "run_started":
            run_started = event
            started_at = ts
        elif kind == "load_started":
            load_started = ts
        elif kind == "load_stopped":
            load_stopped = ts
        elif kind == "run_ended":
            run_ended = event
            ended_at = ts
        elif kind == "incident":
            incidents.append({k: event.get(k) for k in (*INCIDENT_FIELDS, "number", "summary", "gpu_free_s")})
        elif kind == "restart_done":
            restarts += 1
        elif kind == "build":
            build = {k: v for k, v in event.items() if k not in ("ts", "type")}

    ok = failed = warmup = 0
    by_outcome: dict[str, int] = {}
    prompt_tokens = generated_tokens = cached_tokens = 0
    cached_known = 0
    ttft: list[float] = []
    tpot: list[float] = []
    e2e: list[float] = []
    itl_p50: list[float] = []
    measured_generated = 0
    first_request = last_request = None
    for record in read_jsonl(run_dir / REQUESTS, stats=read_stats):
        outcome = record.get("outcome")
        by_outcome[outcome] = by_outcome.get(outcome, 0) + 1
        if outcome == "ok":
            ok += 1
        else:
            failed += 1
        prompt_tokens += record.get("prompt_tokens") or 0
        generated_tokens += record.get("output_tokens") or 0
        if record.get("cached_tokens") is not None:
            cached_tokens += record["cached_tokens"]
            cached_known += 1
        end = record.get("ended_at")
        if isinstance(end, (int, float)):
            last_ts = end if last_ts is None else max(last_ts, end)
            last_request = end if last_request is None else max(last_request, end)
        start = record.get("started_at")
        if isinstance(start, (int, float)):
            first_request = start if first_request is None else min(first_request, start)
        if record.get("warmup"):
            warmup += 1
            continue
        measured_generated += record.get("output_tokens") or 0
        if outcome == "ok":
            for name, into in (("ttft_s", ttft), ("tpot_s", tpot), ("e2e_s", e2e), ("itl_p50_s", itl_p50)):
                value = record.get(name)
                if isinstance(value, (int, float)):
                    into.append(float(value))

    server_keys = ("prefix_cache_hits", "prefix_cache_queries", "prompt_tokens", "generation_tokens")
    samples = 0

    def counted_samples() -> Iterable[dict[str, Any]]:
        nonlocal samples, last_ts
        for sample in read_jsonl(run_dir / SAMPLES, stats=read_stats):
            samples += 1
            ts = sample.get("ts")
            if isinstance(ts, (int, float)):
                last_ts = ts if last_ts is None else max(last_ts, ts)
            yield sample

    deltas = server_counter_deltas(counted_samples(), server_keys)
    hits, queries = deltas["prefix_cache_hits"], deltas["prefix_cache_queries"]
    hit_ratio = hits.total / queries.total if hits.seen and queries.seen and queries.total > 0 else None

    cut_off = run_ended is None
    if ended_at is None:
        ended_at = last_ts
    if started_at is None:
        started_at = first_request
    load_begin = load_started if load_started is not None else first_request
    load_end = load_stopped if load_stopped is not None else (last_request if cut_off else ended_at)
    duration_s = max(0.0, load_end - load_begin) if load_begin is not None and load_end is not None else 0.0
    warmup_s = float(run_started.get("warmup_s") or 0.0)
    measured_s = max(0.0, duration_s - warmup_s)

    if run_ended is not None and run_ended.get("verdict") in ("pass", "fail", "aborted"):
        verdict = run_ended["verdict"]
    else:
        verdict = "fail" if incidents else ("aborted" if cut_off else "pass")

    summary = {
        "verdict": verdict,
        "cut_off": cut_off,
        "run_id": run_started.get("run_id"),
        "target": run_started.get("target"),
        "model": run_started.get("model"),
        "started_at": started_at,
        "ended_at": ended_at,
        "duration_s": duration_s,
        "planned_duration_s": run_started.get("duration_s"),
        "warmup_s": warmup_s,
        "stop_reason": (run_ended or {}).get("reason"),
        "exit_code": (run_ended or {}).get("exit_code"),
        "requests": {"ok": ok, "failed": failed, "warmup": warmup, "by_outcome": by_outcome},
        "tokens": {
            "prompt": prompt_tokens,
            "generated": generated_tokens,
            "cached": cached_tokens if cached_known else None,
        },
        "server_tokens": {
            "prompt": deltas["prompt_tokens"].total if deltas["prompt_tokens"].seen else None,
            "generated": deltas["generation_tokens"].total if deltas["generation_tokens"].seen else None,
        },
        "prefix_cache_hit_ratio": hit_ratio,
        "throughput": {
            "generated_tokens_per_s": measured_generated / measured_s if measured_s > 0 else None,
            "requests_per_s": (ok + failed - warmup) / measured_s if measured_s > 0 else None,
        },
        "latency": {
            "ttft_s": _stats(ttft),
            "tpot_s": _stats(tpot),
            "e2e_s": _stats(e2e),
            "itl_p50_s": _stats(itl_p50),
        },
        "incidents": incidents,
        "restarts": restarts,
        "records": {"samples": samples, **read_stats},
        "build": build or None,
    }
    from soak.thresholds.rundir import summary_thresholds

    summary["thresholds"] = summary_thresholds(run_dir, summary)
    return summary
