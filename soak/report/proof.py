"""The sequential test's section of report.html and history.html (issue 36),
pure: summary.json's ``proof`` (or a path and a plan) in, markup out.

The plot is the test as MIL-HDBK-781A draws it: hangs over exposure, the
accept line r = a + b t below (crossed in clean time: "fixed") and the reject
line r = c + b t above (reached at a hang: "not fixed"), the truncation where
there is one, and the run's own walk, a staircase that steps up one at each
hang. Inline SVG, so the page needs no script and the test reads the drawing
from the DOM. Every string is escaped; every number is checked finite.
"""

from __future__ import annotations

import html
import math
from typing import Any, Mapping, Sequence

from soak.prove.sprt import Plan, plan

W, H = 640, 300  # the plot's size in px
PAD_L, PAD_R, PAD_T, PAD_B = 48, 16, 14, 36
_T_CAP = 1e300  # seconds: the longest exposure drawn (x2 of it still a float)
_COLOURS = {"accepted": "#1e7d32", "rejected": "#c62828", "undecided": "#1565c0", "truncated": "#9a6700"}


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def plan_from(recorded: Mapping[str, Any] | None) -> Plan | None:
    """The plan summary.json (or a history page) recorded; None where it is not one."""
    if not isinstance(recorded, Mapping):
        return None
    try:  # sprt.plan checks every field (types, bounds): a hand-edited number is no plan, never a crash
        return plan(broken_mtbf_s=recorded["broken_mtbf_s"], target_mtbf_s=recorded["target_mtbf_s"],
                    alpha=recorded["alpha"], beta=recorded["beta"], max_exposure_s=recorded.get("max_exposure_s"),
                    max_hangs=recorded.get("max_hangs"))
    except (KeyError, TypeError, ValueError, ArithmeticError):
        return None


def walk_svg(p: Plan, *, hang_exposures_s: Sequence[float], exposure_s: float, decision: str,
             decided_at: tuple[float, int] | None = None, title: str = "the sequential test") -> str:
    """Hangs (y) over exposure in minutes (x): both lines, the truncation, the walk."""
    # any number a run directory holds (1e300 s of exposure) draws: the axis is bounded and so are its ticks
    marks = sorted(min(m, _T_CAP) for m in (_num(x) for x in hang_exposures_s) if m is not None and m >= 0)
    total = min(max(_num(exposure_s) or 0.0, marks[-1] if marks else 0.0), _T_CAP)
    hangs = len(marks)
    t_max = min(max(total, p.accept_at_s(hangs), p.max_exposure_s or 0.0) * 1.08, _T_CAP) or 1.0
    limit = hangs + 40  # a steep reject line leaves the plot, not the page
    r_max = min(max(hangs + 1, math.ceil(min(p.reject_intercept + p.slope * t_max, limit)), p.max_hangs or 0), limit)

    def x(t: float) -> float:
        return PAD_L + (W - PAD_L - PAD_R) * min(t, t_max) / t_max

    def y(r: float) -> float:
        return H - PAD_B - (H - PAD_T - PAD_B) * max(0.0, min(r, r_max)) / r_max

    def line(intercept: float, cls: str, colour: str, label: str) -> str:
        # r = intercept + b t, clipped to 0 <= r <= r_max
        t0 = max(0.0, -intercept / p.slope)
        t1 = min(t_max, (r_max - intercept) / p.slope)
        if t1 <= t0:
            return ""
        return (f"<line class='{cls}' x1='{x(t0):.1f}' y1='{y(intercept + p.slope * t0):.1f}' x2='{x(t1):.1f}' "
                f"y2='{y(intercept + p.slope * t1):.1f}' stroke='{colour}' stroke-width='2'><title>{_e(label)}</title>"
                "</line>")

    parts = [f"<svg class='proof' role='img' xmlns='http://www.w3.org/2000/svg' width='{W}' height='{H}' "
             f"viewBox='0 0 {W} {H}'><title>{_e(title)}</title>",
             f"<rect x='{PAD_L}' y='{PAD_T}' width='{W - PAD_L - PAD_R}' height='{H - PAD_T - PAD_B}' fill='#fff' "
             "stroke='#ccc'/>"]
    for r in range(r_max + 1):  # a gridline per hang count
        parts.append(f"<line x1='{PAD_L}' y1='{y(r):.1f}' x2='{W - PAD_R}' y2='{y(r):.1f}' stroke='#eee'/>"
                     f"<text x='{PAD_L - 6}' y='{y(r) + 4:.1f}' font-size='11' text-anchor='end'>{r}</text>")
    step = _tick_step(t_max / 60)
    for i in range(11):  # at most ten steps fit the span, so at most eleven ticks
        tick = i * step
        if tick * 60 > t_max:
            break
        parts.append(f"<text x='{x(tick * 60):.1f}' y='{H - PAD_B + 14}' font-size='11' text-anchor='middle'>"
                     f"{tick:g}</text>")
    parts.append(f"<text x='{(W + PAD_L) / 2:.0f}' y='{H - 6}' font-size='11' text-anchor='middle'>exposure "
                 "(minutes of loaded time at risk)</text>"
                 f"<text x='12' y='{(H - PAD_B) / 2:.0f}' font-size='11' transform='rotate(-90 12 {(H - PAD_B) / 2:.0f})' "
                 "text-anchor='middle'>hangs</text>")
    parts.append(line(p.accept_intercept, "accept-line", "#1e7d32",
                      f"accept line: fixed when the walk is on or below it ({p.accept_at_s(0) / 60:.1f} clean minutes)"))
    parts.append(line(p.reject_intercept, "reject-line", "#c62828",
                      "reject line: not fixed when a hang lands on or above it"))
    if p.max_exposure_s is not None:
        parts.append(f"<line class='truncation' x1='{x(p.max_exposure_s):.1f}' y1='{PAD_T}' "
                     f"x2='{x(p.max_exposure_s):.1f}' y2='{H - PAD_B}' stroke='#9a6700' stroke-dasharray='5 4'/>")
    if p.max_hangs is not None:
        parts.append(f"<line class='truncation' x1='{PAD_L}' y1='{y(p.max_hangs):.1f}' x2='{W - PAD_R}' "
                     f"y2='{y(p.max_hangs):.1f}' stroke='#9a6700' stroke-dasharray='5 4'/>")
    points, r = [(0.0, 0)], 0
    for m in marks:
        points += [(m, r), (m, r + 1)]
        r += 1
    points.append((total, r))
    colour = _COLOURS.get(decision, "#1565c0")
    parts.append(f"<polyline class='walk' fill='none' stroke='{colour}' stroke-width='3' points='"
                 + " ".join(f"{x(t):.1f},{y(h):.1f}" for t, h in points) + "'><title>this build's walk: "
                 f"{hangs} hang(s) in {total / 60:.1f} minutes</title></polyline>")
    if decided_at is not None and decision in ("accepted", "rejected", "truncated"):
        t, h = decided_at
        parts.append(f"<circle class='decided' cx='{x(t):.1f}' cy='{y(h):.1f}' r='5' fill='{colour}'>"
                     f"<title>{_e(decision)} here</title></circle>")
    parts.append("</svg>")
    return "".join(parts)


def _tick_step(span_min: float) -> float:
    """A round step that cuts the span into at most ten, whatever its size."""
    for step in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 240, 480, 960):
        if span_min / step <= 10:
            return float(step)
    power = 10.0 ** math.floor(math.log10(span_min / 10))
    return next(power * m for m in (1, 2, 5, 10) if span_min / (power * m) <= 10)


def proof_html(proof: Mapping[str, Any] | None) -> str:
    """report.html's proof section from summary.json's ``proof``; "" without one."""
    if not isinstance(proof, Mapping):
        return ""
    decision = str(proof.get("decision") or "")
    sentence = proof.get("sentence") if isinstance(proof.get("sentence"), str) else proof.get("note")
    out = ["<h2>Is this build fixed? (sequential test)</h2>",
           f"<div class='stat proof {_e(decision or 'unknown')}'>{_e(sentence or 'no sentence recorded')}</div>"]
    reasons = [r for r in proof.get("reasons") or [] if isinstance(r, str)][1:]
    if reasons:
        out.append("<p class='muted'>" + "<br>".join(_e(r) for r in reasons) + "</p>")
    p = plan_from(proof.get("plan"))
    path = proof.get("path") if isinstance(proof.get("path"), Mapping) else {}
    if p is not None:
        marks = [m for m in path.get("hang_exposures_s") or [] if _num(m) is not None]
        total = _num(path.get("exposure_s")) or _num(proof.get("exposure_s")) or 0.0
        at = (_num(proof.get("exposure_s")), proof.get("hangs"))
        decided = (at[0], at[1]) if at[0] is not None and type(at[1]) is int else None
        out.append(walk_svg(p, hang_exposures_s=marks, exposure_s=total, decision=decision, decided_at=decided))
        out.append("<p class='muted'>Green: the accept line (a walk that reaches it in clean time is fixed); red: "
                   "the reject line (a hang on or above it is not fixed); dashed: the truncation; the thick line is "
                   f"this run's walk. θ1 {p.broken_mtbf_s / 60:.4g} min broken, θ0 {p.target_mtbf_s / 60:.4g} min "
                   f"target, α {p.alpha:g}, β {p.beta:g} (docs/prove.md).</p>")
    return "".join(out)


__all__ = ["plan_from", "proof_html", "walk_svg"]
