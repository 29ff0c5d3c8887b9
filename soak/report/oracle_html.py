"""The oracle in report.html: the corruption card, the canary strip, the canaries' figures.

Pure: records of ``soak.report.oracle`` in, markup out; every string from the
run directory is escaped here. The markup says what it shows for a reader that
is not a person: the card is ``div.corruption``; each side's tokens are
``span.tok`` (``same`` before the first difference, ``diff`` at it, ``after``
past it) in ``div.tokens[data-side=reference|answer]``, the first difference
carries ``data-position``; the strip is ``svg.canaries`` with one
``rect.canary.<verdict>`` a canary (``data-t``: seconds from the run's start)
and one ``g.incident.<kind>`` an incident (``data-onset-t``, ``data-detected-t``),
canaries and incidents on one time axis.
"""

from __future__ import annotations

import html
import math
from typing import Any, Sequence

from soak.oracle.answer import Answer
from soak.printable import printable
from soak.report.oracle import BAD, CanaryMark, CanaryTally, Corruption, corruption_sentence
from soak.summary_file import IncidentEntry

CSS = """
.corruption{background:#fff;border:1px solid #e1e4e8;border-left:5px solid #6a1b9a;padding:10px 16px;margin:14px 0}
.corruption .sides{display:grid;grid-template-columns:1fr 1fr;gap:0 16px}
.tokens{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px;line-height:1.9;background:#f6f8fa;
border:1px solid #e1e4e8;padding:6px 8px;word-break:break-all}
.tok{white-space:pre-wrap;border-right:1px dotted #c8ccd2;padding:0 1px}
.tok.diff{background:#c62828;color:#fff;font-weight:700;border-radius:2px;padding:1px 3px}
.tok.after{color:#8a8f98} .tok.gap{color:#8a8f98;font-style:italic;border:0}
.corruption td.chosen{font-weight:700} .corruption tr.reference td{background:#e8f5e9}
.verdict-reason{font-size:14px;margin:8px 0;padding:8px 12px;background:#f3e5f5;border-radius:3px}
svg.canaries{display:block;background:#fff;border:1px solid #e1e4e8;margin:8px 0}
svg.canaries text{font:11px system-ui,sans-serif;fill:#444}
.stat.canaries{border-left-color:#6a1b9a}
"""

# Tokens shown either side of the first difference (a 4,096-token answer is not drawn whole).
BEFORE, AFTER = 24, 24
_COLOURS = {"match": "#2e7d32", "explained": "#f9a825", "reference": "#90a4ae", "unjudged": "#cfd8dc",
            "corrupt": "#c62828", "crosstalk": "#6a1b9a"}
_KIND_COLOURS = {"corruption": "#6a1b9a", "hang": "#c62828"}


def _e(value: Any) -> str:
    """Escaped, and no control or bidi-override character (a server's bytes never rewrite the page's text)."""
    return html.escape(printable(str(value)), quote=True)


def _shown(token: str) -> str:
    """A token as text a person can see: a newline and a tab drawn, other controls as their code."""
    out = []
    for ch in token:
        if ch == "\n":
            out.append("\u21b5")
        elif ch == "\t":
            out.append("\u21e5")
        elif not ch.isprintable() and ch != " ":
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out) or "\u2205"


def _lp(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def token_run(answer: Answer, position: int | None, side: str, *, offset: int = 0) -> str:
    """One side's tokens around the first difference, marked; ``offset``: the position of
    ``answer.tokens[0]`` (the evidence may keep only a window of the answer)."""
    tokens = answer.tokens
    if not tokens:
        text = answer.text or "(no tokens)"
        return f"<div class='tokens' data-side='{side}'><span class='tok gap'>{_e(_shown(text[:400]))}</span></div>"
    at = (position if position is not None else offset + len(tokens)) - offset
    lo, hi = min(max(0, at - BEFORE), len(tokens)), min(len(tokens), max(at, 0) + AFTER + 1)
    out = [f"<div class='tokens' data-side='{side}'>"]
    if lo + offset:
        out.append(f"<span class='tok gap'>… {lo + offset} tokens … </span>")
    for i in range(lo, hi):
        cls = "same" if i < at else "diff" if i == at else "after"
        extra = f" data-position='{i + offset}'" if i == at else ""
        out.append(f"<span class='tok {cls}'{extra} title='position {i + offset}, logprob "
                   f"{_e(_lp(tokens[i].logprob))}'>{_e(_shown(tokens[i].token))}</span>")
    if position is not None and at >= len(tokens):
        out.append(f"<span class='tok diff' data-position='{position}'>(ended)</span>")
    if hi < len(tokens):
        out.append(f"<span class='tok gap'> … {len(tokens) - hi} more</span>")
    out.append("</div>")
    return "".join(out)


def logprob_table(c: Corruption, *, tie_margin: float) -> str:
    """The position's logprobs: the answer's chosen token, its alternatives, the reference token's, the gap."""
    position = c.position
    chosen, ref_choice = c.at("answer", position), c.at("reference", position)
    j = c.judgement
    ref_token = j.reference_token if j.reference_token is not None else (ref_choice.token if ref_choice else None)
    ans_token = j.answer_token if j.answer_token is not None else (chosen.token if chosen else None)
    alternatives = list(j.alternatives or (chosen.top if chosen else ()))
    rows = []
    seen = set()
    if ans_token is not None:
        lp = chosen.logprob if chosen is not None else dict(alternatives).get(ans_token)
        rows.append(("chosen", ans_token, lp, "the answer's token"))
        seen.add(ans_token)
    for tok, lp in alternatives:
        if tok in seen:
            continue
        seen.add(tok)
        rows.append(("reference" if tok == ref_token else "", tok, lp,
                     "the reference's token" if tok == ref_token else "alternative"))
    ref_listed = ref_token is not None and any(t == ref_token for t, _ in alternatives)
    gap = j.gap
    if gap is None and ref_listed and chosen is not None and chosen.logprob is not None:
        gap = chosen.logprob - dict(alternatives)[ref_token]
    body = ["<table class='logprobs'><tr><th>token</th><th>logprob</th><th></th></tr>"]
    for cls, tok, lp, what in rows:
        cell = " class='chosen'" if cls == "chosen" else ""
        body.append(f"<tr class='{cls}'><td{cell}><code>{_e(_shown(tok))}</code></td>"
                    f"<td class='num'>{_e(_lp(lp))}</td><td>{_e(what)}</td></tr>")
    body.append("</table>")
    if ref_token is None:
        said = "The reference has no token at this position."
    elif not ref_listed:
        said = (f"The reference's token {_e(repr(ref_token))} is not among the alternatives the server listed "
                "here: nothing in its logprobs makes it a near tie.")
    else:
        said = f"The reference's token {_e(repr(ref_token))} is listed."
    if gap is not None:
        tie = "within" if gap <= tie_margin else "beyond"
        said += (f" Gap <b class='gap'>{gap:.4g} nats</b>, {tie} the tie margin of {tie_margin:g} nats"
                 + (": a near tie would explain it." if gap <= tie_margin else ": not a near tie."))
    return "".join(body) + f"<p class='gap-said'>{said}</p>"


def _server_html(c: Corruption) -> str:
    s = c.server
    contexts = s.contexts
    ctx = "none recorded" if not contexts else (
        f"{len(contexts)} in the batch, largest {max(contexts):,} tokens: "
        + ", ".join(f"{n:,}" for n in contexts[:16]) + (" …" if len(contexts) > 16 else ""))
    kv = "—" if s.kv_cache_usage is None else f"{s.kv_cache_usage * 100:.1f}%" if s.kv_cache_usage <= 1 \
        else f"{s.kv_cache_usage:.4g}"

    def n(v: float | None) -> str:
        return "—" if v is None else f"{v:g}"

    rows = [("running requests", n(s.running)), ("waiting requests", n(s.waiting)), ("KV cache in use", kv),
            ("requests in flight (client)", n(s.in_flight)), ("contexts in the batch", ctx)]
    if s.stream_tokens:
        rows.append(("tokens received so far, per stream in flight",
                     ", ".join(f"{t:,}" for t in s.stream_tokens[:16]) + (" …" if len(s.stream_tokens) > 16 else "")))
    return ("<table class='server'>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
            + "</table>")


def corruption_card(c: Corruption, *, tie_margin: float, start: float) -> str:
    """One corruption: the sentence, the reason, the two token runs side by side, the logprobs, the server."""
    j = c.judgement
    position = c.position
    head = f"Corruption: canary {_e(c.canary_id or '?')}" + (f" (incident {_e(c.number)})" if c.number else "")
    out = [f"<div class='corruption' data-canary='{_e(c.canary_id or '')}'><h3>{head}</h3>",
           f"<p class='sentence'>{_e(corruption_sentence(c))}</p>"]
    if c.unreadable:
        out.append(f"<p class='muted'>{_e(c.unreadable)}</p>")
    if j.crosstalk_with:
        out.append(f"<p class='crosstalk'>Cross-talk: this is another canary's answer: <b>{_e(j.crosstalk_with)}</b>. "
                   "Another request's tokens reached this one.</p>")
    if j.reason:
        out.append(f"<div class='verdict-reason'>Verdict {_e(j.verdict or 'corrupt')}: {_e(j.reason)}</div>")
    source = {"run": "this run's first answer", "file": "the reference file (a known-good build)"}.get(
        c.reference_source or "", c.reference_source or "unknown")
    where = "—" if position is None else str(position)
    out.append(f"<p class='muted'>Reference: {_e(source)}. First difference at position {_e(where)}"
               + (f", onset between {_rel(c.onset_earliest, start)} and {_rel(c.onset_latest, start)}"
                  if c.onset_earliest is not None and c.onset_latest is not None else "") + ".</p>")
    out.append("<div class='sides'><div><h4>Reference</h4>"
               + token_run(c.reference, position, "reference", offset=c.reference_from)
               + _meta(c.reference) + "</div><div><h4>Answer</h4>"
               + token_run(c.answer, position, "answer", offset=c.answer_from) + _meta(c.answer) + "</div></div>")
    out.append("<h4>Logprobs at the first difference</h4>" + logprob_table(c, tie_margin=tie_margin))
    out.append("<h4>What the server was doing</h4>" + _server_html(c))
    out.append(f"<p class='muted'>evidence <code>{_e(c.evidence)}/corruption.json</code></p></div>")
    return "".join(out)


def _meta(a: Answer) -> str:
    bits = [f"{len(a.tokens)} tokens", f"finish {a.finish_reason or '?'}"]
    if a.model:
        bits.append(f"model {a.model}")
    if a.malformed:
        bits.append(f"malformed: {a.malformed}")
    return f"<p class='muted'>{_e(', '.join(bits))}</p>"


def _rel(ts: float | None, start: float) -> str:
    if ts is None:
        return "?"
    secs = ts - start
    sign, secs = ("-" if secs < 0 else "+"), abs(secs)
    return f"{sign}{int(secs // 3600)}:{int(secs % 3600 // 60):02d}:{int(secs % 60):02d}"


def figures_html(t: CanaryTally, *, max_share: float | None) -> str:
    rate = "" if t.pass_rate is None else f"; pass rate {t.pass_rate * 100:.2f}%"
    return (f"<div class='stat canaries'>Canaries (the correctness oracle): {_e(t.sentence(max_share=max_share))}"
            f"{_e(rate)}.</div>")


WIDTH, LEFT, RIGHT = 1000, 90, 20
CANARY_Y, INCIDENT_Y, HEIGHT = 22, 58, 104


def strip_svg(marks: Sequence[CanaryMark], incidents: Sequence[IncidentEntry], *, start: float,
              end: float | None) -> str:
    """Canaries (one tick a canary, coloured by verdict) and every incident (its onset interval, its
    detection) on one time axis: a corruption before a hang reads left of it."""
    times = [m.ts for m in marks] + [t for i in incidents for t in (i.onset_at, i.detected_at) if t is not None]
    last = max([*(t for t in times if math.isfinite(t)), end or start], default=start)
    span = max(last - start, 1.0)

    def x(ts: float) -> float:
        return round(LEFT + (min(max(ts - start, 0.0), span) / span) * (WIDTH - LEFT - RIGHT), 1)

    out = [f"<svg xmlns='http://www.w3.org/2000/svg' class='canaries' viewBox='0 0 {WIDTH} {HEIGHT}' "
           f"width='{WIDTH}' height='{HEIGHT}' data-span-s='{span:.1f}'>",
           f"<text x='{LEFT - 8}' y='{CANARY_Y + 12}' text-anchor='end'>canaries</text>",
           f"<text x='{LEFT - 8}' y='{INCIDENT_Y + 12}' text-anchor='end'>incidents</text>",
           f"<line x1='{LEFT}' x2='{WIDTH - RIGHT}' y1='{HEIGHT - 22}' y2='{HEIGHT - 22}' stroke='#888'/>"]
    minutes = span / 60
    step = next((s for s in (1, 2, 5, 10, 15, 30, 60, 120, 240) if minutes / s <= 10), 480)
    tick = 0
    while tick <= minutes + 1e-9:
        tx = x(start + tick * 60)
        out.append(f"<line x1='{tx}' x2='{tx}' y1='{HEIGHT - 22}' y2='{HEIGHT - 18}' stroke='#888'/>"
                   f"<text x='{tx}' y='{HEIGHT - 6}' text-anchor='middle'>{tick:g} min</text>")
        tick += step
    for m in sorted(marks, key=lambda m: m.bad):  # the bad ones drawn last, on top
        height = 18 if m.bad else 12
        title = f"{m.canary_id}: {m.verdict}" + (f" at position {m.position}" if m.position is not None else "") + \
            (f" (another canary's answer: {m.crosstalk_with})" if m.crosstalk_with else "")
        out.append(f"<rect class='canary {m.verdict}' data-t='{m.ts - start:.1f}' x='{x(m.ts) - (1.5 if m.bad else 0.5)}' "
                   f"y='{CANARY_Y + (0 if m.bad else 3)}' width='{3 if m.bad else 1.2}' height='{height}' "
                   f"fill='{_COLOURS.get(m.verdict, '#999')}'><title>{_e(title)}</title></rect>")
    for i in incidents:
        kind = i.kind or "incident"
        colour = _KIND_COLOURS.get(kind, "#c62828")
        onset = i.onset_at if i.onset_at is not None else i.detected_at
        if onset is None:
            continue
        early, late = i.onset_earliest_at, i.onset_latest_at
        attrs = f"data-onset-t='{onset - start:.1f}'" + (
            f" data-detected-t='{i.detected_at - start:.1f}'" if i.detected_at is not None else "")
        out.append(f"<g class='incident {_e(kind)}' {attrs}>")
        if early is not None and late is not None and late >= early:
            out.append(f"<rect class='onset-interval' x='{x(early)}' y='{INCIDENT_Y}' "
                       f"width='{max(x(late) - x(early), 1.0)}' height='18' fill='{colour}' opacity='0.25'/>")
        out.append(f"<line class='onset' x1='{x(onset)}' x2='{x(onset)}' y1='{CANARY_Y - 4}' y2='{INCIDENT_Y + 18}' "
                   f"stroke='{colour}' stroke-dasharray='4 3'/>")
        if i.detected_at is not None:
            out.append(f"<line class='detected' x1='{x(i.detected_at)}' x2='{x(i.detected_at)}' y1='{INCIDENT_Y}' "
                       f"y2='{INCIDENT_Y + 18}' stroke='{colour}' stroke-width='2'/>")
        out.append(f"<text x='{x(onset) + 3}' y='{INCIDENT_Y + 13}' fill='{colour}'>#{_e(i.number or '?')} "
                   f"{_e(kind)}</text></g>")
    out.append("</svg>")
    return "".join(out)


def strip_legend() -> str:
    swatches = "".join(f"<span style='color:{_COLOURS[v]}'>\u25a0</span> {w} "
                       for v, w in (("match", "matched"), ("explained", "explained (near tie)"),
                                    ("corrupt", "corrupt"), ("crosstalk", "cross-talk"),
                                    ("reference", "reference taken"), ("unjudged", "unjudged")))
    return (f"<p class='muted'>One tick a canary: {swatches}. Below, every incident on the same time line: "
            "dashed its onset, shaded the interval the evidence allows, solid its detection (a corruption in purple, "
            "a hang in red).</p>")


__all__ = ["BAD", "CSS", "corruption_card", "figures_html", "logprob_table", "strip_legend", "strip_svg", "token_run"]
