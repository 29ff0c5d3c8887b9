"""Each incident's own zoom: a minute either side of the onset, drawn as inline SVG.

``zoom_data`` cuts the run's series to the window (pure, numpy): one line per
pipeline stage (its busiest GPU, or the stage's CPU), the generated-token rate,
the running requests, the onset and detection times and the spans the server
was down for its kill and restart. ``zoom_svg`` draws it (pure: data in, markup
out). The markup says what it draws for a reader that is not a person: each
stage line is a ``<path data-stage="N">``, the stage panel's ``data-y0`` and
``data-y100`` are the pixel rows of 0% and 100%, ``data-x-onset`` the onset's
column, so a test reads "the tail sat at 0 after the onset" off the page. Where
the rule gives an onset interval, a shaded ``<rect class="onset-interval">``
spans it (``data-from-s``/``data-to-s``, seconds from the onset).
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from soak.events import EventType
from soak.onset import latency_span
from soak.records import DetectionLatency
from soak.report.series import counter_rate, period_s

if TYPE_CHECKING:
    from soak.report.rundir import RunData

Points = tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Zoom:
    """Times are seconds from the onset; values as read."""

    number: int
    span_s: float
    unit: str  # what the stage lines measure, e.g. "GPU utilization (%)"
    stages: tuple[tuple[Points, ...], ...]  # per stage, its unbroken stretches
    tokens: tuple[Points, ...]  # generated tokens per second
    running: tuple[Points, ...]  # requests the server was running
    detected_s: float | None
    downtime: tuple[tuple[float, float], ...]
    # the onset interval the evidence allows, from the onset (None: the rule gives a point estimate)
    onset_band: tuple[float, float] | None = None
    # the same interval unclipped: the label says the latency it allows, not the window's part
    onset_interval: tuple[float, float] | None = None


def _stretches(t: np.ndarray, v: np.ndarray, *, gap_s: float) -> tuple[Points, ...]:
    """Finite points split where readings stop for longer than ``gap_s`` (a
    killed server reads nothing: a line across the gap would invent readings)."""
    keep = np.isfinite(t) & np.isfinite(v)
    t, v = t[keep], v[keep]
    out: list[Points] = []
    current: list[tuple[float, float]] = []
    for i in range(t.size):
        if current and t[i] - current[-1][0] > gap_s:
            out.append(tuple(current))
            current = []
        current.append((round(float(t[i]), 3), round(float(v[i]), 3)))
    if current:
        out.append(tuple(current))
    return tuple(out)


def _period(ts: np.ndarray) -> float:
    # of the steps that moved: duplicate timestamps gave 0, and every line broke at every reading
    period = period_s(ts)
    return period if np.isfinite(period) else 1.0


def zoom_data(*, number: int, onset: float, detected: float | None, stage_ts: np.ndarray,
              stage_util: np.ndarray, server_ts: np.ndarray, generation: np.ndarray, running: np.ndarray,
              downtime: Sequence[tuple[float, float]] = (), span_s: float = 60.0,
              unit: str = "GPU utilization (%)", onset_interval: tuple[float, float] | None = None) -> Zoom:
    """The window [onset - span_s, onset + span_s] of every series, in seconds from the onset."""
    lo, hi = onset - span_s, onset + span_s
    ts = np.asarray(stage_ts, dtype=float)
    util = np.asarray(stage_util, dtype=float)
    inside = (ts >= lo) & (ts <= hi)
    gap = 3 * _period(ts)
    stages = tuple(_stretches(ts[inside] - onset, util[inside, s], gap_s=gap)
                   for s in range(util.shape[1] if util.ndim == 2 else 0))
    st = np.asarray(server_ts, dtype=float)
    s_inside = (st >= lo - 5) & (st <= hi + 5)
    server_gap = 3 * _period(st)
    tokens: tuple[Points, ...] = ()
    if s_inside.sum() >= 2:
        st_in, gen_in = st[s_inside], np.asarray(generation, dtype=float)[s_inside]
        rate = counter_rate(st_in, gen_in, st_in)  # between consecutive scrapes
        mid = (st_in[:-1] + st_in[1:]) / 2
        tokens = _stretches(mid - onset, np.where(np.diff(st_in) <= server_gap, rate, np.nan), gap_s=server_gap)
    run_in = np.asarray(running, dtype=float)[s_inside] if np.asarray(running).size == st.size else np.empty(0)
    runs = _stretches(st[s_inside] - onset, run_in, gap_s=server_gap) if run_in.size else ()
    clipped = tuple((max(a, lo) - onset, min(b, hi) - onset) for a, b in downtime if b > lo and a < hi)
    return Zoom(number=number, span_s=span_s, unit=unit, stages=stages, tokens=_clip(tokens, span_s),
                running=_clip(runs, span_s), detected_s=None if detected is None else detected - onset,
                downtime=clipped, onset_band=_band(onset_interval, onset, span_s),
                onset_interval=None if onset_interval is None else tuple(sorted(x - onset for x in onset_interval)))


def _band(interval: tuple[float, float] | None, onset: float, span_s: float) -> tuple[float, float] | None:
    """The onset interval in seconds from the onset, clipped to the window."""
    if interval is None:
        return None
    a, b = sorted(interval)
    a, b = max(a - onset, -span_s), min(b - onset, span_s)
    return (round(a, 3), round(b, 3)) if a <= b else None


def _clip(lines: tuple[Points, ...], span_s: float) -> tuple[Points, ...]:
    out = tuple(tuple(p for p in line if -span_s <= p[0] <= span_s) for line in lines)
    return tuple(line for line in out if line)


def downtimes(events: Sequence[Mapping[str, Any]], *, end: float | None) -> dict[int, tuple[float, float]]:
    """incident number -> (the decision, the restart done or the run's end): the
    server was down because the harness killed it."""
    out: dict[int, tuple[float, float]] = {}
    began: dict[int, float] = {}
    for e in events:
        number, ts = e.get("number"), e.get("ts")
        if not isinstance(number, int) or not isinstance(ts, (int, float)):
            continue
        if e.get("type") == EventType.INCIDENT:
            began.setdefault(number, float(e.get("detected_at") or ts))
        elif e.get("type") == EventType.RESTART_DONE and number in began:
            out[number] = (began[number], float(ts))
    for number, start in began.items():
        if number not in out and end is not None:
            out[number] = (start, end)
    return out


# ---- drawing -------------------------------------------------------------------------------

WIDTH, LEFT, RIGHT = 1000, 56, 96
STAGE_TOP, STAGE_H = 26, 150
RATE_TOP, RATE_H = STAGE_TOP + STAGE_H + 30, 80
HEIGHT = RATE_TOP + RATE_H + 24
PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
TAIL = "#d62728"


def _x(t: float, span: float) -> float:
    return round(LEFT + (t + span) / (2 * span) * (WIDTH - LEFT - RIGHT), 1)


def _y(v: float, top: int, height: int, top_value: float) -> float:
    v = min(max(v, 0.0), top_value)
    return round(top + height - v / top_value * height, 1)


def _path(lines: Sequence[Points], span: float, top: int, height: int, top_value: float) -> str:
    parts = []
    for line in lines:
        coords = [f"{_x(t, span)},{_y(v, top, height, top_value)}" for t, v in line]
        if len(coords) == 1:  # one reading: a dot-long line, so it still shows
            coords.append(coords[0])
        parts.append("M " + " L ".join(coords))
    return " ".join(parts)


def _ceiling(lines: Sequence[Points]) -> float:
    peak = max((v for line in lines for _, v in line), default=0.0)
    if peak <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(peak))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= peak)


def _after_onset(zoom: Zoom) -> str:
    """The detection's label: "+3.1 s" from the dashed onset, or with an onset
    interval the latency it allows ("3.0-3.8 s after the onset")."""
    detected = zoom.detected_s or 0.0
    if zoom.onset_interval is None:
        return f"+{detected:.1f} s"
    a, b = zoom.onset_interval
    return latency_span(DetectionLatency(max(0.0, detected - b), max(0.0, detected - a), point=False))


def zoom_svg(zoom: Zoom) -> str:
    span = zoom.span_s
    pct_top = 100.0
    tok_top, run_top = _ceiling(zoom.tokens), _ceiling(zoom.running)
    x_onset = _x(0.0, span)
    x_detect = _x(zoom.detected_s, span) if zoom.detected_s is not None and abs(zoom.detected_s) <= span else None
    y0, y100 = _y(0, STAGE_TOP, STAGE_H, pct_top), _y(pct_top, STAGE_TOP, STAGE_H, pct_top)
    out = [(f"<svg xmlns='http://www.w3.org/2000/svg' class='zoom' viewBox='0 0 {WIDTH} {HEIGHT}' "
            f"width='100%' role='img' aria-label='incident {zoom.number}: a minute either side of the onset' "
            f"data-incident='{zoom.number}' data-y0='{y0}' data-y100='{y100}' data-x-onset='{x_onset}' "
            f"data-x-detected='{'' if x_detect is None else x_detect}' data-span='{span:g}'>"),
           ("<style>text{font:11px system-ui,sans-serif;fill:#444}.axis{stroke:#bbb;stroke-width:1}"
            ".grid{stroke:#eee;stroke-width:1}</style>")]
    for a, b in zoom.downtime:
        xa, xb = _x(a, span), _x(b, span)
        out.append(f"<rect class='downtime' x='{xa}' y='{STAGE_TOP}' width='{round(xb - xa, 1)}' "
                   f"height='{RATE_TOP + RATE_H - STAGE_TOP}' fill='#9e9e9e' fill-opacity='0.22'/>")
        if xb - xa > 150:  # a narrow band is named in the caption instead
            out.append(f"<text x='{round(xa + 3, 1)}' y='{STAGE_TOP + 12}'>server down (kill, restart)</text>")
    for top, height in ((STAGE_TOP, STAGE_H), (RATE_TOP, RATE_H)):
        for frac in (0.0, 0.5, 1.0):
            y = round(top + height * frac, 1)
            out.append(f"<line class='{'axis' if frac == 1.0 else 'grid'}' x1='{LEFT}' x2='{WIDTH - RIGHT}' y1='{y}' y2='{y}'/>")
    out.append(f"<text x='{LEFT}' y='{STAGE_TOP - 8}'>{html.escape(zoom.unit)} per pipeline stage "
               "(its busiest GPU)</text>")
    out.append(f"<text x='{LEFT - 6}' y='{y100 + 4}' text-anchor='end'>100</text>"
               f"<text x='{LEFT - 6}' y='{y0 + 4}' text-anchor='end'>0</text>")
    last = len(zoom.stages) - 1
    for s, lines in enumerate(zoom.stages):
        if not lines:
            continue
        color = TAIL if s == last and last > 0 else PALETTE[s % len(PALETTE)]
        width = 2.4 if s == last else 1.4
        out.append(f"<path data-stage='{s}' d='{_path(lines, span, STAGE_TOP, STAGE_H, pct_top)}' fill='none' "
                   f"stroke='{color}' stroke-width='{width}' stroke-opacity='0.85'><title>stage {s}</title></path>")
    out.append(f"<text x='{LEFT}' y='{RATE_TOP - 8}'>generated tokens/s (blue, left, up to {tok_top:g}) and "
               f"running requests (orange, right, up to {run_top:g})</text>")
    out.append(f"<text x='{LEFT - 6}' y='{RATE_TOP + 4}' text-anchor='end' fill='#1565c0'>{tok_top:g}</text>"
               f"<text x='{LEFT - 6}' y='{RATE_TOP + RATE_H + 4}' text-anchor='end'>0</text>"
               f"<text x='{WIDTH - RIGHT + 6}' y='{RATE_TOP + 4}' fill='#ef6c00'>{run_top:g} running</text>")
    if zoom.tokens:
        out.append(f"<path data-series='tokens' d='{_path(zoom.tokens, span, RATE_TOP, RATE_H, tok_top)}' "
                   "fill='none' stroke='#1565c0' stroke-width='1.6'/>")
    if zoom.running:
        out.append(f"<path data-series='running' d='{_path(zoom.running, span, RATE_TOP, RATE_H, run_top)}' "
                   "fill='none' stroke='#ef6c00' stroke-width='1.4' stroke-dasharray='4 2'/>")
    bottom = RATE_TOP + RATE_H
    if zoom.onset_band is not None:  # where the onset may lie: at least 2 px, so a narrow one still shows
        xa, xb = _x(zoom.onset_band[0], span), _x(zoom.onset_band[1], span)
        out.append(f"<rect class='onset-interval' x='{min(xa, xb - 2)}' y='{STAGE_TOP}' "
                   f"width='{round(max(xb - xa, 2), 1)}' height='{bottom - STAGE_TOP}' fill='#c62828' "
                   f"fill-opacity='0.25' data-from-s='{zoom.onset_band[0]:g}' data-to-s='{zoom.onset_band[1]:g}'>"
                   f"<title>onset interval: {zoom.onset_band[0]:+.1f} to {zoom.onset_band[1]:+.1f} s</title></rect>")
    out.append(f"<line class='onset' x1='{x_onset}' x2='{x_onset}' y1='{STAGE_TOP}' y2='{bottom}' "
               "stroke='#c62828' stroke-width='1.4' stroke-dasharray='5 3'/>")
    out.append(f"<text x='{x_onset - 3}' y='{STAGE_TOP + 26}' fill='#c62828' text-anchor='end'>onset</text>")
    if x_detect is not None:
        out.append(f"<line class='detected' x1='{x_detect}' x2='{x_detect}' y1='{STAGE_TOP}' y2='{bottom}' "
                   "stroke='#c62828' stroke-width='1.6'/>")
        out.append(f"<text x='{x_detect + 3}' y='{STAGE_TOP + 40}' fill='#c62828'>detected "
                   f"({_after_onset(zoom)})</text>")
    for t in range(-int(span), int(span) + 1, max(10, int(span) // 6)):
        out.append(f"<text x='{_x(t, span)}' y='{bottom + 14}' text-anchor='middle'>{t:+d} s</text>")
    out.append(f"<text x='{WIDTH - RIGHT + 6}' y='{y0 + 4}'>stage {last} (tail)</text>" if last > 0 else "")
    out.append("</svg>")
    return "".join(out)


# A night of many hangs keeps its page small: the first this many incidents get a zoom each.
MAX_ZOOMS = 50


def incident_zooms(run: RunData, incidents: Sequence[Any], *, span_s: float = 60.0) -> dict[int, str]:
    """incident number -> its zoom's SVG, for every incident with an onset (or a
    detection time, where the onset is unknown)."""
    from soak.report.series import stage_columns
    from soak.samples import GpuSource

    stage_util = stage_columns(run.gpu_util, run.stages)
    running = run.server.get("num_requests_running", np.empty(0))
    down = downtimes(run.events, end=run.summary.ended_at)
    unit = "stage CPU (% of one core)" if run.gpu_source is GpuSource.STAGE_CPU else "GPU utilization (%)"
    out = {}
    for i in incidents[:MAX_ZOOMS]:
        onset = i.onset_at if i.onset_at is not None else i.detected_at
        if i.number is None or onset is None:
            continue
        latency = i.detection_latency
        interval = None if latency is None or latency.point or latency.onset_earliest is None \
            or latency.onset_latest is None else (latency.onset_earliest, latency.onset_latest)
        zoom = zoom_data(number=i.number, onset=onset, detected=i.detected_at, stage_ts=run.gpu_ts,
                         stage_util=stage_util, server_ts=run.server_ts, generation=run.server["generation_tokens"],
                         running=running, downtime=list(down.values()), span_s=span_s, unit=unit,
                         onset_interval=interval)
        out[i.number] = zoom_svg(zoom)
    return out
