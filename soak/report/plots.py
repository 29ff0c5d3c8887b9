"""Timeline plots as PNG bytes (matplotlib, Agg canvas, no pyplot global state).

Each function takes plain arrays (unix seconds and values) plus the run's start
and optional incident markers, and returns PNG bytes, so the report inlines
them and the live view / exporter can reuse them (e.g. ``gpu_heatmap_png`` and
``token_rates_png``) to render files. Long runs are binned to at most
``max_columns`` time bins, which keeps a 66-minute run fast and readable.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import matplotlib

matplotlib.use("Agg")  # no display; harmless if a caller already chose Agg
import numpy as np  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

# compare and the zoom read these without matplotlib; kept importable from here
from soak.report.series import (bin_edges, binned_max, binned_mean, broken, counter_rate, heatmap_grid,  # noqa: E402,F401
                                steps, unread)

if TYPE_CHECKING:
    from soak.report.rundir import RequestColumns

WIDTH_IN = 11.0
DPI = 100


@dataclass(frozen=True)
class Marker:
    ts: float
    label: str
    style: str = "detected"  # "onset" (dashed), "detected" (solid) or "precursor" (dotted, orange)


def _figure(height_in: float) -> Figure:
    fig = Figure(figsize=(WIDTH_IN, height_in), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _minutes(ts: np.ndarray, start: float) -> np.ndarray:
    return (np.asarray(ts, dtype=float) - start) / 60.0


def _mark(ax, markers: Sequence[Marker], start: float) -> None:
    for m in markers:
        if m.style == "precursor":  # a JIT compile during inference: a mark, not an incident
            ax.axvline((m.ts - start) / 60.0, color="#ff7f0e", lw=1.0, ls=":", alpha=0.9)
            continue
        ax.axvline((m.ts - start) / 60.0, color="#d62728", lw=1.2, ls="--" if m.style == "onset" else "-", alpha=0.9)


Spans = Sequence[tuple[float, float]]


def _shade(ax, down: Spans, start: float) -> None:
    """The spans the server was down for a kill and restart, so a break in the
    lines reads as the restart it is."""
    for i, (a, b) in enumerate(down):
        ax.axvspan((a - start) / 60.0, (b - start) / 60.0, color="#999", alpha=0.18, lw=0,
                   label="server down (kill, restart)" if i == 0 else None)


def _step(ax, edges: np.ndarray, values: np.ndarray, start: float, *, cut: Spans = (), **style) -> None:
    x, y = steps(edges, values, cut=cut)
    ax.plot((x - start) / 60.0, y, **style)


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="#777")
    ax.set_yticks([])


def _layout(fig: Figure) -> None:
    # Fixed margins (not tight_layout) so the stacked timelines share one x scale on the page.
    height = fig.get_figheight()
    fig.subplots_adjust(left=0.075, right=0.915, bottom=0.62 / height, top=1 - 0.36 / height)


def _finish(fig: Figure, ax, title: str, xlim: tuple[float, float] | None = None) -> None:
    ax.set_title(title, loc="left", fontsize=11)
    ax.set_xlabel("minutes since start")
    ax.grid(True, alpha=0.25)
    if xlim is not None:
        ax.set_xlim(*xlim)
    _layout(fig)


def gpu_heatmap_png(ts: np.ndarray, stage_util: np.ndarray, *, start: float, markers: Sequence[Marker] = (),
                    max_columns: int = 240, min_width_s: float = 2.0, xlim: tuple[float, float] | None = None,
                    stage_cpu: bool = False, dark_pct: float = 10.0, busy_pct: float = 90.0, hold_s: float = 3.0,
                    quiet: Sequence[tuple[float, float]] = ()) -> bytes:
    """One row a pipeline stage (its busiest GPU, or the stage's CPU): colour from
    the mean over each column, a red ring where the stage sat dark beside a busy
    one (soak.report.series.heatmap_grid), so a stalled tail shows on a long night."""
    what = "Stage CPU (% of one core) per pipeline stage" if stage_cpu else \
        "GPU utilization (%) per pipeline stage, its busiest GPU"
    ts = np.asarray(ts, dtype=float)
    util = np.asarray(stage_util, dtype=float)
    stages = util.shape[1] if util.ndim == 2 else 0
    fig = _figure(max(2.2, 0.8 + 0.28 * stages))
    ax = fig.add_subplot(111)
    if ts.size < 2 or stages == 0:
        _empty(ax, "no stage CPU samples" if stage_cpu else "no GPU samples")
        _finish(fig, ax, what, xlim)
        return _png(fig)
    edges, mean, dark = heatmap_grid(ts, util, max_columns=max_columns, min_width_s=min_width_s,
                                     dark_pct=dark_pct, busy_pct=busy_pct, hold_s=hold_s, quiet=quiet)
    x0, x1 = _minutes(edges[[0, -1]], start)
    image = ax.imshow(mean, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0, vmax=100,
                      extent=(x0, x1, stages - 0.5, -0.5))
    rows, cols = np.nonzero(dark)
    if rows.size:
        centres = _minutes((edges[cols] + edges[cols + 1]) / 2, start)
        ax.scatter(centres, rows, s=70, facecolors="none", edgecolors="#ff1744", linewidths=1.8, zorder=3)
    ax.set_yticks(range(stages))
    ax.set_yticklabels([f"stage {s}" for s in range(stages)], fontsize=8)
    _mark(ax, markers, start)
    width = float(edges[1] - edges[0])
    _finish(fig, ax, f"{what}: mean per {width:.3g} s column; red ring: dark beside a busy stage", xlim)
    ax.set_ylim(stages - 0.5, -0.5)
    ax.grid(False)
    box = ax.get_position()
    cax = fig.add_axes((0.93, box.y0, 0.012, box.height))
    fig.colorbar(image, cax=cax).set_label("%")
    return _png(fig)


def token_rates_png(server_ts: np.ndarray, server_generated: np.ndarray, client_ts: np.ndarray,
                    client_tokens: np.ndarray, *, start: float, markers: Sequence[Marker] = (),
                    max_columns: int = 240, xlim: tuple[float, float] | None = None, down: Spans = ()) -> bytes:
    return _png(token_rates_figure(server_ts, server_generated, client_ts, client_tokens, start=start,
                                   markers=markers, max_columns=max_columns, xlim=xlim, down=down))


def token_rates_figure(server_ts: np.ndarray, server_generated: np.ndarray, client_ts: np.ndarray,
                       client_tokens: np.ndarray, *, start: float, markers: Sequence[Marker] = (),
                       max_columns: int = 240, xlim: tuple[float, float] | None = None, down: Spans = ()) -> Figure:
    """Generated tokens per second as the server counts them and as the client
    receives them, each bin's rate held across the part of it the counter was
    read; a line breaks where its counter was not read (the server's also where
    it was ``down``: killed and restarting). A client read through a restart
    counts on: its zero there is real."""
    fig = _figure(2.8)
    ax = fig.add_subplot(111)
    spans = [a for a in (np.asarray(server_ts), np.asarray(client_ts)) if a.size >= 2]
    if not spans:
        _empty(ax, "no token counters recorded")
        _finish(fig, ax, "token rate (tokens/s)", xlim)
        return fig
    t0, t1 = min(a[0] for a in spans), max(a[-1] for a in spans)
    edges = bin_edges(t0, t1, max_columns=max_columns, min_width_s=5.0)
    _shade(ax, down, start)
    if np.asarray(server_ts).size >= 2:
        _step(ax, edges, counter_rate(server_ts, server_generated, edges, down=down), start,
              cut=unread(server_ts, down=down), lw=1.4,
              label="server: vllm:generation_tokens")
    if np.asarray(client_ts).size >= 2:
        _step(ax, edges, counter_rate(client_ts, client_tokens, edges), start, cut=unread(client_ts), lw=1.1, ls="--",
              label="client: tokens received")
    ax.set_ylabel("tokens/s")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower left", fontsize=8, framealpha=0.8)
    _mark(ax, markers, start)
    _finish(fig, ax, f"Generated-token rate (per {np.diff(edges)[0]:.3g} s)", xlim)
    return fig


# A scatter of every request of a 24-hour soak (a few hundred thousand points)
# costs seconds to draw and shows nothing more than an even subsample of this many.
MAX_SCATTER_POINTS = 20_000


def _request_arrays(requests: RequestColumns, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(ended_at, ``key``) of the requests that report both."""
    ts, vals = requests["ended_at"], requests[key]
    keep = np.isfinite(ts) & np.isfinite(vals)
    return ts[keep], vals[keep]


def _thin(*columns: np.ndarray) -> tuple[np.ndarray, ...]:
    """Every n-th point, at most MAX_SCATTER_POINTS, for drawing only."""
    size = columns[0].size
    if size <= MAX_SCATTER_POINTS:
        return columns
    step = -(-size // MAX_SCATTER_POINTS)
    return tuple(c[::step] for c in columns)


def ttft_png(requests: RequestColumns, *, start: float, end: float | None = None,
             markers: Sequence[Marker] = (), windows: int = 40, xlim: tuple[float, float] | None = None,
             down: Spans = ()) -> bytes:
    return _png(ttft_figure(requests, start=start, end=end, markers=markers, windows=windows, xlim=xlim, down=down))


def ttft_figure(requests: RequestColumns, *, start: float, end: float | None = None,
                markers: Sequence[Marker] = (), windows: int = 40, xlim: tuple[float, float] | None = None,
                down: Spans = ()) -> Figure:
    """TTFT p50 and p99 per time window (by request completion time), each held
    across its window; a window no request ended in, and a span the server was
    ``down``, is a break in the line."""
    fig = _figure(2.8)
    ax = fig.add_subplot(111)
    ts, ttft = _request_arrays(requests, "ttft_s")
    if ts.size == 0:
        _empty(ax, "no request with a first token")
        _finish(fig, ax, "TTFT", xlim)
        return fig
    t1 = max(end if end is not None else ts.max(), ts.max())
    edges = bin_edges(start, t1, max_columns=windows, min_width_s=30.0)
    width = float(np.diff(edges)[0])
    idx = np.digitize(ts, edges) - 1
    p50 = np.full(len(edges) - 1, np.nan)
    p99 = np.full(len(edges) - 1, np.nan)
    for i in range(len(edges) - 1):
        sel = ttft[idx == i]
        if sel.size:
            p50[i], p99[i] = np.percentile(sel, [50, 99])
    edges[-1] = min(edges[-1], t1)  # the last window ends with the run
    _shade(ax, down, start)
    shown_ts, shown_ttft = _thin(ts, ttft)
    ax.scatter(_minutes(shown_ts, start), shown_ttft, s=3, color="#bbb", label="requests", zorder=1)
    _step(ax, edges, p50, start, cut=down, lw=1.6, label="p50", zorder=2)
    _step(ax, edges, p99, start, cut=down, lw=1.6, label="p99", zorder=2)
    ax.set_ylabel("seconds")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=8, framealpha=0.8)
    _mark(ax, markers, start)
    _finish(fig, ax, f"Time to first token (p50 / p99 per {width:.0f} s window)", xlim)
    return fig


def context_png(requests: RequestColumns, server_ts: np.ndarray, kv_usage: np.ndarray, *, start: float,
                markers: Sequence[Marker] = (), xlim: tuple[float, float] | None = None, down: Spans = ()) -> bytes:
    """Prompt (context) length of each request, with the server's KV-cache usage
    (a line of readings that breaks where the server was not read)."""
    fig = _figure(2.8)
    ax = fig.add_subplot(111)
    ts, ptok = _request_arrays(requests, "prompt_tokens")
    _shade(ax, down, start)
    if ts.size == 0:
        _empty(ax, "no prompt token counts")
    else:
        shown_ts, shown_ptok = _thin(ts, ptok)
        ax.scatter(_minutes(shown_ts, start), shown_ptok / 1000.0, s=4, label="prompt tokens (K)")
        ax.set_ylabel("K tokens")
    kv = np.asarray(kv_usage, dtype=float)
    if kv.size and np.isfinite(kv).any():
        ax2 = ax.twinx()
        kv_ts, kv = broken(server_ts, kv, down=down)
        ax2.plot(_minutes(kv_ts, start), kv * 100.0, color="#2ca02c", lw=0.9, alpha=0.8, label="KV cache used (%)")
        ax2.set_ylim(0, 105)
        ax2.set_ylabel("KV %")
        ax2.legend(loc="lower right", fontsize=8, framealpha=0.8)
    if ts.size:
        ax.legend(loc="lower left", fontsize=8, framealpha=0.8)
    _mark(ax, markers, start)
    _finish(fig, ax, "Context length per request and KV-cache usage", xlim)
    return _png(fig)


def hit_ratio_png(server_ts: np.ndarray, hits: np.ndarray, queries: np.ndarray, requests: RequestColumns, *,
                  start: float, markers: Sequence[Marker] = (), max_columns: int = 120,
                  xlim: tuple[float, float] | None = None, down: Spans = ()) -> bytes:
    """Prefix-cache hit ratio: rate(hits)/rate(queries) from the server (each
    bin's held across it, broken where the server was not read), and
    cached/prompt tokens from the client's usage reports."""
    fig = _figure(2.6)
    ax = fig.add_subplot(111)
    drew = False
    _shade(ax, down, start)
    st = np.asarray(server_ts, dtype=float)
    if st.size >= 2:
        edges = bin_edges(st[0], st[-1], max_columns=max_columns, min_width_s=10.0)
        rh, rq = counter_rate(st, hits, edges, down=down), counter_rate(st, queries, edges, down=down)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(rq > 0, rh / rq, np.nan)
        if np.isfinite(ratio).any():
            _step(ax, edges, ratio * 100, start, cut=unread(st, down=down), lw=1.4, label="server: rate(hits)/rate(queries)")
            drew = True
    ended, cached, prompt = requests["ended_at"], requests["cached_tokens"], requests["prompt_tokens"]
    keep = np.isfinite(ended) & np.isfinite(cached) & np.isfinite(prompt) & (prompt != 0)
    if keep.any():
        shown_ts, shown_share = _thin(ended[keep], cached[keep] / prompt[keep])
        ax.scatter(_minutes(shown_ts, start), shown_share * 100, s=3, color="#999", label="client: cached/prompt")
        drew = True
    if not drew:
        _empty(ax, "no prefix-cache counters")
    else:
        ax.set_ylim(0, 101)
        ax.set_ylabel("%")
        ax.legend(loc="lower left", fontsize=8, framealpha=0.8)
    _mark(ax, markers, start)
    _finish(fig, ax, "Prefix-cache hit ratio (%)", xlim)
    return _png(fig)
