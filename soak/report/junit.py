"""junit.xml: the soak as test cases, so nightly CI shows a hang or a failing
server as a failed test.

The layout is the Apache Ant JUnit schema (windyroad JUnit.xsd, checked against
in tests/report): ``<testsuite>`` with ``properties``, one ``testcase`` for the
soak itself, one per failure criterion (``criteria.error_rate``,
``criteria.no_success``; summary.json's ``criteria``), ``system-out`` and
``system-err``. An incident is the soak case's ``<failure>`` (a test case holds
at most one, so every incident is listed in its text); a criterion that failed
is its own case's ``<failure>`` with the reason; a run that was cut off or
aborted without an incident is an ``<error>``.

A ``prove:`` run has a ``prove`` case (docs/prove.md): a ``<failure>`` when the
sequential test rejected, an ``<error type="prove_undecided">`` when it ended
undecided or at its truncation (exit 5; the Ant schema has no skipped case), and
a plain pass when it accepted, the sentence in every message. An accepted test's
hangs are listed in ``system-out``; they fail the soak case only when the
verdict failed. The suite's ``exit_code`` property is the run's exit status, so a
CI job that went red on exit 5 shows why: the prove case's "undecided (exit 5)".
"""

from __future__ import annotations

import datetime as dt
import xml.etree.ElementTree as ET
from typing import Any, Mapping, Sequence

from soak.judge.ladder import UNDECIDED_EXIT
from soak.onset import restated
from soak.report.oracle import CanaryTally, Corruption, corruption_sentence
from soak.summary_file import IncidentEntry, RunSummary


def _timestamp(ts: Any) -> str:
    when = dt.datetime.fromtimestamp(float(ts) if isinstance(ts, (int, float)) else 0.0, tz=dt.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S")  # the schema forbids a timezone suffix


def _clean(text: str) -> str:
    # XML 1.0 cannot carry most control characters; log lines sometimes do.
    return "".join(ch for ch in text if ch in "\t\n\r" or ord(ch) >= 0x20)


def _or(value: Any, default: str) -> Any:
    return default if value is None else value


def incident_line(incident: IncidentEntry, start: float | None) -> str:
    at = ""
    if incident.onset_at is not None and start is not None:
        at = f" at +{(incident.onset_at - start) / 60:.1f} min"
    summary = restated(incident.summary, incident.detection_latency) if incident.summary else \
        "; ".join(incident.reasons) or "no summary recorded"
    return (f"incident {_or(incident.number, '?')}: {_or(incident.kind, '?')} "
            f"(rule {_or(incident.rule, '?')}){at}: {summary} [evidence {_or(incident.evidence, '?')}]")


def _prove_case(suite: ET.Element, proof: Mapping[str, Any], *, name: str, failed: bool, undecided: bool,
                exit_code: int | None) -> None:
    """The ``prove`` case: the sequential test's decision and sentence; an undecided test names
    exit 5 where it made the run's exit status (a breach, a fault or an interrupt outranks it)."""
    sentence = _clean(str(proof.get("sentence") or proof.get("note") or "no sentence recorded"))
    case = ET.SubElement(suite, "testcase", {"name": "prove", "classname": f"soak.{name or 'soak'}", "time": "0.000"})
    if failed:
        ET.SubElement(case, "failure", {"type": "prove_rejected", "message": sentence}).text = \
            "\n".join(_clean(str(r)) for r in proof.get("reasons") or [sentence])
    elif undecided:
        message = f"undecided{' (exit 5)' if exit_code == UNDECIDED_EXIT else ''}: {sentence}"
        ET.SubElement(case, "error", {"type": "prove_undecided", "message": message}).text = message


def _oracle_case(suite: ET.Element, *, name: str, incidents: Sequence[IncidentEntry], start: float | None,
                 corruptions: Sequence[Corruption], canaries: CanaryTally | None) -> None:
    """The ``oracle`` case: a ``<failure type="corruption">`` naming each corruption and why it is one
    (the judgement's reason), a pass when every judged canary was right."""
    case = ET.SubElement(suite, "testcase", {"name": "oracle", "classname": f"soak.{name or 'soak'}", "time": "0.000"})
    said = {c.number: f"incident {_or(c.number, '?')}: corruption: {corruption_sentence(c)} [evidence {c.evidence}]"
            for c in corruptions}
    lines = [said.pop(i.number, None) or incident_line(i, start) for i in incidents if i.kind == "corruption"]
    lines += list(said.values())  # evidence on disk the summary does not list (a cut-off run)
    if lines:
        failure = ET.SubElement(case, "failure", {"type": "corruption", "message": _clean(lines[0])})
        failure.text = _clean("\n".join(lines + ([f"canaries: {canaries.sentence()}"] if canaries and canaries.total
                                                   else [])))


def _has_oracle(incidents: Sequence[IncidentEntry], corruptions: Sequence[Corruption],
                canaries: CanaryTally | None) -> bool:
    return bool(corruptions) or any(i.kind == "corruption" for i in incidents) or bool(canaries and canaries.total)


def build_junit(summary: RunSummary | Mapping[str, Any], *, name: str, hostname: str = "localhost",
                properties: Sequence[tuple[str, str]] = (), system_out: str = "",
                corruptions: Sequence[Corruption] = (), canaries: CanaryTally | None = None) -> bytes:
    """``corruptions`` and ``canaries``: the oracle's (soak.report.oracle), for its own case."""
    summary = RunSummary.of(summary)  # summary.json as parsed reads through the typed record too
    incidents = summary.incidents
    verdict = summary.verdict.value if summary.verdict is not None else "unknown"
    cut_off = bool(summary.cut_off)
    start = summary.started_at
    duration = summary.duration_s if summary.duration_s is not None else 0.0
    results = summary.criteria.rows if summary.criteria is not None else ()
    criteria_failed = [r for r in results if r.failed]
    thresholds = summary.thresholds.rows if summary.thresholds is not None else ()
    breached = [r for r in thresholds if not r.passed]
    proof = summary.proof
    decision = proof.get("decision") if proof is not None else None
    # An accepted test judged the hangs and passed the run: they are listed, not failed.
    hangs_judged = decision == "accepted" and verdict == "pass"
    # An accept is an answer whatever else failed the run (an error rate): only no answer is open.
    proof_failed = decision == "rejected"
    proof_open = proof is not None and decision not in ("rejected", "accepted")
    # The soak case fails on incidents, or on a fail verdict no criterion, threshold or proof explains.
    failed = (bool(incidents) and not hangs_judged) or \
        (verdict == "fail" and not criteria_failed and not breached and not proof_failed)
    errored = not failed and not criteria_failed and not breached and not proof_failed and \
        (cut_off or verdict not in ("pass",))
    oracle = _has_oracle(incidents, corruptions, canaries)
    corrupt = bool(corruptions) or any(i.kind == "corruption" for i in incidents)

    suite = ET.Element("testsuite", {
        "name": "soak", "timestamp": _timestamp(start), "hostname": hostname or "localhost",
        "tests": str(1 + len(results) + len(thresholds) + (proof is not None) + oracle),
        "failures": str(int(failed) + len(criteria_failed) + len(breached) + proof_failed + corrupt),
        "errors": str(int(errored) + proof_open),
        "time": f"{duration:.3f}",
    })
    props = ET.SubElement(suite, "properties")
    # the exit status beside the verdict: exit 5 is a pass verdict that a nightly sees as non-zero
    exit_code = [("exit_code", str(summary.exit_code))] if summary.exit_code is not None else []
    for key, value in [("verdict", verdict), *exit_code, ("cut_off", str(cut_off).lower()), *properties]:
        ET.SubElement(props, "property", {"name": key, "value": _clean(str(value))})
    case = ET.SubElement(suite, "testcase", {"name": name or "soak", "classname": f"soak.{name or 'soak'}",
                                             "time": f"{duration:.3f}"})
    if failed:
        lines = [incident_line(i, start) for i in incidents] or [f"verdict {verdict}"]
        kinds = sorted({_or(i.kind, "incident") for i in incidents}) or ["fail"]
        failure = ET.SubElement(case, "failure", {"type": ",".join(kinds), "message": _clean(lines[0])})
        failure.text = _clean("\n".join(lines))
    elif errored:
        why = "the run was cut off (no run_ended event): verdict from what was recorded" if cut_off else f"verdict {verdict}"
        error = ET.SubElement(case, "error", {"type": "cut_off" if cut_off else verdict, "message": why})
        error.text = why
    for result in results:
        name_ = f"criteria.{_or(result.name, 'unknown')}"
        criterion = ET.SubElement(suite, "testcase", {"name": name_, "classname": f"soak.{name or 'soak'}",
                                                      "time": "0.000"})
        if result.failed:
            reasons = list(result.reasons) or [f"{name_} failed"]
            failure = ET.SubElement(criterion, "failure", {"type": "criterion", "message": _clean(reasons[0])})
            failure.text = _clean("\n".join(reasons))
    # Each threshold is a test case of its own (k6's convention), so a CI report
    # lists "ttft_p99 < 90s" beside the soak itself.
    for result in thresholds:
        t_case = ET.SubElement(suite, "testcase", {"name": _clean(_or(result.name, "threshold")),
                                                   "classname": f"soak.{name or 'soak'}.thresholds", "time": "0.000"})
        if not result.passed:
            reason = _clean(_or(result.reason, "breached"))
            failure = ET.SubElement(t_case, "failure", {"type": f"threshold_{_or(result.outcome, 'breached')}",
                                                        "message": reason})
            failure.text = reason
    if oracle:
        _oracle_case(suite, name=name, incidents=incidents, start=start, corruptions=corruptions, canaries=canaries)
    if proof is not None:
        _prove_case(suite, proof, name=name, failed=proof_failed, undecided=proof_open, exit_code=summary.exit_code)
        if hangs_judged and incidents:
            listed = "\n".join(incident_line(i, start) for i in incidents)
            system_out = f"{system_out}\nincidents (the sequential test accepted in spite of them):\n{listed}"
    ET.SubElement(suite, "system-out").text = _clean(system_out)
    ET.SubElement(suite, "system-err").text = ""
    ET.indent(suite)
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True)
