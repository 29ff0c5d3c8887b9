"""report.html and junit.xml from a run directory.

``build(run)`` computes everything the page shows (pure, from ``RunData``);
``render_html`` turns it into one self-contained file (CSS inline, plots as
base64 PNG); ``write_report(run_dir)`` is the I/O edge ``soak report`` calls.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from soak.bounds import LIMITS, InputRejected, read_file
from soak.durations import format_duration
from soak.fsio import write_atomic
from soak.jsonl import read_json
from soak.percentiles import percentiles
from soak.flightrec import dumps as flight_recorder
from soak.report import watchdog
from soak.report.junit import build_junit, incident_line
from soak.report.rundir import Incident, RequestColumns, RunData, load_run
from soak.report.stats import MtbfEstimate, mtbf_estimate


@dataclass
class IncidentView:
    record: dict[str, Any]
    watchdog: list[watchdog.WatchdogLine]
    flight_recorder: flight_recorder.FlightRecorderSummary | None
    files: list[str]
    path: str


@dataclass
class ReportModel:
    name: str
    verdict: str
    cut_off: bool
    summary: dict[str, Any]
    start: float
    mtbf: MtbfEstimate | None
    brief: list[tuple[str, str]]
    config_text: str
    images: list[tuple[str, bytes]]
    incidents: list[IncidentView]
    request_stats: list[tuple[str, dict[str, float | None]]]
    outcomes: list[tuple[str, int]]
    events: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)


def _run_name(run: RunData) -> str:
    for source in (run.summary, run.config):
        name = source.get("name") if isinstance(source, Mapping) else None
        if isinstance(name, str) and name:
            return name
    started = next((e for e in run.events if e.get("type") == "run_started"), {})
    return str(started.get("name") or run.path.name)


def _brief(config: Mapping[str, Any], summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []

    def walk(prefix: str, value: Any, depth: int) -> None:
        if isinstance(value, Mapping) and depth < 3:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v, depth + 1)
        elif value is None:
            return
        elif not isinstance(value, (Mapping, list)) or (isinstance(value, list) and len(value) <= 4):
            rows.append((prefix, json.dumps(value) if isinstance(value, list) else str(value)))

    walk("", config, 0)
    # What a reader needs first: the run, then load and workload; the simulator's internals last.
    order = ("name", "duration", "warmup", "seed", "target.kind", "workload.kind", "load.", "workload.",
             "detector.", "response.", "target.")

    def rank(row: tuple[str, str]) -> int:
        return next((i for i, p in enumerate(order) if row[0] == p or (p.endswith(".") and row[0].startswith(p))),
                    len(order))

    return sorted(rows, key=rank)[:30]


def _percentiles(values: np.ndarray) -> dict[str, float | None]:
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    p50, p90, p99 = percentiles(x.tolist(), (50, 90, 99))
    return {"n": int(x.size), "mean": float(x.mean()), "p50": p50, "p90": p90, "p99": p99, "max": float(x.max())}


def request_statistics(requests: RequestColumns) -> tuple[list[tuple[str, dict]], list[tuple[str, int]]]:
    ok = requests.ok
    cached, prompt = requests["cached_tokens"][ok], requests["prompt_tokens"][ok]
    with np.errstate(invalid="ignore", divide="ignore"):
        cached_share = np.where(prompt > 0, cached / prompt * 100, np.nan)
    rows = [
        ("TTFT (s)", _percentiles(requests["ttft_s"][ok])),
        ("ITL mean per request (s)", _percentiles(requests["itl_mean_s"][ok])),
        ("ITL p99 per request (s)", _percentiles(requests["itl_p99_s"][ok])),
        ("TPOT (s)", _percentiles(requests["tpot_s"][ok])),
        ("end-to-end latency (s)", _percentiles(requests["e2e_s"][ok])),
        ("prompt tokens", _percentiles(prompt)),
        ("output tokens", _percentiles(requests["output_tokens"][ok])),
        ("cached share of prompt (%)", _percentiles(cached_share)),
    ]
    return rows, requests.outcome_counts()


def _incident_view(incident: Incident, run: RunData) -> IncidentView:
    lines: list[watchdog.WatchdogLine] = []
    wd = incident.path / "watchdog.json"
    if wd.is_file():
        try:  # read_json: bounded in size and nesting, None where it cannot be read
            lines = watchdog.from_json(read_json(wd))
        except (OSError, ValueError, TypeError, AttributeError):
            lines = []
    if not lines and (incident.path / "log_tail.txt").is_file():
        try:
            text = read_file(incident.path / "log_tail.txt", limit=LIMITS.yaml_bytes).decode("utf-8", "replace")
        except (OSError, InputRejected):
            text = ""
        lines = watchdog.parse_lines(text.splitlines())
    if not lines:  # the log probe's matches around the incident
        onset = incident.record.get("onset_at") or 0
        detected = incident.record.get("detected_at") or float("inf")
        for s in run.log_lines:
            if onset - 120 <= s["ts"] <= detected + 60:
                parsed = watchdog.parse_line(str(s.get("line", "")), ts=s["ts"])
                if parsed:
                    lines.append(parsed)
    fr = None
    fr_json = incident.path / "flight_recorder_summary.json"
    if fr_json.is_file():
        try:
            fr = flight_recorder.FlightRecorderSummary.from_json(read_json(fr_json))
        except (OSError, ValueError, TypeError, AttributeError, KeyError):
            fr = None
    if fr is None and flight_recorder.dump_files(incident.path / "flight_recorder"):
        fr = flight_recorder.summarize_dumps(incident.path / "flight_recorder")
    rel = os.path.relpath(incident.path, run.path)
    return IncidentView(record=incident.record, watchdog=lines, flight_recorder=fr, files=incident.files, path=rel)


def _images(run: RunData, incidents: list[dict[str, Any]], *, start: float, end: float | None) -> list[tuple[str, bytes]]:
    from soak.report import plots  # matplotlib: only a page with plots pays for it

    markers: list[plots.Marker] = []
    for i in incidents:
        if isinstance(i.get("onset_at"), (int, float)):
            markers.append(plots.Marker(i["onset_at"], f"#{i.get('number')} onset", "onset"))
        if isinstance(i.get("detected_at"), (int, float)):
            markers.append(plots.Marker(i["detected_at"], f"#{i.get('number')} detected", "detected"))
    last = max([a[-1] for a in (run.gpu_ts, run.server_ts, run.client_ts) if a.size] + ([end] if end else []),
               default=start + 60)
    xlim = (0.0, max(last - start, 1.0) / 60.0)
    return [
        ("GPU utilization", plots.gpu_heatmap_png(run.gpu_ts, run.gpu_util, start=start, markers=markers, xlim=xlim)),
        ("Token rate", plots.token_rates_png(run.server_ts, run.server["generation_tokens"], run.client_ts,
                                             run.client_tokens, start=start, markers=markers, xlim=xlim)),
        ("TTFT", plots.ttft_png(run.requests, start=start, end=end, markers=markers, xlim=xlim)),
        ("Context length", plots.context_png(run.requests, run.server_ts, run.server["kv_cache_usage_perc"],
                                             start=start, markers=markers, xlim=xlim)),
        ("Hit ratio", plots.hit_ratio_png(run.server_ts, run.server["prefix_cache_hits"],
                                          run.server["prefix_cache_queries"], run.requests, start=start, markers=markers, xlim=xlim)),
    ]


def build(run: RunData, *, confidence: float = 0.95, with_plots: bool = True) -> ReportModel:
    """The report's model; ``with_plots=False`` leaves the images out (and
    matplotlib unimported): what junit.xml alone needs."""
    summary = run.summary
    start = run.start or 0.0
    verdict = str(summary.get("verdict", "unknown"))
    cut_off = bool(summary.get("cut_off"))
    incidents = list(summary.get("incidents") or [])
    hangs = sum(1 for i in incidents if i.get("kind") == "hang")
    duration = summary.get("duration_s")
    mtbf = mtbf_estimate(hangs, float(duration), confidence=confidence) if isinstance(duration, (int, float)) and duration > 0 else None
    criteria = summary.get("criteria") if isinstance(summary.get("criteria"), dict) else {}
    criteria_failed = [r for r in criteria.get("results") or () if isinstance(r, dict) and r.get("state") == "fail"]
    if criteria_failed and not hangs:
        # A server that fails its requests is not being exercised: hang-free time
        # under those conditions proves nothing about hangs. A hang it did have
        # is still a hang, so a run with hangs keeps its estimate.
        mtbf = None

    end = summary.get("ended_at") if isinstance(summary.get("ended_at"), (int, float)) else None
    images = _images(run, incidents, start=start, end=end) if with_plots else []
    stats_rows, outcomes = request_statistics(run.requests)
    by_number = {inc.number: inc for inc in run.incidents}
    views = []
    for i in incidents:
        found = by_number.pop(int(i.get("number", -1)), None) if isinstance(i.get("number"), int) else None
        if found is not None:
            view = _incident_view(found, run)
            view.record = {**found.record, **i}
        else:
            view = IncidentView(record=dict(i), watchdog=[], flight_recorder=None, files=[], path=str(i.get("evidence", "")))
        views.append(view)
    for leftover in by_number.values():  # evidence on disk the summary does not list (a cut-off run)
        views.append(_incident_view(leftover, run))
    notes = [f"{name}: {n} unreadable line{'s' if n > 1 else ''} skipped" for name, n in run.bad_lines.items()]
    # a GPU source slower than the detector's window, an uncovered vLLM version
    for event in run.events:
        if event.get("type") in ("gpu_source_stale", "warning") and event.get("message"):
            notes.append(str(event["message"]))
    for result in criteria_failed:
        reasons = result.get("reasons") or [result.get("name", "a criterion")]
        notes.append(f"Failure criterion {result.get('name')}: {reasons[0]}."
                     + ("" if hangs else " No MTBF bound is given for a run whose server failed its requests."))
    for event in run.events:  # the wall clock only labels; a step of it is shown, and moved no figure
        if event.get("type") == "wall_clock_step":
            notes.append(wall_step_note(event))
    metrics = summary.get("server_metrics") if isinstance(summary.get("server_metrics"), dict) else {}
    if metrics.get("note"):
        notes.append(f"Server metrics: {metrics['note']}.")
    notes = list(dict.fromkeys(notes))
    why = ended_because(run.path, summary)
    if why:
        notes.insert(0, why)
    if cut_off:
        notes.insert(0, "This run was cut off: no run_ended event was recorded (the harness or host died). "
                        "The verdict and figures are from what was recorded up to then.")
    return ReportModel(
        name=_run_name(run), verdict=verdict, cut_off=cut_off, summary=summary, start=start, mtbf=mtbf,
        brief=_brief(run.config, summary), config_text=run.config_text, images=images, incidents=views,
        request_stats=stats_rows, outcomes=outcomes, events=run.events[-300:], notes=notes,
    )


# ---------------------------------------------------------------- HTML

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;color:#1d1d1f;background:#f6f7f9}
main{max-width:1140px;margin:0 auto;padding:0 20px 40px}
h1{font-size:20px;margin:20px 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:16px 0 6px}
.banner{padding:18px 24px;color:#fff;display:flex;gap:28px;align-items:baseline;flex-wrap:wrap}
.banner .verdict{font-size:30px;font-weight:700;letter-spacing:1px}
.banner .facts{font-size:14px;opacity:.95}
.pass{background:#1e7d32}.fail{background:#c62828}.aborted,.unknown{background:#9a6700}
.cut{background:#fff3cd;color:#6b4e00;border:1px solid #e6c555;padding:8px 12px;border-radius:4px;margin:12px 0}
.stat{font-size:16px;margin:10px 0;padding:10px 14px;background:#fff;border-left:4px solid #1565c0;border-radius:2px}
table{border-collapse:collapse;background:#fff;font-size:13px;margin:6px 0}
th,td{border:1px solid #e1e4e8;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f0f2f5;font-weight:600} td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.behind td{background:#fdecea;font-weight:600}
img{display:block;max-width:100%;margin:8px 0;background:#fff;border:1px solid #e1e4e8}
.incident{background:#fff;border:1px solid #e1e4e8;border-left:5px solid #c62828;padding:10px 16px;margin:14px 0}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px}
pre{background:#f6f8fa;padding:8px;overflow-x:auto;white-space:pre-wrap;word-break:break-all;border:1px solid #e1e4e8}
.muted{color:#666;font-size:12px} details{margin:6px 0}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:0 24px}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _utc(ts: Any) -> str:
    if not isinstance(ts, (int, float)):
        return "—"
    return dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _rel(ts: Any, start: float) -> str:
    if not isinstance(ts, (int, float)):
        return "—"
    secs = ts - start
    sign = "-" if secs < 0 else "+"
    secs = abs(secs)
    return f"{sign}{int(secs // 3600):d}:{int(secs % 3600 // 60):02d}:{int(secs % 60):02d}"


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return _e(value)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, numeric_from: int = 1,
           row_class: Sequence[str] | None = None) -> str:
    out = ["<table><tr>", *(f"<th>{_e(h)}</th>" for h in headers), "</tr>"]
    for i, row in enumerate(rows):
        cls = f' class="{row_class[i]}"' if row_class and row_class[i] else ""
        cells = []
        for j, cell in enumerate(row):
            num = ' class="num"' if j >= numeric_from and not isinstance(cell, str) else ""
            cells.append(f"<td{num}>{cell if isinstance(cell, _Raw) else _fmt(cell)}</td>")
        out.append(f"<tr{cls}>{''.join(cells)}</tr>")
    out.append("</table>")
    return "".join(out)


class _Raw(str):
    """Already-escaped HTML for a table cell."""


def _flight_recorder_html(fr: flight_recorder.FlightRecorderSummary) -> str:
    parts = [f"<p class='muted'>dumps from ranks {_e(_ranges(list(fr.ranks)) or 'none')}; "
             f"format version {_e(', '.join(fr.versions) or '?')}</p>"]
    if fr.diagnosis:
        parts.append(f"<h4>diagnosis: {_e(fr.diagnosis)}</h4>")
        parts.append(_diagnosis_html(fr.diagnosis_detail or {}))
    in_step = []
    for g in fr.groups:
        def pending(r: flight_recorder.RankRow) -> _Raw:
            if not r.pending:
                return _Raw("")
            more = f" … +{len(r.pending) - 1} more" if len(r.pending) > 1 else ""
            return _Raw(f"{_e(r.pending[0])}{_e(more)}")

        rows = [[r.rank, r.last_enqueued, r.last_started, r.last_completed,
                 _Raw("<b>behind</b>" if r.behind else ""), pending(r)] for r in g.rows]
        table = _table(["rank", "last enqueued", "last started", "last completed", "", "oldest not completed"],
                       rows, row_class=["behind" if r.behind else "" for r in g.rows])
        if g.stuck_seq is None and not g.behind_ranks:
            in_step.append(f"<p>process group {_e(g.label)}: {_e(g.note)}</p>{table}")
        else:
            parts.append(f"<h4>process group {_e(g.label)}: {_e(g.note)}</h4>{table}")
    if in_step:
        parts.append(f"<details><summary>{len(in_step)} process group(s) in step</summary>{''.join(in_step)}</details>")
    for err in fr.errors:
        parts.append(f"<p class='muted'>{_e(err)}</p>")
    return "".join(parts)


def _diagnosis_html(detail: Mapping[str, Any]) -> str:
    """soak diagnose's table: per group, each rank's place and what it posted at the divergence."""
    parts = []
    for g in detail.get("groups") or []:
        if g.get("kind") == "none":
            continue
        offsets = g.get("offsets") or {}
        rows = [[r["rank"], r["place"].get("stage"), r["place"].get("gpu"), r["place"].get("pid"), r.get("first_seq"),
                 r.get("last_enqueued"), r.get("last_completed"), offsets.get(str(r["rank"]), ""), r.get("at_divergence")]
                for r in g.get("rows") or []]
        parts.append(f"<p>{_e(g.get('desc'))}: {_e(g.get('kind'))} at seq {_e(g.get('seq'))}</p>"
                     + _table(["rank", "stage", "GPU", "PID", "first seq", "enqueued", "completed", "behind by",
                               f"posted at seq {g.get('seq')}"], rows))
    return "".join(parts)


def _watchdog_html(lines: Sequence[watchdog.WatchdogLine]) -> str:
    """One row per signature (which ranks, which sequence numbers, one example line);
    every line in a collapsed table below."""
    grouped: dict[str, list[watchdog.WatchdogLine]] = {}
    for w in lines:
        grouped.setdefault(w.signature, []).append(w)
    rows = []
    for signature, items in grouped.items():
        ranks = sorted({w.fields["rank"] for w in items if "rank" in w.fields})
        seqs = sorted({w.fields["seq"] for w in items if "seq" in w.fields})
        rows.append([signature, len(items), _Raw(_e(_ranges(ranks)) if ranks else "—"),
                     _Raw(_e(", ".join(map(str, seqs[:4]))) if seqs else "—"), _Raw(f"<code>{_e(items[0].line)}</code>")])
    parts = [_table(["signature", "lines", "ranks", "seq", "first line"], rows, numeric_from=1)]
    full = [[w.signature, w.fields.get("worker", ""), w.fields.get("rank", ""), _Raw(f"<code>{_e(w.line)}</code>")]
            for w in lines[:200]]
    parts.append(f"<details><summary>all {len(lines)} lines</summary>"
                 + _table(["signature", "worker", "rank", "line"], full, numeric_from=2) + "</details>")
    return "".join(parts)


def _ranges(values: Sequence[int]) -> str:
    """0, 1, 2, 3, 5 -> '0-3, 5'."""
    out, run = [], []
    for v in values:
        if run and v == run[-1] + 1:
            run.append(v)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [v]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


def _incident_html(view: IncidentView, start: float) -> str:
    r = view.record
    detect = (r["detected_at"] - r["onset_at"]) if isinstance(r.get("detected_at"), (int, float)) and isinstance(r.get("onset_at"), (int, float)) else None
    parts = [
        "<div class='incident'>",
        f"<h3>Incident {_e(r.get('number', '?'))}: {_e(r.get('kind', '?'))} — rule <code>{_e(r.get('rule', '?'))}</code></h3>",
        f"<p>{_e(r.get('summary') or '')}</p>",
        _table(["", ""], [
            ["onset (best estimate)", _Raw(f"{_e(_utc(r.get('onset_at')))} ({_rel(r.get('onset_at'), start)})")],
            ["detected", _Raw(f"{_e(_utc(r.get('detected_at')))} ({_rel(r.get('detected_at'), start)})"
                              + (f", {detect:.1f} s after onset" if detect is not None else ""))],
            ["killed PIDs (SIGKILL)", _Raw(_e(", ".join(map(str, r.get("killed_pids") or [])) or "none"))],
            ["GPUs released", _Raw(_e({True: "yes", False: "NO"}.get(r.get("gpus_released"), "unknown"))
                                   + (f" after {r['gpu_free_s']:.2f} s" if isinstance(r.get("gpu_free_s"), (int, float)) else ""))],
            ["evidence", _Raw(f"<code>{_e(view.path)}</code>")],
        ], numeric_from=9),
    ]
    reasons = r.get("reasons") or []
    if reasons:
        parts.append("<h4>Rule and signals</h4><ul>" + "".join(f"<li>{_e(x)}</li>" for x in reasons) + "</ul>")
    evidence = r.get("decision_evidence") or r.get("evidence_signals")
    if isinstance(evidence, Mapping):
        signals = evidence.get("signals", evidence)
        def shown(k: str, v: Any) -> str:
            if k.endswith("_at") and isinstance(v, (int, float)):
                return _rel(v, start)
            return ", ".join(map(str, v)) if isinstance(v, list) else _compact(v)

        rows = [[k, _Raw(_e(shown(k, v)))] for k, v in (signals.items() if isinstance(signals, Mapping) else [])]
        if rows:
            parts.append(_table(["signal", "value at the decision"], rows, numeric_from=9))
        if isinstance(evidence.get("thresholds"), Mapping):
            parts.append(f"<p class='muted'>thresholds in force: {_e(_compact(evidence['thresholds']))}</p>")
    notes = r.get("notes") or []
    failed_steps = [f"{k}: {v.get('error') or v.get('note')}" for k, v in (r.get("steps") or {}).items()
                    if isinstance(v, Mapping) and (not v.get("ok", True) or v.get("note"))]
    if notes or failed_steps:
        parts.append("<h4>Evidence capture notes</h4><ul>"
                     + "".join(f"<li>{_e(x)}</li>" for x in dict.fromkeys([*notes, *failed_steps])) + "</ul>")
    if view.watchdog:
        parts.append("<h4>Watchdog and hang lines</h4>")
        parts.append(_watchdog_html(view.watchdog))
    else:
        parts.append("<p class='muted'>no watchdog line in the captured log</p>")
    if view.flight_recorder is not None:
        parts.append("<h4>Flight recorder (per rank, per process group)</h4>")
        parts.append(_flight_recorder_html(view.flight_recorder))
    else:
        parts.append("<p class='muted'>no flight-recorder dump in the evidence</p>")
    if view.files:
        links = ", ".join(f"<a href='{_e(view.path)}/{_e(f)}'>{_e(f)}</a>" for f in view.files[:60])
        parts.append(f"<details><summary>evidence files ({len(view.files)})</summary><p>{links}</p></details>")
    parts.append("</div>")
    return "".join(parts)


def _compact(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {_compact(v)}" if isinstance(v, Mapping) else f"{k}={_compact(v)}"
                         for k, v in value.items() if v is not None)
    return str(value)


def _summary_value(key: str, value: Any) -> str:
    """summary.json values for people: times in UTC, numbers rounded, nested objects one per line."""
    if key.endswith("_at") and isinstance(value, (int, float)):
        return _e(_utc(value))
    if isinstance(value, Mapping):
        return "<br>".join(f"<b>{_e(k)}</b> {_e(_compact(v))}" if isinstance(v, Mapping) else f"{_e(k)}={_e(_compact(v))}"
                           for k, v in value.items() if v is not None)
    return _e(_compact(value))


def ended_because(run_dir: Path, summary: Mapping[str, Any]) -> str | None:
    """One line: why the run ended, from run_ended's reason and harness_error.txt."""
    parts = []
    reason = summary.get("stop_reason")
    if isinstance(reason, str) and reason:
        parts.append(f"The run ended: {reason}")
    fault = Path(run_dir) / "harness_error.txt"
    try:
        first = fault.read_text(encoding="utf-8", errors="replace").splitlines()[:1]
    except OSError:
        first = []
    if first and (not reason or first[0].split(": ", 1)[-1] not in str(reason)):
        parts.append(f"{first[0]} (traceback in harness_error.txt)")
    elif first:
        parts.append("traceback in harness_error.txt")
    return "; ".join(parts) or None


def wall_step_note(event: Mapping[str, Any]) -> str:
    step = event.get("step_s")
    size = f"{step:+.1f} s" if isinstance(step, (int, float)) and not isinstance(step, bool) else "an unknown amount"
    mono = event.get("mono")
    at = f" at +{mono:.0f}s of the run" if isinstance(mono, (int, float)) and not isinstance(mono, bool) else ""
    return (f"The system wall clock stepped {size}{at}. Durations, rates and windows are measured on the "
            "monotonic clock, and the times shown stay on it: this run's figures are unaffected.")


def render_html(model: ReportModel) -> str:
    s = model.summary
    req = s.get("requests") or {}
    tok = s.get("tokens") or {}
    hit = s.get("prefix_cache_hit_ratio")
    duration = s.get("duration_s")
    verdict_cls = model.verdict if model.verdict in ("pass", "fail", "aborted") else "unknown"
    label = model.verdict.upper() + (" (cut off)" if model.cut_off else "")
    facts = [
        f"{_e(format_duration(duration, approx=True))} of load" if isinstance(duration, (int, float)) else "duration unknown",
        f"{len(s.get('incidents') or [])} incident(s)",
        f"requests {req.get('ok', 0)} ok / {req.get('failed', 0)} failed"
        + (f" / {cut} cut by the harness" if (cut := sum(v for k, v in req.items() if k.startswith("cut_by_")
                                                          and isinstance(v, int))) else ""),
        f"{tok.get('generated', 0):,} tokens generated" if isinstance(tok.get("generated"), (int, float)) else "",
        f"prefix-cache hit ratio {hit * 100:.1f}%" if isinstance(hit, (int, float)) else "hit ratio unknown",
    ]
    out = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>soak {_e(model.name)}: {_e(label)}</title><style>{_CSS}</style></head><body>",
        f"<div class='banner {verdict_cls}'><span class='verdict'>{_e(label)}</span>",
        f"<span class='facts'><b>{_e(model.name)}</b> · {_e(_utc(s.get('started_at')))} → {_e(_utc(s.get('ended_at')))}<br>",
        " · ".join(f for f in facts if f), "</span></div><main>",
    ]
    for note in model.notes:
        out.append(f"<div class='cut'>{_e(note)}</div>")
    if model.mtbf is not None:
        out.append(f"<div class='stat'>{_e(model.mtbf.sentence())}</div>")
    if model.incidents:
        out.append("<h2>Incidents</h2>")
        out.extend(_incident_html(v, model.start) for v in model.incidents)
    out.append("<h2>Timeline</h2><p class='muted'>Red lines: incident onset (dashed) and detection (solid).</p>")
    for title, png in model.images:
        out.append(f"<img alt='{_e(title)}' src='data:image/png;base64,{base64.b64encode(png).decode('ascii')}'>")
    out.append("<h2>Requests</h2>")
    out.append("<p>" + ", ".join(f"{_e(k)}: {v}" for k, v in model.outcomes) + "</p>" if model.outcomes else "<p>no requests recorded</p>")
    rows = [[name, st["n"], st["mean"], st["p50"], st["p90"], st["p99"], st["max"]] for name, st in model.request_stats]
    out.append(_table(["successful requests", "n", "mean", "p50", "p90", "p99", "max"], rows))
    out.append("<h2>Configuration</h2><div class='grid'><div>")
    out.append(_table(["setting", "value"], [[k, v] for k, v in model.brief], numeric_from=9))
    out.append("</div><div>")
    out.append(_table(["summary", "value"], [[k, _Raw(_summary_value(k, v))]
                                             for k, v in s.items() if k != "incidents" and v is not None],
                      numeric_from=9))
    out.append("</div></div>")
    if model.config_text:
        out.append(f"<details><summary>config.yaml</summary><pre>{_e(model.config_text)}</pre></details>")
    if model.events:
        rows = [[_rel(e.get("ts"), model.start), e.get("type", "?"),
                 _Raw(f"<code>{_e(json.dumps({k: v for k, v in e.items() if k not in ('ts', 'type')}))}</code>")]
                for e in model.events]
        out.append(f"<details><summary>events ({len(model.events)})</summary>")
        out.append(_table(["t", "type", "fields"], rows, numeric_from=9))
        out.append("</details>")
    out.append(f"<p class='muted'>rendered by soak report from {_e(model.name)}'s run directory</p></main></body></html>")
    return "".join(out)


def junit_for(model: ReportModel) -> bytes:
    props: list[tuple[str, str]] = []
    if model.mtbf is not None:
        props.append(("mtbf", model.mtbf.sentence()))
    s = model.summary
    for key in ("duration_s", "prefix_cache_hit_ratio"):
        if s.get(key) is not None:
            props.append((key, str(s[key])))
    req = s.get("requests") or {}
    props += [("requests_ok", str(req.get("ok", 0))), ("requests_failed", str(req.get("failed", 0)))]
    props += [(key, str(value)) for key, value in req.items() if key.startswith("cut_by_")]
    start = s.get("started_at") if isinstance(s.get("started_at"), (int, float)) else None
    lines = [f"verdict {model.verdict}" + (" (cut off)" if model.cut_off else "")]
    if model.mtbf is not None:
        lines.append(model.mtbf.sentence())
    lines += [incident_line(v.record, start) for v in model.incidents]
    return build_junit(s, name=model.name, hostname=str(s.get("hostname") or "localhost"), properties=props,
                       system_out="\n".join(lines))


@dataclass(frozen=True)
class Written:
    html: Path | None
    junit: Path
    summary: Path | None
    model: ReportModel


def write_report(run_dir: str | Path, *, confidence: float = 0.95, write_summary: bool = True,
                 html: bool = True, summary: Mapping[str, Any] | None = None) -> Written:
    """summary.json (unless ``write_summary=False``), junit.xml, and report.html
    unless ``html=False`` (``soak run --no-html``: no plotting at the run's end).
    ``summary``: the one the run's end wrote, rendered as it is (not judged again)."""
    run = load_run(run_dir, summary=summary)
    model = build(run, confidence=confidence, with_plots=html)
    path = Path(run_dir)
    summary_path = None
    if write_summary:  # run.summary is the judge's (soak.judge.rejudge)
        summary_path = path / "summary.json"
        write_atomic(summary_path, (json.dumps(run.summary, indent=2) + "\n").encode("utf-8"))
    html_path, junit_path = path / "report.html", path / "junit.xml"
    if html:
        write_atomic(html_path, render_html(model).encode("utf-8"))
    write_atomic(junit_path, junit_for(model))
    return Written(html=html_path if html else None, junit=junit_path, summary=summary_path, model=model)
