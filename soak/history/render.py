"""history.json, history.csv and history.html (plots as inline PNG) from a ``History``."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import html
import io
import json
import math
import os
from pathlib import Path
from typing import Any

from soak.csvcell import rows_to_csv
from soak.durations import format_duration
from soak.history.model import History, RunRecord
from soak.summary_file import IncidentEntry
from soak.plain import plain
from soak.thresholds.evaluate import format_value

CSV_COLUMNS = (
    "started_at_utc", "run_id", "path", "build", "label", "vllm_version", "launch_digest", "verdict", "cut_off",
    "exposure_s", "hangs", "times_to_hang_s", "intervals", "restarts", "output_tokens_per_s", "ttft_p50_s",
    "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "prefix_hit_ratio", "error_rate", "thresholds_passed",
    "thresholds_breached", "clean", "report", "incident_kinds", "identity",
)


def _utc(ts: float | None) -> str:
    if ts is None:
        return ""
    return dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _incident_json(i: IncidentEntry) -> dict[str, Any]:
    """An incident as the night's summary.json gave it, the onset interval and the
    detection latency included (read back totally: junk ends are null)."""
    latency = i.detection_latency
    return {"number": i.number, "kind": i.kind, "rule": i.rule, "onset_at": i.onset_at,
            "onset_earliest_at": i.onset_earliest_at, "onset_latest_at": i.onset_latest_at,
            "detected_at": i.detected_at, "detection_latency_s": None if latency is None else latency.to_json()}


def run_json(r: RunRecord) -> dict[str, Any]:
    return {
        "path": r.path, "run_id": r.run_id, "name": r.name, "started_at": r.started_at, "started_at_utc": _utc(r.started_at),
        "build": r.build, "label": r.label, "vllm_version": r.vllm_version, "launch_digest": r.launch_digest,
        "verdict": r.verdict, "cut_off": r.cut_off, "exposure_s": r.exposure_s, "hangs": r.hangs,
        "times_to_hang_s": list(r.times_to_hang_s), "restarts": r.restarts,
        "intervals": [dataclasses.asdict(i) for i in r.intervals],
        "incidents": [_incident_json(i) for i in r.incidents],
        "figures": dict(r.figures), "thresholds_passed": r.thresholds_passed,
        "thresholds_breached": list(r.thresholds_breached), "clean": r.clean, "report": r.report,
        "incident_kinds": dict(r.incident_kinds), "corrupt": r.corrupt,
        "identity": r.identity, "facts": dict(r.facts),
    }


def history_json(h: History) -> dict[str, Any]:
    builds = []
    for b in h.builds:
        m = b.mtbf
        builds.append({
            "build": b.build, "runs": b.runs, "clean_runs": b.clean_runs, "hang_free_runs": b.hang_free_runs,
            "exposure_s": b.exposure_s, "hangs": b.hangs,
            "mtbf_s": None if m is None else m.point_s, "mtbf_lower_s": None if m is None else m.lower_s,
            "mtbf_upper_s": None if m is None else m.upper_s,
            "mtbf_one_sided_lower_s": None if m is None else m.one_sided_lower_s,
            "mtbf_statement": None if m is None else m.sentence(), "verdict": b.verdict, "fixed": b.fixed,
            "standing": b.standing,  # the verdict's word (soak.history.verdict.Standing)
            "vllm_versions": list(b.vllm_versions), "launch_digests": list(b.digests),
            "label": b.label, "identity": b.identity, "facts": dict(b.facts),
        })
    return plain({
        "confidence": h.confidence, "baseline": h.baseline, "baseline_mtbf_s": h.baseline_mtbf_s, "best": h.best,
        "builds": builds, "rate_tests": [dataclasses.asdict(t) for t in h.rate_tests],
        "costs": {k: [dataclasses.asdict(c) for c in v] for k, v in h.costs.items()},
        "runs": [run_json(r) for r in h.runs],
        # labels that named several builds: what differed between them (soak.history.build.LabelSplit)
        "splits": [split.to_json() for split in h.splits],
        **({"proofs": [p.to_json() for p in h.proofs]} if h.proofs else {}),
    }, keep_infinity=True)


def history_csv(h: History) -> str:
    # Every cell through soak.csvcell: a server's /version or a label is text a
    # spreadsheet must never run as a formula.
    return rows_to_csv([CSV_COLUMNS, *(_csv_row(r) for r in h.runs)])


def _csv_row(r: RunRecord) -> list[Any]:
    f = r.figures
    return [
        _utc(r.started_at), r.run_id or "", r.path, r.build, r.label or "", r.vllm_version or "",
        r.launch_digest or "", r.verdict, str(r.cut_off).lower(), f"{r.exposure_s:.3f}", r.hangs,
        ";".join(f"{t:.3f}" for t in r.times_to_hang_s), len(r.intervals), r.restarts,
        *("" if f.get(k) is None else f"{f[k]:.6g}" for k in
          ("output_tokens_per_s", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "prefix_hit_ratio", "error_rate")),
        "" if r.thresholds_passed is None else str(r.thresholds_passed).lower(),
        ";".join(r.thresholds_breached), str(r.clean).lower(), r.report or "", incidents_text(r, sep=";"),
        r.identity,
    ]


# -- plots -------------------------------------------------------------------

def _figure(height: float = 3.2):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure(figsize=(9, height), dpi=100)


def _png(fig) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _colors(h: History) -> dict[str, str]:
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
    return {b.build: palette[i % len(palette)] for i, b in enumerate(h.builds)}


def plot_mtbf(h: History) -> bytes:
    fig = _figure(0.8 + 0.5 * max(1, len(h.builds)))
    ax = fig.add_subplot(1, 1, 1)
    colors = _colors(h)
    finite = [x for b in h.builds if b.mtbf for x in (b.mtbf.lower_s, b.mtbf.upper_s, b.mtbf.one_sided_lower_s)
              if math.isfinite(x)] + ([h.baseline_mtbf_s] if h.baseline_mtbf_s else [])
    right = max(finite, default=60.0) / 60 * 3
    for y, b in enumerate(h.builds):
        if b.mtbf is None:
            continue
        lo, hi = b.mtbf.lower_s / 60, b.mtbf.upper_s / 60
        if math.isfinite(hi):
            ax.plot([lo, hi], [y, y], color=colors[b.build], lw=3)
            ax.plot([b.mtbf.point_s / 60], [y], "o", color="black")
        else:  # no hang: only a lower bound
            ax.annotate("", xy=(right, y), xytext=(b.mtbf.one_sided_lower_s / 60, y),
                        arrowprops={"arrowstyle": "->", "color": colors[b.build], "lw": 3})
            ax.plot([b.mtbf.one_sided_lower_s / 60], [y], "|", color="black", ms=14)
    if h.baseline_mtbf_s:
        ax.axvline(h.baseline_mtbf_s / 60, color="grey", ls="--", label=f"baseline MTBF ({h.baseline})")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_yticks(range(len(h.builds)), [b.build for b in h.builds])
    ax.set_xscale("log")
    ax.set_xlim(left=max(min(finite, default=1.0) / 60 / 3, 1e-3), right=right)
    ax.set_xlabel(f"MTBF, minutes ({h.confidence * 100:g}% exact chi-square interval; arrow: no hang, lower bound)")
    ax.set_ylim(-0.7, len(h.builds) - 0.3)
    return _png(fig)


def plot_per_night(h: History, what: str) -> bytes:
    return _png(per_night_figure(h, what))


def per_night_figure(h: History, what: str):
    """Time to hang ("tth") or throughput per night, on an axis from 0."""
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    colors = _colors(h)
    labelled: set[str] = set()
    for x, r in enumerate(h.runs):
        label = r.build if r.build not in labelled else None
        labelled.add(r.build)
        if what == "tth":
            for i in r.intervals:
                marker = "x" if i.hang else "^"
                ax.plot([x], [i.length_s / 60], marker, color=colors[r.build], ms=8, mfc="none" if not i.hang else None,
                        label=label)
                label = None
        else:
            value = r.figures.get("output_tokens_per_s")
            if value is not None:
                ax.bar([x], [value], color=colors[r.build], label=label)
    ax.set_xticks(range(len(h.runs)), [_utc(r.started_at)[5:16].replace("T", " ") or str(i) for i, r in enumerate(h.runs)],
                  rotation=30, fontsize=7)
    if what == "tth":
        ax.set_ylabel("minutes (x: hang; ^: no hang, censored)")
    else:
        ax.set_ylabel("generated tokens/s")
    ax.set_ylim(bottom=0)  # an honest axis: a length or a rate read against nothing
    if ax.get_legend_handles_labels()[0]:  # a build with no figure draws nothing to label
        ax.legend(fontsize=8)
    return fig


# -- html --------------------------------------------------------------------

_CSS = """body{font:14px system-ui,sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}td.n{text-align:right}.good{color:#070}.bad{color:#b00}
.lead{font-size:1.2em;padding:.6em;background:#eef}img{max-width:100%}.muted{color:#666}"""


def _e(v: Any) -> str:
    return v if isinstance(v, _Markup) else html.escape(str(v))


class _Markup(str):
    """A cell already written as HTML, its every outside string escaped."""


def _table(header: list[str], rows: list[list[Any]], *, cls: str = "") -> str:
    out = [f"<table{f' class={chr(39)}{cls}{chr(39)}' if cls else ''}><tr>", *(f"<th>{_e(h)}</th>" for h in header),
           "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>")
    out.append("</table>")
    return "".join(out)


def thresholds_cell(r: RunRecord) -> _Markup:
    """✓ when every threshold held, ✗ and the breached ones, a dash where the run had none."""
    if r.thresholds_breached or r.thresholds_passed is False:
        names = ", ".join(r.thresholds_breached) or "breached"
        return _Markup(f"<span class='bad'>✗ {_e(names)}</span>")
    if r.thresholds_passed:
        return _Markup("<span class='good'>✓</span>")
    return _Markup("—")


def report_cell(r: RunRecord, out_dir: Path | None) -> _Markup:
    """A relative link to the run's report.html (so the folder can move or be served
    as it is), where the report existed when the history was read; the run's own path else."""
    name = _e(Path(r.path).name or r.path)
    if r.report is None:
        return _Markup(f"<span class='muted' title='{_e(r.path)}: no report.html'>{name}</span>")
    href = Path(os.path.relpath(r.report, out_dir)).as_posix() if out_dir is not None else r.report
    return _Markup(f"<a href='{_e(href)}' title='{_e(r.path)}'>{name}</a>")


def verdict_text(r: RunRecord) -> str:
    """The verdict, with why where a fail had no incident: a breached SLO (exit 99) is not a hang."""
    if r.cut_off:
        return f"{r.verdict} (cut off)"
    if r.verdict == "fail" and not r.incidents and r.thresholds_breached:
        return "fail: thresholds breached, no incident"
    if r.corrupt:  # wrong answers: a failure night, said as such even where a verdict says otherwise
        return "fail: corruption" if r.verdict == "fail" else f"{r.verdict}, but a corruption recorded: a failure"
    return r.verdict


def incidents_text(r: RunRecord, *, sep: str = ", ") -> str:
    """The night's incidents by kind: "1 corruption, 1 hang"; "" for none."""
    return sep.join(f"{n} {kind}" for kind, n in r.incident_kinds)


def no_baseline_sentence(h: History) -> str:
    builds = ", ".join(b.build for b in h.builds)
    return (f"No baseline build: none is judged fixed or better. Name one with --baseline BUILD "
            f"(builds: {builds}); history never picks one itself, so a new night cannot change it.")


def _img(title: str, png: bytes) -> str:
    return f"<h3>{_e(title)}</h3><img alt='{_e(title)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"


def _proofs_html(h: History) -> str:
    """soak history --prove: each build's nights as one sequential test, its walk
    drawn between the accept and reject lines (soak.report.proof)."""
    if not h.proofs:
        return ""
    from soak.report.proof import walk_svg

    out = ["<h2>Is it fixed? (sequential test over each build's nights)</h2><p class='muted'>Each build's nights "
           "laid end to end, oldest first: the thick line is its walk (one step up per hang); green: the accept "
           "line, reached in clean time means fixed; red: the reject line, a hang on or above it means not fixed; "
           "dashed: the truncation (docs/prove.md).</p>"]
    for p in h.proofs:
        d = p.decision
        out.append(f"<h3>{_e(p.build)}</h3><p class='lead proof {_e(d.state.value)}'>{_e(d.sentence)}</p>")
        out.append(f"<p class='muted'>{'<br>'.join(_e(r) for r in d.reasons[1:])}</p>")
        out.append(walk_svg(d.plan, hang_exposures_s=p.hang_exposures_s, exposure_s=p.exposure_s,
                            decision=d.state.value, decided_at=(d.exposure_s, d.hangs),
                            title=f"{p.build}: the sequential test over its nights"))
    return "".join(out)


def _splits_html(h: History) -> str:
    """Labels that named several builds: what ran differed, each fact that did, per build."""
    if not h.splits:
        return ""
    out = ["<h3>One label, several builds</h3><p class='muted'>A build is what ran: nights under one "
           "<code>build:</code> label whose executable, script, packages, NCCL, LD_LIBRARY_PATH, PYTHONPATH, model, "
           "revision, flags or /version differ are separate builds, never pooled.</p>"]
    for split in h.splits:
        out.append(f"<p class='lead split'>{_e(split.sentence())}</p>")
        out.append(_table(["fact", *split.builds], [[d.field, *d.values] for d in split.differences], cls="split"))
    return "".join(out)


def history_html(h: History, *, out_dir: Path | None = None) -> str:
    """The page; ``out_dir``: where it is written, so that report links are relative to it."""
    pct = f"{h.confidence * 100:g}%"
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>soak history</title><style>{_CSS}</style></head><body>",
           f"<h1>soak history: {len(h.runs)} runs, {len(h.builds)} builds</h1>"]
    if h.best:
        out.append(f"<p class='lead'>{_e(h.best['statement'])}</p>")
    elif h.baseline is None:
        out.append(f"<p class='lead' id='no-baseline'>{_e(no_baseline_sentence(h))}</p>")
    out.append("<h2>Builds</h2>")
    rows = []
    for b in h.builds:
        m = b.mtbf
        rows.append([b.build, b.runs, b.clean_runs, b.hang_free_runs, format_duration(b.exposure_s, approx=True), b.hangs,
                     "—" if m is None or m.point_s is None else format_duration(m.point_s, approx=True),
                     "—" if m is None else f"{format_duration(m.lower_s, approx=True)} to {format_duration(m.upper_s, approx=True)}",
                     "—" if m is None else format_duration(m.one_sided_lower_s, approx=True), b.verdict])
    out.append(_table(["build", "runs", "clean", "no hang", "exposure", "hangs", "MTBF", f"{pct} interval",
                       f"MTBF above ({pct})", "verdict"], rows))
    out.append(_splits_html(h))
    if h.baseline_mtbf_s:
        out.append(f"<p class='muted'>Baseline: {_e(h.baseline)}, MTBF {format_duration(h.baseline_mtbf_s, approx=True)}. Hangs are a "
                   "Poisson process in exposure (time at risk); exact chi-square intervals.</p>")
    if h.rate_tests:
        out.append("<h2>Hang rate between builds</h2><ul>")
        out += [f"<li>{_e(t.statement)}</li>" for t in h.rate_tests]
        out.append("</ul>")
    for build, costs in h.costs.items():
        out.append(f"<h2>Cost of {_e(build)} against {_e(h.baseline)}</h2>")
        rows = []
        for c in costs:
            fmt = (lambda v, m=c.metric: format_value(m, v))
            interval = "—" if c.delta_lower is None else f"[{fmt(c.delta_lower)}, {fmt(c.delta_upper)}]"
            rel = "" if c.relative is None else f" ({c.relative * 100:+.1f}%)"
            rows.append([c.label, fmt(c.a), fmt(c.b), (fmt(c.delta) + rel) if c.delta is not None else "—", interval,
                         "—" if c.p_value is None else f"{c.p_value:.3g}", c.verdict, c.method])
        out.append(_table(["figure", str(h.baseline), build, "change", f"{pct} interval", "p", "verdict", "method"], rows))
    out.append(_proofs_html(h))
    out.append("<h2>Plots</h2>")
    if h.builds:
        out.append(_img("MTBF interval per build", plot_mtbf(h)))
    if h.runs:
        out.append(_img("Time to hang per night", plot_per_night(h, "tth")))
        out.append(_img("Throughput per night", plot_per_night(h, "throughput")))
    out.append("<h2>Runs</h2>")
    rows = []
    for r in h.runs:
        f = r.figures
        rows.append([_utc(r.started_at), r.build, verdict_text(r),
                     format_duration(r.exposure_s, approx=True), r.hangs, ", ".join(format_duration(t, approx=True) for t in r.times_to_hang_s) or "—",
                     *(format_value(k, f.get(k)) for k in ("output_tokens_per_s", "ttft_p50", "ttft_p99", "tpot_p50",
                                                            "tpot_p99", "prefix_hit_ratio")),
                     thresholds_cell(r), "✓" if r.clean else "", report_cell(r, out_dir), incidents_text(r) or "—"])
    out.append(_table(["start (UTC)", "build", "verdict", "exposure", "hangs", "time to hang", "tok/s", "TTFT p50",
                       "TTFT p99", "TPOT p50", "TPOT p99", "hit ratio", "thresholds", "clean", "report", "incidents"],
                      rows, cls="runs"))
    out.append("<p class='muted'>Exposure is time at risk: load start (or a restart) to a hang's onset or the end of "
               "load; cut-off runs count up to their last record. report.html's MTBF counts the same (soak.exposure). "
               "Clean: passed, no incident, every threshold held; a breached threshold is no hang, but no clean "
               "night either. A corruption (a canary's answer the oracle could not explain) is a failure night: "
               "the server answered, wrongly.</p></body></html>")
    return "".join(out)


def write_history(h: History, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"html": out_dir / "history.html", "csv": out_dir / "history.csv", "json": out_dir / "history.json"}
    paths["json"].write_text(json.dumps(history_json(h), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    paths["csv"].write_text(history_csv(h), encoding="utf-8")
    paths["html"].write_text(history_html(h, out_dir=out_dir.absolute()), encoding="utf-8")
    return paths
