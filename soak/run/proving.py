"""``prove:`` in a run: the plan resolved before anything starts, and the
sequential test followed while the load runs (``soak.prove.live.ProofTracker``).

A broken MTBF named by build (``prove.broken_build``) is read from that build's
nights in ``prove.history`` here, once: the plan the run tests is then written
as the ``prove_plan`` event, so the judge, the report and ``soak report`` later
judge with the very plan the run used, even once history has grown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from soak.errors import ConfigError
from soak.events import Emit, EventType
from soak.prove.config import ProveConfig, plan_of
from soak.prove.live import ProofTracker
from soak.prove.sprt import Decision, Plan, ProofState
from soak.run.stopping import LoadStop
from soak.records import Assessment, IncidentRecord, RunInfo
from soak.samples import RequestRecord, Sample


def broken_mtbf_from_history(section: ProveConfig, *, config_path: Path | str | None) -> float | None:
    """The MTBF of ``section.broken_build`` pooled over its nights in
    ``section.history``; a night that cannot be read is left out (readers are
    total); a folder that holds none is one ConfigError naming the field."""
    from soak.history.collect import find_runs
    from soak.history.model import run_record
    from soak.history.prove import broken_mtbf_of
    from soak.report.rundir import load_run

    assert section.history is not None and section.broken_build is not None
    try:
        dirs = find_runs([section.history])
    except ConfigError as exc:
        raise ConfigError(f"{section.history}: {exc.message}", path=config_path, field="prove.history") from exc
    records = []
    for path in dirs:
        try:
            data = load_run(path)
            records.append(run_record(path=str(path), summary=data.summary, events=data.events, config=data.config))
        except Exception:  # a damaged night is not this run's problem: the others still count
            continue
    return broken_mtbf_of(records, section.broken_build)


def resolve_plan(section: ProveConfig | None, *, config_path: Path | str | None) -> Plan | None:
    """The run's plan, or None without a ``prove:`` section; a broken build with
    no hang in history (no MTBF to test against) is exit 2 naming the field."""
    if section is None:
        return None
    broken = None
    if section.broken_build is not None:
        broken = broken_mtbf_from_history(section, config_path=config_path)
    try:
        return plan_of(section, broken_mtbf_s=broken)
    except ValueError as exc:
        field = "prove.broken_build" if section.broken_build is not None else "prove"
        raise ConfigError(f"{exc} in {section.history}" if section.broken_build else str(exc),
                          path=config_path, field=field) from exc


def detection_horizon_s(detector: Any, probes: Any) -> float:
    """The longest a hang can go undetected, from the run's detector and probe
    config: the slowest enabled hang rule's time from the onset it records to its
    decision, plus one sample interval (the slowest probe feeding the hang rules)
    and one detector tick. A live accept is final only once the clean time up to
    ``now`` minus this reaches the accept line (soak.prove.live, docs/prove.md)."""
    spans = [0.0]
    if detector.pp_tail_stall.enabled:  # the pattern held its window, progress allowed its grace
        spans.append(max(detector.pp_tail_stall.window, detector.pp_tail_stall.stage_cpu.window)
                     + detector.pp_tail_stall.progress_grace)
    if detector.stage_cpu_stall.enabled:
        spans.append(detector.stage_cpu_stall.window)
    if detector.generation_frozen.enabled:  # before a life's first token its start-up grace applies,
        cfg = detector.generation_frozen  # and its allowance for a prefill /metrics does not show
        spans.append(max(cfg.ceiling, cfg.floor, cfg.startup_grace, cfg.unseen_prefill_grace))
    if detector.client_stall.enabled:
        spans.append(max(detector.client_stall.ceiling, detector.client_stall.floor))
    if detector.log_signature.enabled:  # a timeout line dates its onset this far back
        spans.append(detector.log_signature.execute_model_timeout)
    sample = max(probes.gpu_interval, probes.metrics_interval, probes.client_interval, probes.log_interval)
    return max(spans) + sample + detector.interval


class ProofSink:
    """A ``RunSink`` that feeds the run's events (incidents included, as the store
    writes them) to the tracker; the run loop asks it where the test stands."""

    def __init__(self, plan: Plan, *, horizon_s: float) -> None:
        # Fed every finished request: live time at risk needs the evidence of work the end counts by.
        self.tracker = ProofTracker(plan, horizon_s=horizon_s, fed_requests=True)

    def on_start(self, info: RunInfo) -> None:
        pass

    def on_sample(self, sample: Sample) -> None:
        pass

    def on_request(self, record: RequestRecord) -> None:
        self.tracker.on_request(record)

    def on_assessment(self, assessment: Assessment) -> None:
        pass

    def on_incident(self, incident: IncidentRecord) -> None:
        self.tracker.on_event(EventType.INCIDENT, {"ts": incident.detected_at, **incident.to_json()})

    def on_event(self, type: str, fields: Mapping[str, Any]) -> None:
        self.tracker.on_event(type, fields)

    def close(self) -> None:
        pass


class LiveProof:
    """The run loop's part: each detector tick, where the test stands goes to the
    sinks that show it; the decision is recorded once (``proof_decided``) and,
    with ``prove.stop_at_decision``, stops the load like any other stop reason.
    ``horizon_s``: ``detection_horizon_s`` of the run's config (an accept waits it out)."""

    def __init__(self, plan: Plan, *, horizon_s: float, stop_at_decision: bool, stop: LoadStop, emit: Emit,
                 show: Callable[[Decision], None]) -> None:
        self.plan = plan
        self.horizon_s = horizon_s
        self.sink = ProofSink(plan, horizon_s=horizon_s)
        self._stop_at_decision = stop_at_decision
        self._stop = stop
        self._emit = emit
        self._show = show
        self._said = False

    def started(self) -> None:
        """The plan, as JSON, before the load: the judge tests with what the run tested."""
        self._emit(EventType.PROVE_PLAN, plan=self.plan.to_json(),
                   stop_at_decision=self._stop_at_decision, horizon_s=self.horizon_s)

    def tick(self, now: float) -> Decision:
        decision = self.sink.tracker.at(now)
        self._show(decision)
        if decision.state is not ProofState.UNDECIDED and not self._said:
            self._said = True
            self._emit(EventType.PROOF_DECIDED, decision=decision.state.value, sentence=decision.sentence,
                       exposure_s=decision.exposure_s, hangs=decision.hangs)
            load = self._stop.load
            if self._stop_at_decision and load is not None and not load.stopping:
                self._stop.stop(f"proof {decision.state.value}: {decision.sentence}")
        return decision


__all__ = ["LiveProof", "ProofSink", "broken_mtbf_from_history", "detection_horizon_s", "resolve_plan"]
