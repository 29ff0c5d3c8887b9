"""A/B comparison of two run directories: B judged against A.

Per-window figures (throughput, hit ratio) come from the server's counters in
windows of ``window_s`` seconds, leaving out windows that overlap a hang (from
its onset to a minute after detection): the question is what the fix costs
while the server works, and the hang rate is compared on its own. Latencies
are compared per request (bootstrap of the quantile), hang rates with the exact
Poisson rate-ratio test.

``compare_pair`` is the one place that decides whether the two runs are compared
at all: runs that differ in target, workload, model or layout
(soak.report.identity) get their differences named and no verdict, unless forced.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from soak.durations import format_latency
from soak.report.identity import Aspect, Mismatch, RunIdentity, differences, identify, incomparable
from soak.report.plots import bin_edges, counter_rate
from soak.report.rundir import RunData
from soak.report.stats import (
    Change,
    Difference,
    Estimate,
    compare_means,
    compare_proportions,
    compare_quantiles,
    compare_rates,
)
from soak.thresholds.metrics import Better


@dataclass(frozen=True)
class Comparison:
    a_name: str
    b_name: str
    window_s: float
    confidence: float
    rows: tuple[Difference, ...]
    differences: tuple[Mismatch, ...] = ()  # what the runs record differently, the build's included
    incomparable: tuple[Aspect, ...] = ()  # the aspects that make them two experiments
    forced: bool = False  # compared all the same (--force)
    identities: tuple[RunIdentity, RunIdentity] | None = None

    @property
    def compared(self) -> bool:
        return not self.incomparable or self.forced

    def not_compared(self) -> str | None:
        """Why no row was judged, in one line; None where they were."""
        if self.compared:
            return None
        return f"not compared: the runs differ in {_aspects(self.incomparable)}; --force compares them anyway"

    def worse(self) -> bool:
        """Some row judges B worse than A (--fail-on worse)."""
        return any(row.verdict is Change.WORSE for row in self.rows)


def _aspects(aspects: Sequence[Aspect]) -> str:
    return ", ".join(a.value for a in aspects)


def _hang_spans(run: RunData) -> list[tuple[float, float]]:
    spans = []
    for i in run.summary.incidents:
        if i.onset_at is not None:
            end = i.detected_at if i.detected_at is not None else i.onset_at
            spans.append((i.onset_at, end + 60.0))
    return spans


def _windows(run: RunData, ts: np.ndarray, window_s: float) -> np.ndarray:
    edges = bin_edges(ts[0], ts[-1], max_columns=10**6, min_width_s=window_s)
    if edges[-1] > ts[-1]:
        edges = edges[:-1] if len(edges) > 2 else edges
    return edges


def _keep(edges: np.ndarray, spans: Sequence[tuple[float, float]]) -> np.ndarray:
    keep = np.ones(len(edges) - 1, dtype=bool)
    for lo, hi in spans:
        keep &= ~((edges[1:] > lo) & (edges[:-1] < hi))
    return keep


def window_throughput(run: RunData, window_s: float) -> list[float]:
    ts, values = run.server_ts, run.server["generation_tokens"]
    if ts.size < 2 or not np.isfinite(values).any():
        ts, values = run.client_ts, run.client_tokens
    if ts.size < 2:
        return []
    edges = _windows(run, ts, window_s)
    rate = counter_rate(ts, values, edges)
    keep = _keep(edges, _hang_spans(run)) & np.isfinite(rate)
    return [float(v) for v in rate[keep]]


def window_hit_ratio(run: RunData, window_s: float) -> list[float]:
    ts = run.server_ts
    if ts.size < 2:
        return []
    edges = _windows(run, ts, window_s)
    hits = counter_rate(ts, run.server["prefix_cache_hits"], edges)
    queries = counter_rate(ts, run.server["prefix_cache_queries"], edges)
    keep = _keep(edges, _hang_spans(run)) & np.isfinite(hits) & np.isfinite(queries) & (queries > 0)
    return [float(h / q) for h, q in zip(hits[keep], queries[keep])]


def _ok(run: RunData, key: str) -> list[float]:
    return run.requests.ok_values(key).tolist()


def failed_and_finished(run: RunData) -> tuple[int, int]:
    """summary.json's counts: every finished request, warm-up included; requests
    the harness cut short count neither way (as in the error-rate criterion)."""
    req = run.summary.requests
    ok, failed = req.ok or 0, req.failed or 0
    return failed, ok + failed


def hangs_and_exposure(run: RunData) -> tuple[int, float]:
    """The run's hangs in its time at risk (soak.exposure): the hang rate compare
    gives is the one report.html, soak history and the push count."""
    from soak.exposure import at_risk

    risk = at_risk(run.events, run.summary)
    return risk.hangs, risk.exposure_s


def _clamp(d: Difference, lo: float, hi: float) -> Difference:
    """A ratio's t interval can spill past 0..1 on few windows; the truth cannot."""
    def fix(e: Estimate) -> Estimate:
        return dataclasses.replace(e, lower=None if e.lower is None else max(lo, e.lower),
                                   upper=None if e.upper is None else min(hi, e.upper))

    return dataclasses.replace(d, a=fix(d.a), b=fix(d.b))


def compare_runs(a: RunData, b: RunData, *, a_name: str, b_name: str, window_s: float = 60.0,
                 confidence: float = 0.95, resamples: int = 400) -> Comparison:
    # Each row carries the name thresholds and `soak history` use (one table: soak.thresholds.metrics).
    named = [
        ("output_tokens_per_s", compare_means("throughput (generated tokens/s per window)", "tok/s",
                                              window_throughput(a, window_s), window_throughput(b, window_s),
                                              better=Better.HIGHER, confidence=confidence)),
        ("ttft_p50", compare_quantiles("TTFT p50", "s", _ok(a, "ttft_s"), _ok(b, "ttft_s"), 0.50,
                                       better=Better.LOWER, confidence=confidence, resamples=resamples)),
        ("ttft_p95", compare_quantiles("TTFT p95", "s", _ok(a, "ttft_s"), _ok(b, "ttft_s"), 0.95,
                                       better=Better.LOWER, confidence=confidence, resamples=resamples)),
        ("ttft_p99", compare_quantiles("TTFT p99", "s", _ok(a, "ttft_s"), _ok(b, "ttft_s"), 0.99,
                                       better=Better.LOWER, confidence=confidence, resamples=resamples)),
        ("itl_mean", compare_means("ITL (mean per request)", "s", _ok(a, "itl_mean_s"), _ok(b, "itl_mean_s"),
                                   better=Better.LOWER, confidence=confidence)),
        ("itl_p99_p50", compare_quantiles("ITL p99 per request, p50 over requests", "s", _ok(a, "itl_p99_s"),
                                          _ok(b, "itl_p99_s"), 0.50, better=Better.LOWER, confidence=confidence,
                                          resamples=resamples)),
        ("prefix_hit_ratio", _clamp(compare_means("prefix-cache hit ratio (per window)", "",
                                                  window_hit_ratio(a, window_s), window_hit_ratio(b, window_s),
                                                  better=Better.HIGHER, confidence=confidence), 0.0, 1.0)),
    ]
    (fa, na), (fb, nb) = failed_and_finished(a), failed_and_finished(b)
    named.append(("error_rate", compare_proportions("error rate (failed / finished requests)", fa, na, fb, nb,
                                                    better=Better.LOWER, confidence=confidence)))
    (ha, ta), (hb, tb) = hangs_and_exposure(a), hangs_and_exposure(b)
    if ta > 0 and tb > 0:
        named.append(("hang_rate", compare_rates("hang rate", ha, ta, hb, tb, confidence=confidence)))
    rows = [dataclasses.replace(row, name=name) for name, row in named]
    return Comparison(a_name, b_name, window_s, confidence, tuple(rows))


def compare_pair(a: RunData, b: RunData, *, a_name: str, b_name: str, force: bool = False,
                 window_s: float = 60.0, confidence: float = 0.95, resamples: int = 400) -> Comparison:
    """B against A, as ``soak compare`` gives it: the runs' differences named, and
    the rows judged only where the runs differ in no aspect of INCOMPARABLE
    (target, workload, model, layout), or ``force`` says to judge them anyway.
    A run whose recorded facts are of the wrong type is a ConfigError (exit 2)."""
    identities = identify(a), identify(b)
    found = differences(*identities)
    held = incomparable(found)
    comparison = Comparison(a_name, b_name, window_s, confidence, (), differences=found, incomparable=held,
                            forced=bool(held) and force, identities=identities)
    if not comparison.compared:
        return comparison  # not even computed: no p-value of such a pair reaches a reader
    rows = compare_runs(a, b, a_name=a_name, b_name=b_name, window_s=window_s, confidence=confidence,
                        resamples=resamples).rows
    return dataclasses.replace(comparison, rows=rows)


def comparison_json(c: Comparison) -> dict[str, Any]:
    """compare's JSON: the rows as before, then whether they were judged and why not."""
    return {
        "a_name": c.a_name, "b_name": c.b_name, "window_s": c.window_s, "confidence": c.confidence,
        "rows": [dataclasses.asdict(row) for row in c.rows],
        "compared": c.compared, "forced": c.forced, "incomparable": [a.value for a in c.incomparable],
        "not_compared": c.not_compared(), "worse": c.worse(),
        "differences": [m.to_json() for m in c.differences],
        "identity": None if c.identities is None else {"a": c.identities[0].to_json(),
                                                        "b": c.identities[1].to_json()},
    }


def _num(v: float | None, unit: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if math.isinf(v):
        return "inf"
    if unit == "":
        return f"{v * 100:.2f}%"
    if unit == "s":
        return format_latency(v)  # 651 us, not 0.000651
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def _est(e: Any, unit: str) -> str:
    if e.value is None:
        return "— (no data)"
    ci = f" [{_num(e.lower, unit)}, {_num(e.upper, unit)}]" if e.lower is not None else ""
    return f"{_num(e.value, unit)}{ci} n={e.n}"


def format_comparison(c: Comparison) -> str:
    """The differences first (a reader sees what else changed before any verdict),
    then the table, or the one line saying why there is none."""
    head = [m.line() for m in c.differences]
    if not c.compared:
        return "\n".join([*head, c.not_compared() or ""])
    if c.forced:
        head.append(f"compared anyway (--force): the runs differ in {_aspects(c.incomparable)}; a verdict below "
                    "may be that difference, not B's change")
    table = _table(c)
    return "\n".join([*head, "", table]) if head else table


def _table(c: Comparison) -> str:
    pct = f"{c.confidence * 100:g}%"
    header = ("metric", f"A: {c.a_name}", f"B: {c.b_name}", "change B vs A", "p", "verdict on B")
    rows = []
    for d in c.rows:
        if d.ratio is not None:
            change = f"x{_num(d.ratio, 'x')} [{_num(d.ratio_lower, 'x')}, {_num(d.ratio_upper, 'x')}]"
        elif d.a.value is not None and d.b.value is not None:
            delta = d.b.value - d.a.value
            rel = f" ({delta / d.a.value * 100:+.1f}%)" if d.a.value else ""
            if d.unit == "":
                change = f"{delta * 100:+.2f} pts"
            elif d.unit == "s":
                change = ("+" if delta >= 0 else "") + format_latency(delta)
            else:
                change = f"{delta:+.3g} {d.unit}"
            change += rel
        else:
            change = "—"
        # A latency carries its own unit in every cell (us, ms or s), so the metric names none.
        unit = f" ({d.unit})" if d.unit and d.unit != "s" else ""
        rows.append((d.metric + unit, _est(d.a, d.unit), _est(d.b, d.unit), change,
                     "—" if d.p_value is None else ("<0.005" if d.p_value == 0 else f"{d.p_value:.3g}"), d.verdict.value))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append(f"{pct} intervals in brackets; windows of {c.window_s:g} s, hang windows excluded; "
                 f"verdicts at alpha={1 - c.confidence:.3g}. Methods: "
                 + "; ".join(sorted({f'{d.metric.split(" (")[0]}: {d.method}' for d in c.rows})))
    return "\n".join(lines)
