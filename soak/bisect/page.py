"""bisect.html and the bisect's sentences, rendered from bisect.json's document
(``record.bisect_document``) by pure functions: where the bisect stands in one
sentence, the posterior per build after every segment as a chart (inline SVG,
no script), the builds, and the segments table linking each segment's report.

Every label and path comes from a file someone wrote: escaped here (HTML) or
passed through soak.printable (a terminal).
"""

from __future__ import annotations

import html
from typing import Any, Mapping, Sequence

from soak.printable import printable

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf")


def span(seconds: float) -> str:
    """A time at risk as a person reads it: 45 s, 41 min, 2.3 h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _label(doc: Mapping[str, Any], index: int | None) -> str:
    builds = doc.get("builds") or []
    if index is None or not 0 <= index < len(builds):
        return "?"
    return str(builds[index].get("label", index))


def sentence(doc: Mapping[str, Any]) -> str:
    """Where the bisect stands, in one sentence (the page's headline, the ending line)."""
    now = doc["now"]
    post = now["posterior"]
    best, conf = _label(doc, post["best"]), post["confidence"]
    n, spent = post["segments"], span(now["spent_s"])
    after = f"after {n} segment{'' if n == 1 else 's'}, {spent} at risk"
    if now["state"] == "found":
        return f"first bad build: {best} (posterior {conf:.2f}) {after}"
    if now["state"] == "out_of_budget" or doc.get("stopped_by") == "segment bound":
        what = "time at risk" if now["state"] == "out_of_budget" else "segment count"
        return (f"undecided, the budget ({what}) is spent: most likely first bad build {best} "
                f"(posterior {conf:.2f}, {doc['threshold']:.2f} needed) {after}")
    nxt = now.get("next") or {}
    return (f"still searching: most likely first bad build {best} (posterior {conf:.2f}, "
            f"{doc['threshold']:.2f} needed) {after}; next: {_label(doc, nxt.get('build'))} for "
            f"{span(float(nxt.get('segment_s') or doc['segment_s']))}")


def segment_line(doc: Mapping[str, Any], number: int) -> str:
    """The line printed as segment ``number`` (0-based) finishes: what it saw, where the bisect stands."""
    seg = doc["segments"][number]
    hangs = seg["hangs"]
    saw = f"{hangs} hang{'' if hangs == 1 else 's'}" if hangs else "clean"
    return printable(f"segment {number + 1}: {seg['label']} {span(seg['exposure_s'])} at risk, {saw} | "
                     f"{sentence(doc)}")


def _chart(doc: Mapping[str, Any]) -> str:
    builds = doc.get("builds") or []
    rows = [list(doc["model"]["prior"])] + [list(s["posterior"]) for s in doc["segments"]]
    width, height, left, right, top, bottom = 760, 280, 48, 120, 16, 36
    n = max(len(rows) - 1, 1)
    x = lambda i: left + (width - left - right) * i / n  # two one-line scales
    y = lambda p: top + (height - top - bottom) * (1 - p)
    parts = [f'<svg id="posterior-chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
             f'role="img" aria-label="posterior of each build being the first bad one, after every segment">']
    for p in (0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(p):.1f}" y2="{y(p):.1f}" stroke="#ddd"/>'
                     f'<text x="{left - 6}" y="{y(p) + 4:.1f}" text-anchor="end" font-size="11">{p:g}</text>')
    stop = float(doc["threshold"])
    parts.append(f'<line class="stop-at" x1="{left}" x2="{width - right}" y1="{y(stop):.1f}" y2="{y(stop):.1f}" '
                 f'stroke="#444" stroke-dasharray="5,4"/><text x="{left + 6}" y="{y(stop) - 4:.1f}" '
                 f'font-size="11" fill="#444">stop at {stop:g}</text>')
    for i in range(len(rows)):
        if n <= 20 or i % max(1, n // 10) == 0:
            parts.append(f'<text x="{x(i):.1f}" y="{height - bottom + 16}" text-anchor="middle" '
                         f'font-size="11">{i}</text>')
    parts.append(f'<text x="{(left + width - right) / 2:.0f}" y="{height - 4}" text-anchor="middle" '
                 f'font-size="11">segments (0: the prior)</text>')
    for k, build in enumerate(builds):
        color = COLORS[k % len(COLORS)]
        label = html.escape(str(build.get("label", k)))
        points = " ".join(f"{x(i):.1f},{y(row[k]):.1f}" for i, row in enumerate(rows) if k < len(row))
        parts.append(f'<polyline class="build-line" data-build="{label}" points="{points}" fill="none" '
                     f'stroke="{color}" stroke-width="2"><title>{label}</title></polyline>')
        for i, seg in enumerate(doc["segments"], start=1):
            if seg["build"] == k:  # the build soaked in this segment: a dot on its line, filled if it hung
                fill = color if seg["hangs"] else "#fff"
                parts.append(f'<circle cx="{x(i):.1f}" cy="{y(rows[i][k]):.1f}" r="3.5" fill="{fill}" '
                             f'stroke="{color}"><title>segment {i}: {label}, {seg["hangs"]} hangs</title></circle>')
        parts.append(f'<text x="{width - right + 8}" y="{top + 16 * k + 30}" font-size="12" fill="{color}">'
                     f'&#9632; {label}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _builds_table(doc: Mapping[str, Any]) -> str:
    post = doc["now"]["posterior"]
    rows = []
    for k, build in enumerate(doc.get("builds") or []):
        segs = sum(1 for s in doc["segments"] if s["build"] == k)
        best = ' class="best"' if k == post["best"] else ""
        rows.append(f"<tr{best}><td>{html.escape(str(build.get('label', k)))}</td><td>{post['first_bad'][k]:.3f}</td>"
                    f"<td>{segs}</td><td>{span(post['exposure_s'][k])}</td><td>{post['hangs'][k]}</td></tr>")
    return ('<table id="builds"><thead><tr><th>build (oldest first)</th><th>P(first bad)</th><th>segments</th>'
            f'<th>time at risk</th><th>hangs</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')


def _segments_table(doc: Mapping[str, Any], reports: Sequence[str | None]) -> str:
    rows = []
    for i, seg in enumerate(doc["segments"]):
        link = reports[i] if i < len(reports) else None
        report = (f'<a href="{html.escape(link, quote=True)}">report</a>' if link else "no report")
        post = seg["posterior"]
        lead = max(range(len(post)), key=lambda k: post[k]) if post else 0
        rows.append(f"<tr><td>{i + 1}</td><td>{html.escape(str(seg['label']))}</td><td>{span(seg['exposure_s'])}</td>"
                    f"<td>{seg['hangs']}</td><td>{html.escape(str(seg['ended_by']))}</td>"
                    f"<td>{html.escape(_label(doc, lead))} {post[lead]:.2f}</td><td>{report}</td></tr>")
    return ('<table id="segments"><thead><tr><th>#</th><th>build</th><th>time at risk</th><th>hangs</th>'
            '<th>ended by</th><th>most likely after it</th><th>run</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _why(doc: Mapping[str, Any]) -> list[str]:
    """The evidence behind the sentence, by label: the leading build's margin, and
    why the next segment soaks the build it does."""
    now = doc["now"]
    post = now["posterior"]
    out = ["P(first bad) per build: " + ", ".join(f"{_label(doc, k)} {p:.3f}" for k, p in enumerate(post["first_bad"]))]
    nxt = now.get("next")
    if nxt is not None and now["state"] == "searching":
        k = nxt["build"]
        out.append(f"next: {_label(doc, k)}, whose segment is expected to teach the most "
                   f"({nxt['gain_bits'][k]:.2f} bits about the first bad build)")
    return out


def render_html(doc: Mapping[str, Any], *, reports: Sequence[str | None] = (), title: str = "bisect") -> str:
    """The page. ``reports``: per segment, the link to its report.html relative to
    the page (None: the segment has none yet)."""
    now = doc["now"]
    state = "found" if now["state"] == "found" else ("searching" if now["state"] == "searching" and
                                                     doc.get("stopped_by") != "segment bound" else "undecided")
    model = doc["model"]
    budget = doc.get("budget_s")
    assumptions = (f"segments of {span(doc['segment_s'])} of time at risk, each ended at its first hang; stop at "
                   f"posterior {doc['threshold']:g}{'' if budget is None else f' or {span(budget)} at risk'}; "
                   f"both MTBFs log-uniform on {span(model['mtbf_min_s'])} to {span(model['mtbf_max_s'])}, "
                   f"the bad rate {model['min_ratio']:g} to {'any' if model['max_ratio'] is None else format(model['max_ratio'], 'g')} "
                   f"times the good one; "
                   f"posterior MTBFs now: good ~{span(now['posterior']['good_mtbf_s'])}, "
                   f"bad ~{span(now['posterior']['bad_mtbf_s'])}")
    reasons = "".join(f"<li>{html.escape(r)}</li>" for r in _why(doc))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}: which build broke it?</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 1000px; }}
#sentence {{ font-size: 1.25em; padding: .6em .8em; border-radius: 6px; }}
#sentence.found {{ background: #e6f4ea; }} #sentence.searching {{ background: #fff8e1; }}
#sentence.undecided {{ background: #fdecea; }}
table {{ border-collapse: collapse; margin: .5em 0 1.5em; }}
th, td {{ border-bottom: 1px solid #ddd; padding: .25em .7em; text-align: left; }}
tr.best td {{ font-weight: bold; }} .small {{ color: #666; font-size: .9em; }}
</style></head><body>
<h1>{html.escape(title)}: which build broke it?</h1>
<p id="sentence" class="{state}">{html.escape(sentence(doc))}</p>
<ul class="small">{reasons}</ul>
<h2>Posterior of each build being the first bad one</h2>
{_chart(doc)}
<p class="small">A dot marks the build a segment soaked: filled, it hung; open, it ran its segment clean.</p>
<p class="small">{html.escape(assumptions)}</p>
<h2>Builds</h2>
{_builds_table(doc)}
<h2>Segments</h2>
{_segments_table(doc, reports)}
</body></html>
"""
