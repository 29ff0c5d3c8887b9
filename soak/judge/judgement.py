"""The judge: what the run recorded and how it ended, in; a ``Judgement`` out. Pure.

``judge(recorded, ending)`` decides the failure criteria once on the recorded
requests, evaluates the thresholds once on the recorded figures and window
columns, counts the time at risk once (``soak.exposure``: summary.json's
``time_at_risk_s``, which the end of a run and its MTBF read), decides the
sequential test of a ``prove:`` run on it, and runs the exit-code ladder
(``soak.judge.ladder``). The record on disk decides the verdict: an incident or
a failed criterion is ``fail`` whatever the run believed at its end (under
``prove:`` a hang in a test that accepted is not: docs/prove.md).
``summary_json(recorded, judgement)`` is its serialized form, summary.json.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from soak.criteria.constraints import CriteriaDecision
from soak.criteria.constraints import judge as judge_criteria
from soak.events import EventType
from soak.exposure import AtRisk, Interval, intervals_json, intervals_of, known_clean
from soak.judge.ending import Ending, EndingSource
from soak.judge.figures import figures
from soak.judge.ladder import outcome_of
from soak.judge.reasons import verdict_reasons
from soak.judge.recorded import NOWHEN, Recorded
from soak.prove.live import decide
from soak.prove.sprt import Decision, ProofState, withheld
from soak.records import Verdict
from soak.work import finite_number
from soak.thresholds.evaluate import ThresholdResult, evaluate_run, evaluate_windows, thresholds_entry


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict  # summary.json's
    exit_code: int | None  # None: the run was cut off
    end_verdict: Verdict  # the ladder's, as run_ended records it (an exit-3 run is aborted even with an incident)
    reasons: tuple[str, ...]  # verdict_reasons
    stop_reason: str | None
    criteria: CriteriaDecision
    criteria_note: str | None
    thresholds: tuple[ThresholdResult, ...] | None  # None: the run configured none
    thresholds_entry: Mapping[str, Any] | None
    breached: tuple[str, ...]  # the thresholds the ladder counted (a live abort_on_fail stop first)
    incidents: tuple[Mapping[str, Any], ...]
    failed: bool  # an incident, a failed criterion or a failed response (under prove: any of them but a hang)
    at_risk: AtRisk = AtRisk(())  # the time at risk, counted once (soak.exposure)
    proof: Decision | None = None  # prove: where the sequential test stands (or where it decided)
    proof_path: tuple[tuple[float, ...], float] = ((), 0.0)  # (exposure at each hang, total exposure)
    withheld: str | None = None  # why this night's hang-free time proves no fix (it failed otherwise)

    def criteria_json(self) -> dict[str, Any]:
        return {**self.criteria.to_json(), **({"note": self.criteria_note} if self.criteria_note else {})}


def _thresholds(recorded: Recorded) -> tuple[tuple[ThresholdResult, ...] | None, dict[str, Any] | None]:
    if recorded.thresholds is None:
        return None, None
    if recorded.thresholds_error is not None:
        return (), {"passed": False, "breached": [], "results": [], "error": recorded.thresholds_error}
    # The load's figures: a run that never recorded load_stopped is judged up to its last request.
    load = replace(recorded, events=replace(recorded.events, run_ended=None, ended=NOWHEN))
    results = evaluate_run(recorded.thresholds, figures(load))
    if recorded.windowed:
        events = recorded.events
        started = events.load_events.get("started")
        start = started.get("ts") if started is not None else None
        end = events.load_stopped[0]
        rows = recorded.window_requests or ()
        if end is None:  # cut off: up to the last thing recorded
            end = max((r["ended_at"] for r in rows if isinstance(r.get("ended_at"), (int, float))), default=None)
        results += evaluate_windows(recorded.thresholds, rows, recorded.samples.series or (), start=start, end=end)
    entry = thresholds_entry(results)
    for event in recorded.events.threshold_breaches:  # a live abort_on_fail stop
        entry["aborted_by"] = {k: event.get(k) for k in ("ts", "threshold", "observed", "reason")}
        entry["passed"] = False
        if event.get("threshold") not in entry["breached"]:
            entry["breached"].insert(0, event.get("threshold"))
    return tuple(results), entry


def _stop_reason(ending: Ending, *, breached: tuple[str, ...], exit_code: int,
                 criteria: CriteriaDecision) -> str:
    """The reason the run loop records in run_ended: why the load stopped, with
    what the end found (a breach, a harness fault, a failed criterion)."""
    reason = ending.stop_reason
    if exit_code == 99 and not (reason or "").startswith("threshold"):
        reason = "thresholds breached: " + "; ".join(breached)
    reason = reason or "finished"
    if ending.harness_fault is not None and not reason.startswith("harness fault"):
        reason = f"{reason}; harness fault {ending.harness_fault}"
    if ending.problem is None and not criteria.passed and not reason.startswith("criterion"):
        reason = "; ".join(criteria.reasons) + f" (load stopped: {reason})"
    return reason


def _mapping(parent: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = parent.get(key)
    return value if isinstance(value, Mapping) else {}


def failed_from(criteria: CriteriaDecision, tally: Any) -> tuple[float, str] | None:
    """Where the failed criteria date the night's failure, on the run's time line, and
    which: nothing after it is clean. A collapse (``work_rate``) from its first window
    below the floor, a no-success stretch from its first failure, silence
    (``work_evidence``) from its gap or short window, an error rate from the first
    failed request; a claim judged over the whole night (the server's count, the
    model) from the load's start."""
    load_started = tally.load_started
    if load_started is None:
        return None
    marks: list[tuple[float, str]] = []
    for result in criteria.failed:
        evidence = result.evidence if isinstance(result.evidence, Mapping) else {}
        breach = _mapping(evidence, "breach")
        at: float | None = None
        if result.name == "work_rate":
            rel = finite_number(breach.get("from_s"))
            at = None if rel is None else load_started + rel
        elif result.name == "no_success":
            at = finite_number(breach.get("from"))
        elif result.name == "work_evidence" and evidence.get("first_work_s") is not None:
            # the silence's start: its gap where the gap broke the bound, or its first short window
            gap = _mapping(evidence, "longest_gap")
            too_long = (finite_number(gap.get("length_s")) or 0.0) >= (finite_number(evidence.get("max_gap_s"))
                                                                       or math.inf)
            rels = [finite_number(gap.get("from_s")) if too_long else None,
                    finite_number(_mapping(_mapping(evidence, "windows"), "first_short").get("from_s"))]
            found = [r for r in rels if r is not None]
            at = load_started + min(found) if found else None
        elif result.name == "error_rate":
            at = finite_number(tally.first_failed)
        marks.append((load_started if at is None else max(load_started, at), f"criterion {result.name} failed"))
    return min(marks) if marks else None


def _risk(recorded: Recorded, criteria: CriteriaDecision) -> AtRisk:
    """The run's time at risk, counted once: the summary's span places a run without
    load events; only the productive requests' time counts (the digest's work_at);
    nothing is clean after a failure the criteria date."""
    span = figures(recorded)
    tally = recorded.requests.tally
    intervals = intervals_of(recorded.events.risk_events,
                             {k: span[k] for k in ("started_at", "ended_at", "duration_s", "cut_off")},
                             work_at=recorded.requests.work_at, clean_until=failed_from(criteria, tally))
    horizon = recorded.events.prove_horizon_s
    if horizon > 0:
        # A hang begun in the load's last horizon may never have been detected: that time is
        # not known clean, at the end as live (soak.prove.live.decide), so it is not counted.
        intervals = known_clean(intervals, until=load_end_label(recorded, intervals) - horizon)
    return AtRisk(intervals)


def load_end_label(recorded: Recorded, intervals: Sequence[Interval]) -> float:
    """Where the load stopped, as a label (where the end's decision stands):
    ``load_stopped``'s, else the record's last, else the end of the path."""
    for event in reversed(recorded.events.risk_events):
        if event.get("type") == EventType.LOAD_STOPPED and finite_number(event.get("ts")) is not None:
            return float(event["ts"])
    last = finite_number(recorded.events.last_ts)
    ends = [i.start + i.length_s for i in intervals]
    return last if last is not None else max(ends, default=0.0)


def _failed_but_hangs(recorded: Recorded, ending: Ending, criteria: CriteriaDecision) -> tuple[bool, bool]:
    """Under prove: (a failure other than a hang, whether a hang was recorded).
    The run's live failure is its hangs' when it recorded only hangs."""
    hangs = [i for i in recorded.incidents if i.get("kind") == "hang"]
    others = len(recorded.incidents) > len(hangs)
    handling = (ending.stop_reason or "").startswith("incident handling failed")
    live = ending.failed_live and (not hangs or handling)
    return others or live or not criteria.passed, bool(hangs)


def _why_withheld(recorded: Recorded, ending: Ending, criteria: CriteriaDecision) -> str | None:
    """Why this night's hang-free time proves no fix, whatever the sequential test
    says: it failed otherwise (a failed criterion, a corruption, a crash or a lost
    server, a failed response). None: it did not. history reads it (at_risk.withheld)."""
    others = sorted({str(i.get("kind") or "incident") for i in recorded.incidents if i.get("kind") != "hang"})
    if others:
        return f"the run had a {' and a '.join(others)} incident"
    if not criteria.passed:
        return "the run failed criterion " + ", ".join(r.name for r in criteria.failed)
    if (ending.stop_reason or "").startswith("incident handling failed"):
        return "the run's response to an incident failed"
    return None


def judge(recorded: Recorded, ending: Ending) -> Judgement:
    criteria = judge_criteria(recorded.criteria, recorded.requests.tally, final=True)
    incidents = recorded.incidents
    failed = ending.failed_live or ending.incidents_seen > 0 or bool(incidents) or not criteria.passed
    risk = _risk(recorded, criteria)
    proof, path, hanged = None, ((), 0.0), False
    if recorded.proof_plan is not None:
        # The live rule at the load's end: an accept needs its clean time outside the horizon.
        proof, marks, total = decide(recorded.proof_plan, risk.intervals,
                                     now=load_end_label(recorded, risk.intervals),
                                     horizon_s=recorded.events.prove_horizon_s)
        path = (marks, total)
        failed, hanged = _failed_but_hangs(recorded, ending, criteria)
    why_withheld = _why_withheld(recorded, ending, criteria)
    if proof is not None and why_withheld is not None:
        proof = withheld(proof, why_withheld)  # nothing broken is ever called fixed
    results, entry = _thresholds(recorded)
    breached = [r.name for r in results or () if r.breached]
    for name in (ending.threshold_aborted, *(e.get("threshold") for e in recorded.events.threshold_breaches)):
        if isinstance(name, str) and name not in breached:
            breached.insert(0, name)
    if ending.source is EndingSource.CUT_OFF:
        exit_code, end_verdict, stop_reason = None, Verdict.ABORTED, None
    else:
        exit_code, end_verdict = outcome_of(problem=ending.problem, failed=failed, breached=bool(breached),
                                            fault=ending.harness_fault is not None, interrupted=ending.interrupted,
                                            proof=proof.state if proof is not None else None, hanged=hanged)
        stop_reason = ending.stop_reason if ending.source is EndingSource.RECORDED else \
            _stop_reason(ending, breached=tuple(breached), exit_code=exit_code, criteria=criteria)
    # Whatever the loop believed at its end: the record on disk decides (under prove, a hang
    # in a test that accepted is the test's to judge, and it judged).
    if proof is None:
        verdict = Verdict.FAIL if incidents or not criteria.passed else end_verdict
    else:
        accepted = proof.state is ProofState.ACCEPTED
        verdict = Verdict.FAIL if failed or (hanged and not accepted) else end_verdict
    reasons = verdict_reasons(verdict=verdict, ending=ending, stop_reason=stop_reason, incidents=incidents,
                              criteria_reasons=criteria.reasons,
                              breached_rows=[r.to_json() for r in results or () if r.breached],
                              live_breaches=recorded.events.threshold_breaches)
    if proof is not None and (proof.state is not ProofState.ACCEPTED or verdict is not Verdict.PASS):
        reasons = (*reasons, f"proof: {proof.sentence}")
    return Judgement(verdict=verdict, exit_code=exit_code, end_verdict=end_verdict, reasons=tuple(reasons),
                     stop_reason=stop_reason, criteria=criteria, criteria_note=recorded.criteria_note,
                     thresholds=results, thresholds_entry=entry, breached=tuple(breached),
                     incidents=incidents, failed=failed, at_risk=risk, proof=proof, proof_path=path,
                     withheld=why_withheld)


def run_ended_fields(judgement: Judgement, ending: Ending) -> dict[str, Any]:
    """The ``run_ended`` event's fields (its ts and mono are the writer's)."""
    return {"verdict": judgement.end_verdict.value, "reason": judgement.stop_reason,
            "exit_code": judgement.exit_code, "load_cut_short": ending.load_cut_short,
            "incidents": max(ending.incidents_seen, len(judgement.incidents)), "restarts": ending.restarts,
            "criteria_failed": [r.name for r in judgement.criteria.failed], **ending.run_ended_fields()}


def summary_json(recorded: Recorded, judgement: Judgement) -> dict[str, Any]:
    """summary.json: the figures of the record and what the judgement decided."""
    summary = figures(recorded)
    stopped = (recorded.events.load_events.get("stopped") or {}).get("reason")
    summary.update({
        "verdict": judgement.verdict.value,
        "stop_reason": judgement.stop_reason,
        # Why the load stopped, as said then: a neutral fact, never why the run failed
        # (stop_reason is run_ended's, with what the end found folded in).
        "stopped_by": stopped if isinstance(stopped, str) else judgement.stop_reason,
        "exit_code": judgement.exit_code,
        "verdict_reasons": list(judgement.reasons),
        "criteria": judgement.criteria_json(),
        "thresholds": judgement.thresholds_entry,
        # The one count of time at risk (soak.exposure): the end of the run and its MTBF read it.
        "time_at_risk_s": judgement.at_risk.exposure_s,
        "hangs_at_risk": judgement.at_risk.hangs,
        # ... and its intervals, so history, bisect, compare and the push read this count, not their own.
        "at_risk": {"intervals": intervals_json(judgement.at_risk.intervals),
                    "exposure_s": judgement.at_risk.exposure_s, "hangs": judgement.at_risk.hangs,
                    "withheld": judgement.withheld},
    })
    if judgement.proof is not None:
        marks, total = judgement.proof_path
        summary["proof"] = {**judgement.proof.to_json(),
                            "path": {"hang_exposures_s": list(marks), "exposure_s": total}}
    elif recorded.proof_note is not None:
        summary["proof"] = {"decision": None, "note": recorded.proof_note}
    return summary


__all__ = ["Judgement", "judge", "run_ended_fields", "summary_json"]
