"""The one table of a run's figures by name: thresholds, ``soak compare`` and
``soak history`` all speak these names.

A figure is read from summary.json (the whole run, a
``soak.summary_file.RunSummary``) with ``run_value(name, summary)`` along the
metric's ``summary_path``, or computed over any slice of the recorded requests and server
samples with ``window_values`` (a sliding window of a live run, or one window
of a recorded one). Both follow summary.json's counting rules: latencies over
successful requests outside the warm-up; the error rate over every request
the server answered or failed (requests the harness cut are neither); the hit
ratio from the server's counters, rate(hits)/rate(queries).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable, Mapping, Sequence

from soak.percentiles import LATENCY_QUANTILES, percentile
from soak.summary_file import RunSummary


class Quantity(str, Enum):
    DURATION = "duration"  # seconds; written with a unit: 250ms, 90s, 2m
    RATIO = "ratio"  # 0..1; written 0.9 or 90%
    RATE = "rate"  # per second; written 60 or 60/s
    COUNT = "count"


class Better(str, Enum):
    HIGHER = "higher"
    LOWER = "lower"


@dataclass(frozen=True)
class RunMetric:
    name: str
    label: str
    quantity: Quantity
    better: Better
    # where summary.json keeps it (a path of keys), or None when computed
    summary_path: tuple[str, ...] | None = None
    # False: a figure only `soak compare` computes (per-request samples), not one a threshold can name
    thresholdable: bool = True


LATENCY_STATS = (*LATENCY_QUANTILES, "mean", "max")


def _latency(stat: str, q: str, label: str) -> RunMetric:
    return RunMetric(f"{stat}_{q}", f"{label} {q}", Quantity.DURATION, Better.LOWER, ("latency", f"{stat}_s", q))


RUN_METRICS: dict[str, RunMetric] = {
    m.name: m
    for m in (
        *(_latency("ttft", q, "TTFT") for q in LATENCY_STATS),
        *(_latency("tpot", q, "TPOT") for q in LATENCY_STATS),
        *(_latency("e2e", q, "end-to-end latency") for q in LATENCY_STATS),
        # ITL: each request's median gap, then the quantile over requests (summary.json's itl_p50_s block).
        *(RunMetric(f"itl_{q}", f"ITL (per-request median), {q} over requests", Quantity.DURATION, Better.LOWER,
                    ("latency", "itl_p50_s", q)) for q in LATENCY_QUANTILES),
        RunMetric("itl_mean", "ITL (mean per request)", Quantity.DURATION, Better.LOWER, thresholdable=False),
        RunMetric("itl_p99_p50", "ITL p99 per request, p50 over requests", Quantity.DURATION, Better.LOWER,
                  thresholdable=False),
        RunMetric("error_rate", "error rate", Quantity.RATIO, Better.LOWER),
        RunMetric("output_tokens_per_s", "throughput (generated tokens/s)", Quantity.RATE, Better.HIGHER,
                  ("throughput", "generated_tokens_per_s")),
        RunMetric("requests_per_s", "requests/s", Quantity.RATE, Better.HIGHER, ("throughput", "requests_per_s")),
        RunMetric("prefix_hit_ratio", "prefix-cache hit ratio", Quantity.RATIO, Better.HIGHER,
                  ("prefix_cache_hit_ratio",)),
        RunMetric("hangs", "hangs", Quantity.COUNT, Better.LOWER),
        RunMetric("hang_rate", "hang rate", Quantity.RATE, Better.LOWER),
    )
}

# Outcomes that are the harness's doing (a drain cut short, an incident's kill),
# not the server's: left out of the error rate.
CUT_BY_HARNESS = frozenset({"aborted"})


def metric(name: str) -> RunMetric:
    try:
        return RUN_METRICS[name]
    except KeyError:
        raise KeyError(f"unknown metric {name!r}, known: {', '.join(RUN_METRICS)}") from None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def error_rate_of(by_outcome: Mapping[str, Any]) -> float | None:
    answered = {k: v for k, v in by_outcome.items() if k not in CUT_BY_HARNESS and isinstance(v, int)}
    total = sum(answered.values())
    if total == 0:
        return None
    return (total - answered.get("ok", 0)) / total


def run_value(name: str, summary: RunSummary | Mapping[str, Any]) -> float | None:
    """The whole run's figure, from summary.json; None where it recorded none.
    ``summary``: the typed record, or summary.json as parsed (read through it)."""
    spec = metric(name)
    summary = RunSummary.of(summary)
    if spec.summary_path is not None:
        return summary.figure(spec.summary_path)
    if name == "error_rate":
        # The failure criterion's own figure where the run store records one.
        if summary.error_rate is not None:
            return summary.error_rate
        return error_rate_of(summary.requests.by_outcome)
    if name not in ("hangs", "hang_rate"):
        return None
    if name == "hangs":
        return float(summary.hangs)
    exposure = summary.duration_s
    return summary.hangs / exposure if exposure else None


def _stat(values: Sequence[float], which: str) -> float | None:
    if not values:
        return None
    if which == "mean":
        return sum(values) / len(values)
    if which == "max":
        return max(values)
    return percentile(values, float(which[1:]))


def window_values(requests: Iterable[Mapping[str, Any]], server: Sequence[tuple[float, Mapping[str, Any]]],
                  *, span_s: float) -> dict[str, float | None]:
    """Every windowable figure over ``requests`` (requests.jsonl lines that ended in
    the window) and ``server`` ((ts, values) of server samples in it), ``span_s`` long."""
    lat: dict[str, list[float]] = {"ttft": [], "tpot": [], "e2e": [], "itl_p50": []}
    by_outcome: dict[str, int] = {}
    measured = generated = 0
    for r in requests:
        outcome = str(r.get("outcome"))
        by_outcome[outcome] = by_outcome.get(outcome, 0) + 1
        if r.get("warmup"):
            continue
        measured += 1
        generated += r.get("output_tokens") or 0
        if outcome != "ok":
            continue
        for stat, key in (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("e2e", "e2e_s"), ("itl_p50", "itl_p50_s")):
            value = _number(r.get(key))
            if value is not None:
                lat[stat].append(value)
    out: dict[str, float | None] = {}
    for stat in ("ttft", "tpot", "e2e"):
        for which in LATENCY_STATS:
            out[f"{stat}_{which}"] = _stat(lat[stat], which)
    for which in LATENCY_QUANTILES:
        out[f"itl_{which}"] = _stat(lat["itl_p50"], which)
    out["error_rate"] = error_rate_of(by_outcome)
    out["output_tokens_per_s"] = generated / span_s if span_s > 0 else None
    out["requests_per_s"] = measured / span_s if span_s > 0 else None
    out["prefix_hit_ratio"] = _hit_ratio(server)
    return out


def _hit_ratio(server: Sequence[tuple[float, Mapping[str, Any]]]) -> float | None:
    # Counters read as Prometheus' increase() reads them (soak.counters, the one place).
    from soak.counters import CounterDelta

    hits, queries = CounterDelta(), CounterDelta()
    for _ts, values in server:
        hits.add(values.get("prefix_cache_hits"))
        queries.add(values.get("prefix_cache_queries"))
    return hits.total / queries.total if queries.total > 0 else None
