"""The block `soak run` prints at its end (k6's and AIPerf's end-of-test summary), pure.

``end_block(summary, exit_code=, files=, build=, colour=)`` renders summary.json
(the judge's serialized judgement) as plain lines: the headline word of the exit
status (soak.judge.ladder.headline: PASS, FAIL, UNDECIDED for exit 5, else the
verdict's) and why (each incident, failed criterion and breached threshold, with
its observed value; for exit 5, what would decide the sequential test), the
stop reason as a neutral line, the requests, each incident with its detection
latency as the interval its onset allows, the MTBF sentence, TTFT/TPOT/ITL
p50/p90/p95/p99, every threshold with ✓/✗ and its observed value (also when all
hold), the report and summary paths, and one last line a nightly log greps.
Colour (ANSI) only where the caller says the stream is a terminal. Every string
from the run directory is shown with its control bytes replaced.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from soak.durations import format_latency
from soak.judge.ladder import UNDECIDED_EXIT, headline
from soak.judge.reasons import threshold_text, value_text
from soak.onset import latency_span, restated
from soak.printable import printable
from soak.records import Verdict
from soak.report.oracle import OracleView, corruption_sentence
from soak.summary_file import IncidentEntry, RunSummary

# What each exit status of CONTRACTS.md means, in the verdict line.
EXIT_MEANINGS = {
    0: "no incident, every threshold held",
    1: "an incident or a failed criterion",
    2: "bad config, workload or arguments",
    3: "the target or the environment stopped the run",
    4: "the harness itself failed",
    5: "the sequential test (prove:) ended undecided: soak more",
    99: "a threshold breached",
    130: "interrupted by the operator",
}
# The load generator's own stop reasons, in words.
STOP_WORDS = {"duration": "duration: the planned load time ran out",
              "workload exhausted": "workload exhausted: the trace or sessions ran out"}
# summary.json's latency key, the row's name (ITL: each request's median gap, over requests)
LATENCY_ROWS = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_p50_s", "ITL"))
QUANTILES = ("p50", "p90", "p95", "p99")
_GREEN, _RED, _YELLOW, _CYAN, _BOLD, _RESET = "\x1b[32m", "\x1b[31m", "\x1b[33m", "\x1b[36m", "\x1b[1m", "\x1b[0m"
# By headline word; UNDECIDED (exit 5) is neither green nor red: "soak more" (Grafana's blue)
_HEADLINE_COLOURS = {"PASS": _GREEN, "FAIL": _RED, "ABORTED": _YELLOW, "UNDECIDED": _CYAN}


def clean(text: Any) -> str:
    """A string from a run directory, fit for a terminal: no control bytes (no escape sequences)."""
    return printable(str(text))


def _paint(text: str, code: str, colour: bool) -> str:
    return f"{code}{text}{_RESET}" if colour else text


def mtbf_sentence(summary: RunSummary, *, at_risk: tuple[int, float] | None = None,
                  confidence: float = 0.95) -> str:
    """The report's MTBF sentence. ``at_risk``: (hangs, exposure seconds) as the
    report and soak history count them (soak.exposure.at_risk, issue 35's one
    MTBF); None: the summary's hangs over its loaded time (duration_s)."""
    hangs, exposure = at_risk if at_risk is not None else summary.at_risk or (summary.hangs, summary.duration_s)
    if exposure is None or exposure <= 0:
        loaded = summary.duration_s
        if loaded is not None and loaded > 0:
            # load ran, yet no time is at risk: say which of the time-at-risk rules left none
            return ("no MTBF: none of the load's time is known clean (no request finished with generated "
                    "tokens, or the run ended within the detection horizon a hang needs to be found)")
        return "no MTBF: no load was applied"
    failed = [r for r in summary.criteria.rows if r.failed] if summary.criteria is not None else []
    if failed and not hangs:
        # as the report says: hang-free time of a server failing its requests proves nothing about hangs
        return "no MTBF: the server failed its requests, so hang-free time proves nothing"
    from soak.report.stats import mtbf_estimate

    return mtbf_estimate(hangs, exposure, confidence=confidence).sentence()


def _latency_lines(latency: Mapping[str, Mapping[str, float]]) -> list[str]:
    width = 10
    lines = ["latency  " + "".join(q.rjust(width) for q in QUANTILES)]
    for key, name in LATENCY_ROWS:
        stats = latency.get(key) or {}
        lines.append(f"  {name:<7}" + "".join(format_latency(stats.get(q)).rjust(width) for q in QUANTILES))
    return lines


def _threshold_lines(summary: RunSummary, colour: bool) -> list[str]:
    entry = summary.thresholds
    if entry is None:
        return ["thresholds  none configured"]
    if entry.error is not None:
        return [f"thresholds  {_paint('✗', _RED, colour)} not judged: {clean(entry.error)}"]
    held = sum(1 for r in entry.results if r.get("passed") is True)
    lines = [f"thresholds  {held} of {len(entry.results)} held"]
    for row in entry.results:
        ok = row.get("passed") is True
        mark = _paint("✓", _GREEN, colour) if ok else _paint("✗", _RED, colour)
        name = clean(row.get("name") or row.get("metric") or "?")
        observed = value_text(str(row.get("metric")), row.get("observed")) \
            if isinstance(row.get("observed"), (int, float)) and not isinstance(row.get("observed"), bool) else "no data"
        lines.append(f"  {mark} {name:<34} observed {clean(observed)}")
    if entry.aborted_by:
        lines.append(f"  stopped the load: {clean(entry.aborted_by.get('reason') or entry.aborted_by.get('threshold'))}")
    return lines


def _offset(at: float | None, start: float | None) -> str:
    if at is None or start is None:
        return "?"
    seconds = max(0, round(at - start))
    return f"+{seconds // 60}:{seconds % 60:02d}"


def _incident_lines(summary: RunSummary) -> list[str]:
    lines = []
    for i in summary.incidents:
        head = f"{i.kind or '?'} ({i.rule or '?'})"
        what = f"{clean(head)} at {_offset(i.onset_at, summary.started_at)}"
        said = (i.summary or "").removeprefix(head + ": ")  # the incident line opens with the same words
        # the responder's one figure said as the interval the onset allows (issue 37)
        latency = i.detection_latency
        if said:
            tail = f": {clean(restated(said, latency))}"
        else:
            tail = f", detected {_offset(i.detected_at, summary.started_at)}" \
                + (f", {latency_span(latency)}" if latency is not None else "")
        lines.append(("incidents   " if not lines else "            ") + f"{i.number or '?'}. {what}{tail}")
    return lines


_KIND_WORDS = {"hang": ("hang", "hangs"), "crash": ("crash", "crashes"), "server_gone": ("lost server", "lost servers"),
               "corruption": ("corruption", "corruptions")}
_TIMES = {1: "once", 2: "twice"}


def _incidents_said(summary: RunSummary) -> list[str]:
    """The incidents as the report's banner says them: "2 hangs (pp_tail_stall) at
    +2:28 and +5:03; the server restarted twice"."""
    by_kind: dict[str, list[IncidentEntry]] = {}
    for i in summary.incidents:
        by_kind.setdefault(i.kind or "incident", []).append(i)
    said = []
    for kind, items in by_kind.items():
        one, many = _KIND_WORDS.get(kind, (kind, kind + "s"))
        rules = ", ".join(dict.fromkeys(i.rule or "?" for i in items))
        times = [_offset(i.onset_at, summary.started_at) for i in items]
        at = times[0] if len(times) == 1 else ", ".join(times[:-1]) + " and " + times[-1]
        said.append(f"{len(items)} {one if len(items) == 1 else many} ({rules}) at {at}")
    restarts = summary.restarts or 0
    if said and restarts:
        said[-1] += f"; the server restarted {_TIMES.get(restarts, f'{restarts} times')}"
    return [clean(text) for text in said]


def _why(summary: RunSummary, verdict: Verdict | None, exit_code: int) -> list[str]:
    grouped = _incidents_said(summary)
    # verdict_reasons says each incident by number; the block says them together, with their times
    reasons = grouped + [clean(r) for r in summary.verdict_reasons
                         if not (grouped and r.startswith("incident ") and ": " in r)]
    undecided = _undecided_reason(summary) if exit_code == UNDECIDED_EXIT else None
    if undecided is not None and undecided not in reasons:
        reasons.append(undecided)  # exit 5's why is what would decide it: always said
    if not reasons and verdict is not Verdict.PASS:
        # a summary written before every failure had its reasons: say the breaches it recorded
        rows = summary.thresholds.results if summary.thresholds is not None else ()
        reasons = [clean(threshold_text(r)) for r in rows if r.get("passed") is False]
        reasons = reasons or [clean(summary.stop_reason or "no reason recorded")]
    return reasons


# The proof line's word for each decision (soak.prove.sprt.ProofState values).
PROOF_WORDS = {"accepted": "fixed", "rejected": "not fixed", "undecided": "undecided", "truncated": "undecided"}


def proof_line(summary: RunSummary) -> str | None:
    """The sequential test's line ("proof  fixed: fixed (α 5%, β 5%) after 65.4 clean
    minutes"), None for a run without ``prove:``."""
    proof = summary.proof
    if proof is None:
        return None
    sentence = proof.get("sentence") if isinstance(proof.get("sentence"), str) else proof.get("note")
    word = PROOF_WORDS.get(str(proof.get("decision")), "not decided")
    return f"proof       {word}: {clean(sentence or 'no sentence recorded')}"


def _undecided_reason(summary: RunSummary) -> str | None:
    """Exit 5's reason as the judge words it ("proof: 65 more clean minutes to accept; 2 hangs
    before minute 37 reject"): how much more clean time would decide it."""
    proof = summary.proof or {}
    sentence = proof.get("sentence") if isinstance(proof.get("sentence"), str) else proof.get("note")
    return clean(f"proof: {sentence}") if isinstance(sentence, str) and sentence else None


def _meaning(summary: RunSummary, exit_code: int) -> str:
    if summary.proof is not None and exit_code == 0:
        return "the sequential test accepted: fixed"
    if summary.proof is not None and exit_code == 1 and summary.proof.get("decision") == "rejected":
        return "the sequential test rejected: not fixed"
    return EXIT_MEANINGS.get(exit_code, "see CONTRACTS.md")


def oracle_lines(oracle: OracleView | None) -> list[str]:
    """The correctness oracle's lines: each corruption in one sentence with its evidence, then the
    canaries counted (judged, matched, explained, corrupt) and their measured share of server time."""
    if oracle is None:
        return []
    lines = [f"corruption  {clean(corruption_sentence(c))}; evidence {clean(c.evidence)}/" for c in oracle.corruptions]
    if oracle.tally.total:
        lines.append(f"canaries    {clean(oracle.tally.sentence())}")
    return lines


def end_block(summary: RunSummary, *, exit_code: int, files: Sequence[str], build: str | None = None,
              at_risk: tuple[int, float] | None = None, colour: bool = False,
              oracle: OracleView | None = None) -> str:
    """The end of a run in plain lines (ANSI colour only with ``colour``). ``oracle``: the run's
    canaries and corruptions (``soak.report.oracle.read_oracle(run_dir)``), None for a run without."""
    verdict = summary.verdict
    # the word matches the exit status a nightly sees: exit 5 reads UNDECIDED, never PASS
    shown = headline(exit_code, verdict)
    head = _paint(shown, _BOLD + _HEADLINE_COLOURS[shown], colour) if shown in _HEADLINE_COLOURS else shown
    run = clean(summary.run_id or "")
    lines = [f"soak run {run}" + (f" (build {clean(build)})" if build else "") + ":",
             f"verdict     {head}, exit {exit_code} ({_meaning(summary, exit_code)})"]
    reasons = _why(summary, verdict, exit_code) if verdict is not Verdict.PASS or exit_code != 0 else []
    for i, reason in enumerate(reasons):
        lines.append(("why         " if i == 0 else "            ") + reason)
    stopped = summary.stopped_by or summary.stop_reason
    if stopped:
        lines.append(f"stopped     {clean(STOP_WORDS.get(stopped, stopped))}")
    req = summary.requests
    cut = f" cut {req.cut}" if req.cut else ""
    loaded = f"{summary.duration_s:.0f} s of load; " if summary.duration_s is not None else ""
    lines.append(f"requests    {loaded}ok {req.ok or 0} failed {req.failed or 0}{cut}; incidents "
                 f"{len(summary.incidents)}; restarts {summary.restarts or 0}")
    lines += _incident_lines(summary)
    lines += oracle_lines(oracle)
    lines.append(f"MTBF        {mtbf_sentence(summary, at_risk=at_risk)}")
    proof = proof_line(summary)
    if proof is not None:
        lines.append(proof)
    lines += _latency_lines(summary.latency)
    lines += _threshold_lines(summary, colour)
    for path in files:
        name = "report" if str(path).endswith(".html") else "summary"
        lines.append(f"{name:<12}{clean(path)}")
    last = f"soak run: {shown.lower()}" + (f" ({'; '.join(reasons)})" if reasons else "")
    if files:
        last += f"; {clean(files[0])}"
    return "\n".join([*lines, last]) + "\n"


__all__ = ["EXIT_MEANINGS", "clean", "end_block", "format_latency", "mtbf_sentence", "oracle_lines", "proof_line"]
