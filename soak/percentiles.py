"""The one percentile every stage reports: summary.json, thresholds, the live view,
the report's tables and the client's per-request ITL figures."""

from __future__ import annotations

import math
from typing import Iterable, Literal

Method = Literal["linear", "nearest_rank"]

# The quantiles every latency table lists (summary.json's latency block, thresholds,
# the report, the end of a run): p95 beside p90 and p99, as k6 and vLLM's dashboard show it.
LATENCY_QUANTILES: tuple[str, ...] = ("p50", "p90", "p95", "p99")


def percentile(values: Iterable[float], q: float, *, method: Method = "linear") -> float | None:
    """The ``q``-th percentile (``q`` in 0..100) of ``values``; None when there are none.

    ``linear`` interpolates between the two nearest ranks (numpy's default, and
    what summary.json reports). ``nearest_rank`` is the smallest value with at
    least ``q`` percent of the values at or below it, as vLLM's benchmark
    reports per-request ITL percentiles (``itl_p50_s``, ``itl_p99_s``).
    """
    return _at(sorted(values), q, method)


def percentiles(values: Iterable[float], qs: Iterable[float], *, method: Method = "linear") -> list[float | None]:
    """``percentile`` at each of ``qs``, sorting ``values`` once."""
    ordered = sorted(values)
    return [_at(ordered, q, method) for q in qs]


def latency_stats(values: Iterable[float]) -> dict[str, float | None]:
    """mean, p50, p90, p95, p99 and max of ``values`` (None each where there are
    none): summary.json's latency block, one per latency."""
    ordered = sorted(values)
    stats: dict[str, float | None] = {"mean": sum(ordered) / len(ordered) if ordered else None}
    for name in LATENCY_QUANTILES:
        stats[name] = _at(ordered, float(name[1:]), "linear")
    stats["max"] = ordered[-1] if ordered else None
    return stats


def _at(ordered: list[float], q: float, method: Method) -> float | None:
    if not ordered:
        return None
    if method == "nearest_rank":
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered) / 100) - 1))]
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


__all__ = ["LATENCY_QUANTILES", "latency_stats", "percentile", "percentiles"]
