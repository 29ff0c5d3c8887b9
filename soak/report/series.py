"""Time series arithmetic shared by the plots, the incident zooms and compare:
bin edges, counter rates, means per bin, and the per-stage reduction of GPU
readings. numpy only: the zoom is drawn as SVG without matplotlib."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def bin_edges(t0: float, t1: float, *, max_columns: int, min_width_s: float) -> np.ndarray:
    span = max(t1 - t0, min_width_s)
    width = max(min_width_s, span / max_columns)
    return t0 + np.arange(0, span + width, width)


def period_s(ts: np.ndarray) -> float:
    """The reading period: the median forward step between readings in the
    order recorded, so timestamps rounded to the second (half the steps 0)
    and a wall clock stepped back still give the period; NaN with fewer than
    two such steps."""
    steps_s = np.diff(np.asarray(ts, dtype=float))
    steps_s = steps_s[steps_s > 0]
    return float(np.median(steps_s)) if steps_s.size >= 2 else float("nan")


def gap_s(ts: np.ndarray) -> float:
    """How long between two readings is a gap, not a slow reading: three periods
    (a probe that missed two readings in a row read nothing there)."""
    period = period_s(ts)
    return 3.0 * period if np.isfinite(period) else float("inf")


def time_line(ts: np.ndarray, mono: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(positions, order): where each reading sits on the run's time line and
    the order to take them in. Time is monotonic and the wall clock only labels.
    With ``mono`` (the run store's monotonic seconds) readings are ordered by it
    and placed at the first one's wall time plus the monotonic seconds since, so
    a wall clock stepped either way moves nothing. Without it they stay in the
    order they were recorded (the store appends in time order) and a step back
    in wall time counts as one reading period, not as time running backwards."""
    ts = np.asarray(ts, dtype=float)
    if mono is not None:
        mono = np.asarray(mono, dtype=float)
        if mono.shape == ts.shape and ts.size and np.isfinite(mono).all():
            order = np.argsort(mono, kind="stable")
            return ts[order[0]] + (mono[order] - mono[order[0]]), order
    order = np.arange(ts.size)
    if ts.size < 2:
        return ts, order
    step = np.diff(ts)
    period = period_s(ts)
    step = np.where(step < 0, period if np.isfinite(period) else 0.0, step)
    return ts[0] + np.concatenate(([0.0], np.cumsum(step))), order


def read_between(ts: np.ndarray, *, gap: float | None = None,
                 down: Sequence[tuple[float, float]] = ()) -> np.ndarray:
    """One bool per step between consecutive readings: the series was read
    across it. A step longer than ``gap`` (default ``gap_s``) or overlapping a
    span the server was ``down`` (killed and restarting) was not: what the
    counter did there is unknown, and a line across it would invent it."""
    ts = np.asarray(ts, dtype=float)
    if ts.size < 2:
        return np.zeros(0, dtype=bool)
    limit = gap_s(ts) if gap is None else gap
    ok = np.diff(ts) <= limit
    for a, b in down:
        ok &= ~((ts[1:] > a) & (ts[:-1] < b))
    return ok


def unread(ts: np.ndarray, *, gap: float | None = None,
           down: Sequence[tuple[float, float]] = ()) -> list[tuple[float, float]]:
    """The spans between two readings the series was not read across
    (``read_between``): where a drawn line must not go."""
    ts = np.asarray(ts, dtype=float)
    return [(float(ts[i]), float(ts[i + 1])) for i in np.nonzero(~read_between(ts, gap=gap, down=down))[0]]


def counter_rate(ts: np.ndarray, values: np.ndarray, edges: np.ndarray, *, gap: float | None = None,
                 down: Sequence[tuple[float, float]] = (), mono: np.ndarray | None = None) -> np.ndarray:
    """Per-second rate of a counter in each bin, over the part of the bin it was
    read across (``read_between``); increases as Prometheus reads a counter
    (soak.counters: after a drop the new value counts from zero). NaN where a
    bin was read for less than half a reading period: outside the sampled
    span and inside a gap. A bin the run ends in is the rate over its read
    part, not that rate diluted by the seconds after the end. Readings go on
    the time line ``time_line`` gives (``mono``: ordered by monotonic time)."""
    from soak.counters import counter_value, increases

    ts, order = time_line(ts, mono)
    values = np.asarray(values, dtype=float)[order]
    ok = np.isfinite(values) & np.array([counter_value(v) is not None for v in values], dtype=bool)
    ts, values = ts[ok], values[ok]
    edges = np.asarray(edges, dtype=float)
    out = np.full(len(edges) - 1, np.nan)
    if ts.size < 2:
        return out
    read = read_between(ts, gap=gap, down=down)
    # increase and read time accumulated over the steps that were read; both flat across a gap
    grown = np.concatenate(([0.0], np.cumsum(np.asarray(increases(values.tolist()), dtype=float)[1:] * read)))
    seen = np.concatenate(([0.0], np.cumsum(np.diff(ts) * read)))
    rise = np.diff(np.interp(edges, ts, grown))
    covered = np.diff(np.interp(edges, ts, seen))
    period = period_s(ts)
    # covered > 0: a bin read only across zero-length steps has no time to divide by
    enough = (covered > 0) & (covered >= 0.5 * np.minimum(np.diff(edges), period if np.isfinite(period) else 0.0))
    with np.errstate(invalid="ignore", divide="ignore"):
        out[enough] = rise[enough] / covered[enough]
    return out


def _minus(lo: float, hi: float, cut: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """[lo, hi] less the spans in ``cut``: the pieces left, in order."""
    pieces = [(lo, hi)]
    for a, b in sorted(cut):
        pieces = [p for x0, x1 in pieces for p in ((x0, min(x1, a)), (max(x0, b), x1)) if p[1] > p[0]]
    return pieces


def steps(edges: np.ndarray, values: np.ndarray, *,
          cut: Sequence[tuple[float, float]] = ()) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of a line that holds each bin's value across its bin: a value
    per window (a p99, a rate) is drawn as what it is, never as a slope from one
    window's centre to the next (two windows of a short run read as a trend).
    A bin with no value (NaN) breaks the line, and so does a span in ``cut``
    (the server down for a restart): a gap stays a gap."""
    edges = np.asarray(edges, dtype=float)
    values = np.asarray(values, dtype=float)
    xs: list[float] = []
    ys: list[float] = []
    for i, v in enumerate(values):
        if not np.isfinite(v):
            continue
        for x0, x1 in _minus(float(edges[i]), float(edges[i + 1]), cut):
            if xs and xs[-1] != x0:  # nothing drawn since the last piece ended
                xs.append(np.nan)
                ys.append(np.nan)
            xs += [x0, x1]
            ys += [float(v), float(v)]
    return np.asarray(xs), np.asarray(ys)


def broken(ts: np.ndarray, values: np.ndarray, *, gap: float | None = None,
           down: Sequence[tuple[float, float]] = ()) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of readings drawn as a line that breaks (a NaN point) where the
    series was not read between two readings (``read_between``)."""
    ts = np.asarray(ts, dtype=float)
    values = np.asarray(values, dtype=float)
    if ts.size < 2:
        return ts, values
    cut = np.nonzero(~read_between(ts, gap=gap, down=down))[0] + 1
    return np.insert(ts, cut, np.nan), np.insert(values, cut, np.nan)


def binned_mean(ts: np.ndarray, values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    ts = np.asarray(ts, dtype=float)
    values = np.asarray(values, dtype=float)
    ok = np.isfinite(values)
    sums, _ = np.histogram(ts[ok], bins=edges, weights=values[ok])
    counts, _ = np.histogram(ts[ok], bins=edges)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def binned_max(ts: np.ndarray, values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The largest finite value in each bin, NaN where a bin has none."""
    ts = np.asarray(ts, dtype=float)
    values = np.asarray(values, dtype=float)
    ok = np.isfinite(values)
    out = np.full(len(edges) - 1, -np.inf)
    index = np.searchsorted(edges, ts[ok], side="right") - 1
    inside = (index >= 0) & (index < len(edges) - 1)
    np.maximum.at(out, index[inside], values[ok][inside])
    return np.where(np.isfinite(out), out, np.nan)


def stage_columns(util: np.ndarray, stages: Sequence[Sequence[int]]) -> np.ndarray:
    """(samples, stages): each stage's busiest GPU at each reading (a stage with
    tensor parallelism is working when any of its GPUs is), NaN where none of
    its GPUs was read. ``stages``: GPU indices per stage (soak.records.Topology)."""
    util = np.asarray(util, dtype=float)
    if util.ndim != 2:
        return np.empty((0, 0))
    out = np.full((util.shape[0], len(stages)), np.nan)
    for s, gpus in enumerate(stages):
        cols = [g for g in gpus if 0 <= g < util.shape[1]]
        if cols:
            block = util[:, cols]
            seen = np.isfinite(block).any(axis=1)
            out[seen, s] = np.nanmax(np.where(np.isfinite(block), block, -np.inf)[seen], axis=1)
    return out


def dark_beside_busy(stage_util: np.ndarray, *, busy_pct: float, dark_pct: float, readings: int = 2) -> np.ndarray:
    """(samples, stages) of bools: the stage read at most ``dark_pct`` while
    another stage read at least ``busy_pct``, for ``readings`` readings in a row
    (one reading is a blip of the sampler, not a stall). Healthy load moves
    every stage together and marks nothing; a stalled tail marks its row."""
    x = np.asarray(stage_util, dtype=float)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] < 2:
        return np.zeros(x.shape if x.ndim == 2 else (0, 0), dtype=bool)
    filled = np.where(np.isfinite(x), x, np.nan)
    out = np.zeros(x.shape, dtype=bool)
    for s in range(x.shape[1]):
        others = np.delete(filled, s, axis=1)
        with np.errstate(invalid="ignore"):
            busiest = np.nanmax(np.where(np.isfinite(others), others, -np.inf), axis=1)
            out[:, s] = (filled[:, s] <= dark_pct) & (busiest >= busy_pct)
    if readings <= 1:
        return out
    held = out.copy()
    for k in range(1, readings):  # true where this and the k readings before it all hold
        shifted = np.zeros_like(out)
        shifted[k:] = out[:-k]
        held &= shifted
    # mark every reading of a held stretch, not only its end
    marked = held.copy()
    for k in range(1, readings):
        marked[:-k] |= held[k:]
    return marked


READINGS_PER_COLUMN = 8


def heatmap_grid(ts: np.ndarray, stage_util: np.ndarray, *, max_columns: int, min_width_s: float,
                 dark_pct: float, busy_pct: float, hold_s: float = 0.0,
                 quiet: Sequence[tuple[float, float]] = ()) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(edges, mean, dark) for the night-long heatmap, one row a stage: ``mean``
    (stages, columns) colours the cell, so healthy load's instant 0/60/100%
    readings average out instead of striping; ``dark`` (stages, columns) is the
    max over the column of ``dark_beside_busy`` held for ``hold_s`` (the
    detector's window: a pipeline bubble is shorter), so a stage that sat dark
    for a few seconds beside a busy one keeps its mark however wide the column.
    ``quiet``: spans (the server down for a kill and restart, its start-up with an
    idle tail before the first token) that mark nothing."""
    ts = np.asarray(ts, dtype=float)
    x = np.asarray(stage_util, dtype=float)
    period = period_s(ts) if np.isfinite(period_s(ts)) else 0.5
    # a column holds at least READINGS_PER_COLUMN readings, so its mean is a mean and
    # not one instant reading of a stage between steps (the barcode of a short run)
    edges = bin_edges(ts[0], ts[-1] + period, max_columns=max_columns,
                      min_width_s=max(min_width_s, period * READINGS_PER_COLUMN))
    mean = np.vstack([binned_mean(ts, x[:, s], edges) for s in range(x.shape[1])])
    readings = max(2, round(hold_s / period) if period > 0 else 2)
    marks = dark_beside_busy(x, busy_pct=busy_pct, dark_pct=dark_pct, readings=readings)
    for a, b in quiet:
        marks[(ts >= a) & (ts <= b)] = False
    dark = np.vstack([binned_max(ts, marks[:, s].astype(float), edges) for s in range(x.shape[1])]) >= 1.0
    return edges, mean, dark
