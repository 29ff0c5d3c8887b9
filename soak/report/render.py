"""report.html and junit.xml from a run directory.

``build(run)`` computes everything the page shows (pure, from ``RunData``);
``soak.report.html.render_html`` turns it into one self-contained file (CSS
inline, plots as base64 PNG); ``write_report(run_dir)`` is the I/O edge
``soak report`` calls.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from soak.bounds import LIMITS, InputRejected, read_file
from soak.events import EventType
from soak.exposure import at_risk
from soak.fsio import write_atomic
from soak.jsonl import is_timestamp, read_json
from soak.percentiles import percentiles
from soak.flightrec import dumps as flight_recorder
from soak.report import watchdog, why
from soak.report.html import render_html
from soak.report import oracle, oracle_html
from soak.report.junit import build_junit, incident_line
from soak.report.rundir import Incident, RequestColumns, RunData, load_run, typed_incident
from soak.report.series import stage_columns
from soak.report.zoom import downtimes, incident_zooms
from soak.samples import GpuSource
from soak.report.stats import MtbfEstimate, mtbf_estimate
from soak.summary_file import IncidentEntry, RunSummary


@dataclass
class IncidentView:
    record: dict[str, Any]
    watchdog: list[watchdog.WatchdogLine]
    flight_recorder: flight_recorder.FlightRecorderSummary | None
    files: list[str]
    path: str
    zoom: str = ""  # the incident's own minute either side of the onset, inline SVG (soak.report.zoom)
    corruption: oracle.Corruption | None = None  # a corruption incident's evidence (incidents/N/corruption.json)


@dataclass
class ReportModel:
    name: str
    verdict: str
    cut_off: bool
    summary: RunSummary
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
    reasons: tuple[str, ...] = ()  # why the run failed (soak.report.why.verdict_reasons); empty on a pass
    pass_line: str = ""
    stop_line: str | None = None  # why the load stopped, a plain fact
    thresholds: tuple[why.ThresholdView, ...] = ()
    build_label: str | None = None
    canaries: oracle.CanaryTally = field(default_factory=oracle.CanaryTally)
    canary_strip: str = ""  # canaries and incidents on one time line, inline SVG (soak.report.oracle_html)
    tie_margin: float = oracle.DEFAULT_TIE_MARGIN
    max_share: float | None = None  # the oracle's bound on the canaries' share of server time

    @property
    def corruptions(self) -> list[oracle.Corruption]:
        return [v.corruption for v in self.incidents if v.corruption is not None]


def _oracle_setting(config: Mapping[str, Any], key: str) -> float | None:
    """A number of the run's recorded ``oracle:`` section; None where absent or not a number."""
    section = config.get("oracle")
    value = section.get(key) if isinstance(section, Mapping) else None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value) and value >= 0
    return float(value) if ok else None


def _run_name(run: RunData) -> str:
    for name in (run.summary.name, run.config.get("name")):
        if isinstance(name, str) and name:
            return name
    started = next((e for e in run.events if e.get("type") == EventType.RUN_STARTED), {})
    return str(started.get("name") or run.path.name)


def _brief(config: Mapping[str, Any]) -> list[tuple[str, str]]:
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


QUANTILES = (50, 90, 95, 99)


def _percentiles(values: np.ndarray) -> dict[str, float | None]:
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"n": 0, "mean": None, **{f"p{q}": None for q in QUANTILES}, "max": None}
    found = percentiles(x.tolist(), QUANTILES)
    return {"n": int(x.size), "mean": float(x.mean()), **{f"p{q}": v for q, v in zip(QUANTILES, found)},
            "max": float(x.max())}


CUT = "cut by the harness"


def request_statistics(requests: RequestColumns) -> tuple[list[tuple[str, dict]], list[tuple[str, int]]]:
    ok = requests.ok
    cached, prompt = requests["cached_tokens"][ok], requests["prompt_tokens"][ok]
    with np.errstate(invalid="ignore", divide="ignore"):
        cached_share = np.where(prompt > 0, cached / prompt * 100, np.nan)
    rows = [
        ("TTFT", _percentiles(requests["ttft_s"][ok])),
        ("ITL mean per request", _percentiles(requests["itl_mean_s"][ok])),
        ("ITL p99 per request", _percentiles(requests["itl_p99_s"][ok])),
        ("TPOT", _percentiles(requests["tpot_s"][ok])),
        ("end-to-end latency", _percentiles(requests["e2e_s"][ok])),
        ("prompt tokens", _percentiles(prompt)),
        ("output tokens", _percentiles(requests["output_tokens"][ok])),
        ("cached share of prompt (%)", _percentiles(cached_share)),
    ]
    # "aborted" is a stream the harness cut (drain, incident, interrupt): one word for it on every page
    return rows, [(CUT if outcome == "aborted" else outcome, n) for outcome, n in requests.outcome_counts()]


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
        record = typed_incident(incident.record)  # a field of the wrong type reads as absent
        onset = record.get("onset_at") or 0
        detected = record.get("detected_at") or float("inf")
        for s in run.log_lines:
            ts = s.get("ts")
            if not is_timestamp(ts):
                continue
            if onset - 120 <= ts <= detected + 60:
                parsed = watchdog.parse_line(str(s.get("line", "")), ts=ts)
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
    found = oracle.read_corruption(incident.path, number=incident.number, evidence=rel)
    corruption = oracle.with_prompt_tokens(found, run.canaries) if found is not None else None
    return IncidentView(record=incident.record, watchdog=lines, flight_recorder=fr, files=incident.files, path=rel,
                        corruption=corruption)


def _images(run: RunData, incidents: Sequence[IncidentEntry], *, start: float,
            end: float | None) -> list[tuple[str, bytes]]:
    from soak.report import plots  # matplotlib: only a page with plots pays for it

    markers: list[plots.Marker] = []
    for i in incidents:
        if i.onset_at is not None:
            markers.append(plots.Marker(i.onset_at, f"#{i.number} onset", "onset"))
        if i.detected_at is not None:
            markers.append(plots.Marker(i.detected_at, f"#{i.number} detected", "detected"))
    for e in jit_events(run.events):
        markers.append(plots.Marker(float(e["ts"]), f"JIT {e.get('kernel') or ''}".strip(), "precursor"))
    last = max([a[-1] for a in (run.gpu_ts, run.server_ts, run.client_ts) if a.size] + ([end] if end else []),
               default=start + 60)
    xlim = (0.0, max(last - start, 1.0) / 60.0)
    stage_cpu = run.gpu_source is GpuSource.STAGE_CPU
    dark, busy, hold = _tail_marks(run)
    quiet = list(downtimes(run.events, end=end).values())
    return [
        ("Stage CPU" if stage_cpu else "GPU utilization",
         plots.gpu_heatmap_png(run.gpu_ts, stage_columns(run.gpu_util, run.stages), start=start, markers=markers,
                               xlim=xlim, stage_cpu=stage_cpu, dark_pct=dark, busy_pct=busy, hold_s=hold,
                               quiet=quiet)),
        ("Token rate", plots.token_rates_png(run.server_ts, run.server["generation_tokens"], run.client_ts,
                                             run.client_tokens, start=start, markers=markers, xlim=xlim, down=quiet)),
        ("TTFT", plots.ttft_png(run.requests, start=start, end=end, markers=markers, xlim=xlim, down=quiet)),
        ("Context length", plots.context_png(run.requests, run.server_ts, run.server["kv_cache_usage_perc"],
                                             start=start, markers=markers, xlim=xlim, down=quiet)),
        ("Hit ratio", plots.hit_ratio_png(run.server_ts, run.server["prefix_cache_hits"],
                                          run.server["prefix_cache_queries"], run.requests, start=start,
                                          markers=markers, xlim=xlim, down=quiet)),
    ]


def _tail_marks(run: RunData) -> tuple[float, float, float]:
    """pp_tail_stall's (dark, busy, window) marks as the run's detector had them."""
    from pydantic import ValidationError

    from soak.detect.config import PpTailStallConfig

    detector = run.config.get("detector")
    section = detector.get("pp_tail_stall") if isinstance(detector, Mapping) else None
    try:
        config = PpTailStallConfig.model_validate(section if isinstance(section, Mapping) else {})
    except ValidationError:
        config = PpTailStallConfig()
    return config.marks(run.gpu_source)


def build_label(summary: RunSummary) -> str | None:
    """The build the night ran (the label a person gave it, and what identifies it)."""
    entry = summary.build_entry
    if entry is None:
        return None
    parts = [p for p in (entry.label, entry.key) if p]
    return " · ".join(dict.fromkeys(parts)) or None


def build(run: RunData, *, confidence: float = 0.95, with_plots: bool = True) -> ReportModel:
    """The report's model; ``with_plots=False`` leaves the images out (and
    matplotlib unimported): what junit.xml alone needs."""
    summary = run.summary
    start = run.start or 0.0
    verdict = summary.verdict.value if summary.verdict is not None else "unknown"
    cut_off = bool(summary.cut_off)
    incidents = summary.incidents
    hangs = summary.hangs
    # The judge's count of time at risk (summary.json's time_at_risk_s), the one soak history counts;
    # counted here only for a summary written before the judge recorded it.
    counted = summary.at_risk
    if counted is None:
        risk = at_risk(run.events, summary)
        counted = (risk.hangs, risk.exposure_s)
    hangs_at_risk, exposure = counted
    mtbf = mtbf_estimate(hangs_at_risk, exposure, confidence=confidence) if exposure > 0 else None
    criteria_failed = [r for r in summary.criteria.rows if r.failed] if summary.criteria is not None else []
    if criteria_failed and not hangs:
        # A server that fails its requests is not being exercised: hang-free time
        # under those conditions proves nothing about hangs. A hang it did have
        # is still a hang, so a run with hangs keeps its estimate.
        mtbf = None

    end = summary.ended_at
    images = _images(run, incidents, start=start, end=end) if with_plots else []
    stats_rows, outcomes = request_statistics(run.requests)
    by_number = {inc.number: inc for inc in run.incidents}
    views = []
    for i in incidents:
        found = by_number.pop(i.number, None) if i.number is not None else None
        if found is not None:
            view = _incident_view(found, run)
            view.record = typed_incident({**found.record, **i.raw})
        else:
            view = IncidentView(record=typed_incident(i.raw), watchdog=[], flight_recorder=None, files=[],
                                path="" if i.evidence is None else i.evidence)
        views.append(view)
    for leftover in by_number.values():  # evidence on disk the summary does not list (a cut-off run)
        views.append(_incident_view(leftover, run))
    if with_plots:
        zooms = incident_zooms(run, incidents)
        for view in views:
            view.zoom = zooms.get(view.record.get("number"), "")
    notes = [f"{name}: {n} unreadable line{'s' if n > 1 else ''} skipped" for name, n in run.bad_lines.items()]
    notes += [f"{name}: {n} field{'s' if n > 1 else ''} of the wrong type read as absent"
              for name, n in run.wrong_type_fields.items()]
    # a GPU source slower than the detector's window, an uncovered vLLM version, /metrics gone quiet;
    # not while the harness itself had the server down
    notes += why.server_warnings(summary, run.events)
    jit_note = jit_compile_note(run.events, start)
    if jit_note:
        notes.append(jit_note)
    for result in criteria_failed:
        reasons = result.reasons or ("a criterion" if result.name is None else result.name,)
        notes.append(f"Failure criterion {result.name}: {reasons[0]}."
                     + ("" if hangs else " No MTBF bound is given for a run whose server failed its requests."))
    for event in run.events:  # the wall clock only labels; a step of it is shown, and moved no figure
        if event.get("type") == EventType.WALL_CLOCK_STEP:
            notes.append(wall_step_note(event))
    notes = list(dict.fromkeys(notes))
    fault = harness_fault(run.path)
    if fault:
        notes.insert(0, fault)
    if cut_off:
        notes.insert(0, "This run was cut off: no run_ended event was recorded (the harness or host died). "
                        "The verdict and figures are from what was recorded up to then.")
    strip = ""
    if with_plots and (run.canaries or any(v.corruption is not None for v in views)):
        strip = oracle_html.strip_svg(run.canaries, incidents, start=start, end=end)
    tie_margin = _oracle_setting(run.config, "tie_margin")
    return ReportModel(
        canaries=run.canary_tally, canary_strip=strip,
        tie_margin=oracle.DEFAULT_TIE_MARGIN if tie_margin is None else tie_margin,
        max_share=_oracle_setting(run.config, "max_share"),
        name=_run_name(run), verdict=verdict, cut_off=cut_off, summary=summary, start=start, mtbf=mtbf,
        brief=_brief(run.config), config_text=run.config_text, images=images, incidents=views,
        request_stats=stats_rows, outcomes=outcomes, events=run.events[-300:], notes=notes,
        reasons=why.verdict_reasons(summary, start=start), pass_line=why.pass_line(summary),
        stop_line=why.stop_line(summary), thresholds=why.threshold_rows(summary, start=start),
        build_label=build_label(summary),
    )


def jit_events(events: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [e for e in events if e.get("type") == EventType.JIT_COMPILE and isinstance(e.get("ts"), (int, float))]


def jit_compile_note(events: Sequence[Mapping[str, Any]], start: float) -> str | None:
    """One note for vLLM's jit_monitor lines: how many kernels compiled mid-serve, and when."""
    found = jit_events(events)
    if not found:
        return None
    kernels = list(dict.fromkeys(str(e.get("kernel") or "?") for e in found))
    shown = ", ".join(kernels[:5]) + (f" and {len(kernels) - 5} more" if len(kernels) > 5 else "")
    first = float(found[0]["ts"]) - start
    return (f"JIT compile during inference: {len(found)} line{'s' if len(found) > 1 else ''} from vLLM's jit_monitor "
            f"(first at +{first:.0f}s; kernels {shown}), orange dotted on the timeline. A precursor, not a verdict: "
            "a kernel compiled mid-serve stalls its step, and a hang soon after names it in its incident summary.")


def ended_because(run_dir: Path, summary: RunSummary) -> str | None:
    """One line for ``soak report``'s terminal: why the run ended, from run_ended's
    reason and harness_error.txt."""
    parts = []
    reason = summary.stop_reason
    if reason:
        parts.append(f"The run ended: {reason}")
    first = _first_line(Path(run_dir) / "harness_error.txt")
    if first and (not reason or first[0].split(": ", 1)[-1] not in str(reason)):
        parts.append(f"{first[0]} (traceback in harness_error.txt)")
    elif first:
        parts.append("traceback in harness_error.txt")
    return "; ".join(parts) or None


def _first_line(path: Path) -> list[str]:
    """The first line of a text file the run wrote, read bounded (soak.bounds.read_file); none where it
    is missing, unreadable or past the bound."""
    try:
        data = read_file(path, limit=LIMITS.yaml_bytes)
    except (OSError, InputRejected):
        return []
    return data.decode("utf-8", "replace").splitlines()[:1]


def harness_fault(run_dir: Path) -> str | None:
    """The harness's own error (harness_error.txt's first line): a warning, unlike the stop reason."""
    first = _first_line(Path(run_dir) / "harness_error.txt")
    return f"The harness failed: {first[0]} (traceback in harness_error.txt)" if first else None


def wall_step_note(event: Mapping[str, Any]) -> str:
    step = event.get("step_s")
    size = f"{step:+.1f} s" if isinstance(step, (int, float)) and not isinstance(step, bool) else "an unknown amount"
    mono = event.get("mono")
    at = f" at +{mono:.0f}s of the run" if isinstance(mono, (int, float)) and not isinstance(mono, bool) else ""
    return (f"The system wall clock stepped {size}{at}. Durations, rates and windows are measured on the "
            "monotonic clock, and the times shown stay on it: this run's figures are unaffected.")


def junit_for(model: ReportModel) -> bytes:
    props: list[tuple[str, str]] = []
    if model.mtbf is not None:
        props.append(("mtbf", model.mtbf.sentence()))
    s = model.summary
    for key, value in (("duration_s", s.duration_s), ("prefix_cache_hit_ratio", s.prefix_cache_hit_ratio)):
        if value is not None:
            props.append((key, str(value)))
    req = s.requests
    props += [("requests_ok", str(req.ok or 0)), ("requests_failed", str(req.failed or 0))]
    props += [(f"cut_by_{cause}", str(count)) for cause, count in req.cut_by.items()]
    if s.proof is not None:
        props += [("proof", str(s.proof.get("decision"))), ("proof_sentence", str(s.proof.get("sentence")))]
    lines = [f"verdict {model.verdict}" + (" (cut off)" if model.cut_off else "")]
    if model.mtbf is not None:
        lines.append(model.mtbf.sentence())
    lines += [incident_line(IncidentEntry.from_json(v.record), s.started_at) for v in model.incidents]
    if model.canaries.total:
        props.append(("canaries", model.canaries.sentence(max_share=model.max_share)))
    return build_junit(s, name=model.name, hostname=s.hostname or "localhost", properties=props,
                       system_out="\n".join(lines), corruptions=model.corruptions, canaries=model.canaries)


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
        write_atomic(summary_path, (json.dumps(run.summary.to_json(), indent=2) + "\n").encode("utf-8"))
    html_path, junit_path = path / "report.html", path / "junit.xml"
    if html:
        write_atomic(html_path, render_html(model).encode("utf-8"))
    write_atomic(junit_path, junit_for(model))
    return Written(html=html_path if html else None, junit=junit_path, summary=summary_path, model=model)
