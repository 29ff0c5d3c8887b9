"""The run store: one directory per run, everything appended and flushed as it happens.

Layout (CONTRACTS.md)::

    config.yaml      the resolved config, secrets as ***
    plan.json        the workload plan
    events.jsonl     {"ts", "type", ...}: run_started, load_started, detector_state,
                     decision, incident, restart, load_stopped, run_ended, ...
    requests.jsonl   one soak.samples.RequestRecord a line
    samples.jsonl    one soak.samples record a line, tagged "kind"; past a few MB it
                     rolls into samples-NNN.jsonl.gz segments (soak.store.segments)
    server.log       a launched target's stdout and stderr (written by the target)
    incidents/N/     evidence (written by the responder)
    summary.json     at the end (soak.store.summary.summarize)

Every events.jsonl line and every samples line carries ``mono``: seconds on the
run's monotonic clock since the run's clock started (``soak.clock.RunClock``), so
readers take durations from it and never from ``ts`` alone (a run recorded
before ``mono`` existed falls back to ``ts``).

Detector assessments arrive several times a second; only changes of state and
new decisions become events, so the record grows with what happened, not with time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from soak.clock import Clock, run_clock
from soak.events import EventType
from soak.fsio import write_atomic, write_json_atomic
from soak.records import Assessment, DetectorState, IncidentRecord, RuleState, RunInfo
from soak.redact import Redactor
from soak.samples import RequestRecord, Sample, to_json
from soak.store.jsonl import JsonlWriter, dumps
from soak.store.segments import DEFAULT_SEGMENT_BYTES, RollingJsonlWriter

EVENTS = "events.jsonl"
REQUESTS = "requests.jsonl"
CONFIG = "config.yaml"
PLAN = "plan.json"
SUMMARY = "summary.json"
SERVER_LOG = "server.log"




class RunStore:
    """A ``RunSink`` writing the run directory. Its clock is the caller's:
    events carry the ``ts`` they are given, or ``clock.now()``, and ``mono``."""

    def __init__(self, run_dir: Path, *, clock: Clock, redactor: Redactor | None = None,
                 samples_segment_bytes: int | None = DEFAULT_SEGMENT_BYTES) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # Labels on the run's monotonic time line (soak.clock.RunClock; the run's own
        # when it is one), so a ``ts`` given and its ``mono`` agree.
        self._clock = run_clock(clock)
        # The origin of every ``mono`` the run directory carries (the client's
        # started_mono/ended_mono too: the run loop hands it this origin).
        self.mono_origin = self._clock.origin_mono
        # Every byte this store writes passes the run's redactor (soak.redact).
        self._redactor = redactor
        self._redact: Callable[[str], str] | None = redactor.text if redactor is not None else None
        self._events = JsonlWriter(self.run_dir / EVENTS, redact=self._redact)
        self._requests = JsonlWriter(self.run_dir / REQUESTS, redact=self._redact)
        self._samples = RollingJsonlWriter(self.run_dir, segment_bytes=samples_segment_bytes, redact=self._redact)
        self._detector_state: DetectorState | None = None
        self._closed = False

    # -- files written once ----------------------------------------------------
    def write_config(self, config: Mapping[str, Any]) -> None:
        # Redacted value by value before the dump, so a secret becomes a quoted
        # '***' and config.yaml still parses.
        redacted = self._redactor.structure(dict(config)) if self._redactor is not None else dict(config)
        text = yaml.safe_dump(redacted, sort_keys=False, allow_unicode=True)
        (self.run_dir / CONFIG).write_text(text, encoding="utf-8")

    def write_plan(self, plan: Mapping[str, Any]) -> None:
        write_json_atomic(self.run_dir / PLAN, dict(plan), redact=self._redact)

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        write_json_atomic(self.run_dir / SUMMARY, dict(summary), redact=self._redact)

    def write_text(self, name: str, text: str) -> Path:
        """A text file of the run directory (harness_error.txt), redacted, whole or not at all."""
        path = self.run_dir / name
        write_atomic(path, self.redact(text))
        return path

    def redact(self, text: str) -> str:
        return self._redact(text) if self._redact is not None else text

    # -- RunSink ---------------------------------------------------------------
    def mono(self, ts: float | None = None) -> float:
        """Run-relative monotonic seconds of the label ``ts`` (labels are on the
        monotonic time line), else of now."""
        if isinstance(ts, (int, float)) and not isinstance(ts, bool):
            return round(ts - self._clock.origin_wall, 6)
        return round(self._clock.elapsed(), 6)

    def event(self, type: EventType | str, ts: float | None = None, **fields: Any) -> None:
        fields.pop("mono", None)
        self._events.write({"ts": self._clock.now() if ts is None else ts, "type": type,
                            "mono": self.mono(ts), **fields})

    def on_start(self, info: RunInfo) -> None:
        self.event(
            EventType.RUN_STARTED,
            ts=info.started_at,
            run_id=info.run_id,
            target=info.target_kind.value,
            base_url=info.base_url,
            model=info.model,
            root_pid=info.root_pid,
            duration_s=info.duration_s,
            warmup_s=info.warmup_s,
            gpu_count=info.gpu_count,
        )

    def on_sample(self, sample: Sample) -> None:
        line = to_json(sample)
        line["mono"] = self.mono(sample.ts)
        self._samples.write(line)

    def on_request(self, record: RequestRecord) -> None:
        self._requests.write(record.to_json())

    def on_assessment(self, assessment: Assessment) -> None:
        if assessment.state is not self._detector_state:
            self._detector_state = assessment.state
            pending = [
                {"rule": r.rule, "state": r.state.value, "reasons": list(r.reasons)}
                for r in assessment.rules
                if r.state in (RuleState.PENDING, RuleState.FIRED)
            ]
            self.event(EventType.DETECTOR_STATE, ts=assessment.now, state=assessment.state.value, rules=pending)
        for decision in assessment.new_incidents:
            self.event(EventType.DECISION, ts=decision.decided_at, **decision.to_json())

    def on_incident(self, incident: IncidentRecord) -> None:
        self.event(EventType.INCIDENT, ts=incident.detected_at, **incident.to_json())

    def on_event(self, type: EventType | str, fields: Mapping[str, Any]) -> None:
        fields = dict(fields)
        ts = fields.pop("ts", None)
        self.event(type, ts=ts, **fields)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for writer in (self._events, self._requests, self._samples):
            writer.close()


__all__ = ["RunStore", "write_json_atomic", "dumps"]
