"""report.html from the report's model (soak.report.render.build): one
self-contained file, CSS inline, plots as base64 PNG. Pure: a model in, text out."""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from soak.durations import format_duration
from soak.flightrec import dumps as flight_recorder
from soak.judge.ladder import HEADLINES, UNDECIDED_EXIT
from soak.report import oracle_html, watchdog
from soak.report.proof import proof_html
from soak.durations import format_latency
from soak.onset import latency_span, onset_words, restated
from soak.records import DetectionLatency
from soak.summary_file import IncidentEntry

if TYPE_CHECKING:  # the model is built in render, which calls render_html: types only
    from soak.report.render import IncidentView, ReportModel


_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;color:#1d1d1f;background:#f6f7f9}
main{max-width:1140px;margin:0 auto;padding:0 20px 40px}
h1{font-size:20px;margin:20px 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:16px 0 6px}
.banner{padding:18px 24px;color:#fff;display:flex;gap:28px;align-items:baseline;flex-wrap:wrap}
.banner .verdict{font-size:30px;font-weight:700;letter-spacing:1px}
.banner .facts{font-size:14px;opacity:.95}
.pass{background:#1e7d32}.fail{background:#c62828}.aborted,.unknown{background:#9a6700}.undecided{background:#1565c0}
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
.banner .reasons{font-size:15px;margin:4px 0 0;padding-left:18px} .banner .build{font-size:13px;opacity:.9}
.stopline{color:#444;font-size:13px;margin:10px 0 4px}
table.thresholds td.held{color:#1e7d32;font-weight:700} table.thresholds td.breached{color:#c62828;font-weight:700}
table.thresholds tr.breached td{background:#fdecea}
svg.zoom{display:block;background:#fff;border:1px solid #e1e4e8;margin:8px 0}
svg.proof{display:block;background:#fff;border:1px solid #e1e4e8;margin:8px 0}
.stat.proof.accepted{border-left-color:#1e7d32}.stat.proof.rejected{border-left-color:#c62828}
.stat.proof.truncated{border-left-color:#9a6700}
""" + oracle_html.CSS


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


def _latency_said(latency: DetectionLatency | None) -> str:
    if latency is None:
        return "unknown: no onset or detection time recorded"
    words = latency_span(latency)
    return words.replace("(point estimate)", "(a point estimate: the rule gives no onset interval)")


def _onset_row(r: Mapping[str, Any], latency: DetectionLatency | None, start: float) -> list[Any]:
    """The onset as the evidence allows it: an interval where the rule gave one, else
    its one estimate, named as such."""
    if latency is None or latency.point or latency.onset_earliest is None or latency.onset_latest is None:
        return ["onset (point estimate)", _Raw(f"{_e(_utc(r.get('onset_at')))} ({_rel(r.get('onset_at'), start)})")]
    said = onset_words(latency) or ""
    day = dt.datetime.fromtimestamp(latency.onset_earliest, tz=dt.timezone.utc).strftime("%Y-%m-%d")
    return ["onset (interval)", _Raw(f"<span class='onset-interval'>{_e(said.removeprefix('onset '))}</span>, "
                                     f"{_e(day)} ({_rel(latency.onset_earliest, start)})")]


def _incident_html(view: IncidentView, start: float, *, tie_margin: float = 0.2) -> str:
    r = view.record
    latency = IncidentEntry.from_json(r).detection_latency
    summary = r.get("summary") if isinstance(r.get("summary"), str) else ""
    parts = [
        "<div class='incident'>",
        f"<h3>Incident {_e(r.get('number', '?'))}: {_e(r.get('kind', '?'))} — rule <code>{_e(r.get('rule', '?'))}</code></h3>",
        f"<p>{_e(restated(summary, latency) if summary else '')}</p>",
        _table(["", ""], [
            _onset_row(r, latency, start),
            ["detected", _Raw(f"{_e(_utc(r.get('detected_at')))} ({_rel(r.get('detected_at'), start)})")],
            ["detection latency", _Raw(f"<span class='latency'>{_e(_latency_said(latency))}</span>")],
            ["killed PIDs (SIGKILL)", _Raw(_e(", ".join(map(str, r.get("killed_pids") or [])) or "none"))],
            ["GPUs released", _Raw(_e({True: "yes", False: "NO"}.get(r.get("gpus_released"), "unknown"))
                                   + (f" after {r['gpu_free_s']:.2f} s" if isinstance(r.get("gpu_free_s"), (int, float)) else ""))],
            ["evidence", _Raw(f"<code>{_e(view.path)}</code>")],
        ], numeric_from=9),
    ]
    if view.corruption is not None:  # the oracle's evidence: the answers side by side (soak.report.oracle_html)
        parts.append(oracle_html.corruption_card(view.corruption, tie_margin=tie_margin, start=start))
    if view.zoom:  # drawn by soak.report.zoom from the run's numbers: its text is escaped there
        parts.append("<h4>A minute either side of the onset</h4>" + view.zoom
                     + "<p class='muted'>One line a pipeline stage, reading by reading; the last stage in thick red. "
                       "Dashed red: onset; shaded red: the onset interval the evidence allows (where the rule "
                       "gives one); solid red: detection; grey: the server down for its kill and restart (or "
                       "the stop). Below: generated tokens/s from the server's counter, and the requests it was "
                       "running.</p>")
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
    # a corruption's server still answered: no watchdog line or dump is expected of it, only shown if there
    expected = view.corruption is None and r.get("kind") != "corruption"
    if view.watchdog:
        parts.append("<h4>Watchdog and hang lines</h4>")
        parts.append(_watchdog_html(view.watchdog))
    elif expected:
        parts.append("<p class='muted'>no watchdog line in the captured log</p>")
    if view.flight_recorder is not None:
        parts.append("<h4>Flight recorder (per rank, per process group)</h4>")
        parts.append(_flight_recorder_html(view.flight_recorder))
    elif expected:
        parts.append("<p class='muted'>no flight-recorder dump in the evidence</p>")
    if view.files:
        links = ", ".join(f"<a href='{_e(view.path)}/{_e(f)}'>{_e(f)}</a>" for f in view.files[:60])
        parts.append(f"<details><summary>evidence files ({len(view.files)})</summary><p>{links}</p></details>")
    parts.append("</div>")
    return "".join(parts)


def _compact(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    if value is None:
        return "\u2014"
    if isinstance(value, (list, tuple, bool)):  # JSON as written, never a Python repr
        return json.dumps(value, separators=(", ", ": "), default=str)
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {_compact(v)}" if isinstance(v, Mapping) else f"{k}={_compact(v)}"
                         for k, v in value.items() if v is not None)
    return str(value)


# summary.json's fields with a section of their own above: not repeated as a blob at the bottom
_SHOWN_ABOVE = frozenset({"incidents", "thresholds", "criteria", "verdict_reasons", "proof"})


def _summary_value(key: str, value: Any) -> str:
    """summary.json values for people: times in UTC, numbers rounded, nested objects one per line."""
    if key.endswith("_at") and isinstance(value, (int, float)):
        return _e(_utc(value))
    if isinstance(value, Mapping):
        return "<br>".join(f"<b>{_e(k)}</b> {_e(_compact(v))}" if isinstance(v, Mapping) else f"{_e(k)}={_e(_compact(v))}"
                           for k, v in value.items() if v is not None)
    return _e(_compact(value))


LATENCY_ROWS = frozenset({"TTFT", "ITL mean per request", "ITL p99 per request", "TPOT", "end-to-end latency"})


def _stat_cell(row: str, value: Any) -> Any:
    return _Raw(_e(format_latency(value))) if row in LATENCY_ROWS and isinstance(value, (int, float)) else value


def _thresholds_html(model: ReportModel) -> str:
    """The table under the verdict: each threshold held or breached, with what was observed."""
    rows = model.thresholds
    s = model.summary.thresholds
    if not rows:
        return "" if s is None or not s.error else f"<p class='stopline'>Thresholds: {_e(s.error)}</p>"
    body = ["<table class='thresholds'><tr><th></th><th>metric</th><th>condition</th><th>observed</th>"
            "<th>window</th><th>breached at</th></tr>"]
    for r in rows:
        mark, cls = ("\u2713", "held") if r.held else ("\u2717", "breached")
        body.append(f"<tr class='{cls}'><td class='{cls}'>{mark}</td><td>{_e(r.metric)}</td><td>{_e(r.condition)}</td>"
                    f"<td class='num observed'>{_e(r.observed)}</td><td>{_e(r.window)}</td><td>{_e(r.breached_at)}</td></tr>")
    body.append("</table>")
    held = sum(1 for r in rows if r.held)
    return (f"<h2>Thresholds: {held} of {len(rows)} held</h2>" + "".join(body)
            + (f"<p class='muted'>{_e(s.error)}</p>" if s is not None and s.error else ""))


def _headline(model: ReportModel) -> str:
    """The banner's word, as the end block's (soak.judge.ladder.HEADLINES): an undecided prove:
    run (exit 5) reads UNDECIDED, never the PASS a CI job that went red contradicts."""
    word = HEADLINES[UNDECIDED_EXIT] if model.summary.exit_code == UNDECIDED_EXIT else model.verdict.upper()
    return word + (" (cut off)" if model.cut_off else "")


def _banner(model: ReportModel, facts: Sequence[str]) -> str:
    s = model.summary
    verdict_cls = model.verdict if model.verdict in ("pass", "fail", "aborted") else "unknown"
    if s.exit_code == UNDECIDED_EXIT:
        verdict_cls = "undecided"  # the proof section's blue: soak more
    label = _headline(model)
    out = [f"<div class='banner {verdict_cls}'><span class='verdict'>{_e(label)}</span><span class='facts'>"]
    if model.reasons:
        out.append("<ul class='reasons'>" + "".join(f"<li>{_e(r)}</li>" for r in model.reasons) + "</ul>")
    elif s.exit_code == UNDECIDED_EXIT and isinstance((s.proof or {}).get("sentence"), str):
        # "Passed" would hide why CI went red: what would decide the test
        out.append(f"<div class='reasons'>The sequential test did not decide: {_e(s.proof['sentence'])}</div>")
    elif model.verdict == "pass":
        out.append(f"<div class='reasons'>{_e(model.pass_line)}</div>")
    out.append(f"<b>{_e(model.name)}</b>" + (f" <span class='build'>build {_e(model.build_label)}</span>"
                                            if model.build_label else ""))
    out.append(f" · {_e(_utc(s.started_at))} → {_e(_utc(s.ended_at))}<br>{' · '.join(f for f in facts if f)}")
    out.append("</span></div>")
    return "".join(out)


def render_html(model: ReportModel) -> str:
    s = model.summary
    req, generated = s.requests, s.tokens.generated
    hit = s.prefix_cache_hit_ratio
    duration = s.duration_s
    label = _headline(model)
    facts = [
        f"{_e(format_duration(duration, approx=True))} of load" if duration is not None else "duration unknown",
        f"{len(s.incidents)} incident(s)",
        f"requests {req.ok or 0} ok / {req.failed or 0} failed"
        + (f" / {req.cut} cut by the harness" if req.cut else ""),
        f"{generated:,} tokens generated" if generated is not None else "",
        f"prefix-cache hit ratio {hit * 100:.1f}%" if hit is not None else "hit ratio unknown",
    ]
    out = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>soak {_e(model.name)}: {_e(label)}</title><style>{_CSS}</style></head><body>",
        _banner(model, facts), "<main>",
    ]
    if model.stop_line:
        out.append(f"<p class='stopline'>{_e(model.stop_line)}</p>")
    out.append(_thresholds_html(model))
    for note in model.notes:
        out.append(f"<div class='cut'>{_e(note)}</div>")
    if model.mtbf is not None:
        out.append(f"<div class='stat'>{_e(model.mtbf.sentence())}</div>")
    out.append(proof_html(s.proof))  # prove: the sequential test's sentence and walk (soak.report.proof)
    if model.canaries.total or model.corruptions:
        out.append(oracle_html.figures_html(model.canaries, max_share=model.max_share))
    if model.incidents:
        out.append("<h2>Incidents</h2>")
        out.extend(_incident_html(v, model.start, tie_margin=model.tie_margin) for v in model.incidents)
    out.append("<h2>Timeline</h2><p class='muted'>Red lines: incident onset (dashed) and detection (solid); orange "
               "dotted: a JIT compile during inference (vLLM's jit_monitor). The heatmap has one row a pipeline "
               "stage (its busiest GPU): the colour is the stage's mean over the column, so healthy load reads as "
               "an even band; a red ring marks a column in which the stage sat dark while another stage was busy "
               "for as long as the detector's pp_tail_stall window (3 s on GPUs), however narrow the column: a "
               "stalled last stage beside busy ones is a ring on its row (the harness's own kill and restart "
               "mark nothing)." + (" Each incident above has its own zoom, reading by reading." if model.incidents
                                   else "") + "</p>")
    if model.canary_strip:  # drawn from the run's records; its text escaped in soak.report.oracle_html
        out.append("<h3>Canaries and incidents</h3>" + model.canary_strip + oracle_html.strip_legend())
    for title, png in model.images:
        out.append(f"<img alt='{_e(title)}' src='data:image/png;base64,{base64.b64encode(png).decode('ascii')}'>")
    out.append("<h2>Requests</h2>")
    out.append("<p>" + ", ".join(f"{_e(k)}: {v}" for k, v in model.outcomes) + "</p>" if model.outcomes else "<p>no requests recorded</p>")
    columns = ("mean", "p50", "p90", "p95", "p99", "max")
    rows = [[name, st["n"], *(_stat_cell(name, st.get(c)) for c in columns)] for name, st in model.request_stats]
    out.append(_table(["successful requests", "n", *columns], rows))
    out.append("<h2>Configuration</h2><div class='grid'><div>")
    out.append(_table(["setting", "value"], [[k, v] for k, v in model.brief], numeric_from=9))
    out.append("</div><div>")
    # every field summary.json holds, named or not: the table shows the record as written
    out.append(_table(["summary", "value"], [[k, _Raw(_summary_value(k, v))]
                                             for k, v in s.to_json().items() if k not in _SHOWN_ABOVE and v is not None],
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
