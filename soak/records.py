"""The records one stage hands the next, and the states they carry.

A leaf module: it imports only the standard library and the other leaves
(``soak.samples``, ``soak.versions``), so every stage may import it and no
stage learns another stage's internals from it. Everything here is immutable;
``evidence`` and ``extra`` mappings hold only JSON types.

Who makes what, who reads it::

    wiring (soak.run)  TargetLayout ─┐
    run loop           TargetFacts ──┴─► probes, responder, counter factories
    detector           Assessment(RuleStatus..., Decision...) ─► run loop, sinks
    responder          IncidentRecord ─► sinks (run store, exporter, live view)
    run loop           RunInfo, Verdict ─► sinks, summary.json
    sinks              implement RunSink

States are ``str`` enums: their ``.value`` is what the run directory and
summary.json carry (CONTRACTS.md), so the JSON stays as it was while the code
compares members, never strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Mapping, Protocol

from soak.samples import GpuSample, RequestRecord, Sample
from soak.versions import VllmProfile


# --- states --------------------------------------------------------------------------


class Verdict(str, Enum):
    """summary.json's ``verdict`` (CONTRACTS.md)."""

    PASS = "pass"
    FAIL = "fail"
    ABORTED = "aborted"


class TargetKind(str, Enum):
    """The config's ``target.kind``."""

    SIMULATOR = "simulator"
    LAUNCHED = "launched"
    ATTACHED = "attached"


class DetectorState(str, Enum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    # An incident was decided (its Decision's kind says hang, crash or server gone);
    # the detector stays here until reset().
    HUNG = "hung"


class IncidentKind(str, Enum):
    HANG = "hang"
    CRASH = "crash"
    SERVER_GONE = "server_gone"
    # An answer the correctness oracle could not explain: the server still answers, wrongly.
    CORRUPTION = "corruption"


class RuleState(str, Enum):
    INACTIVE = "inactive"  # preconditions unmet: no data, idle server, switched off
    CLEAR = "clear"
    PENDING = "pending"  # the condition holds but not yet past its threshold
    FIRED = "fired"


class IncidentStatus(str, Enum):
    """``incidents/N/incident.json``'s ``status``: how far the response got (a
    harness killed mid-incident leaves the step it was in)."""

    COLLECTING = "collecting"
    EVIDENCE = "evidence"
    KILLING = "killing"
    DONE = "done"


# --- the target ----------------------------------------------------------------------


@dataclass(frozen=True)
class Topology:
    """GPU indices of each pipeline stage, first stage first."""

    stages: tuple[tuple[int, ...], ...]

    @classmethod
    def pipeline(cls, pp_size: int, tp_size: int = 1, first_gpu: int = 0) -> "Topology":
        if pp_size < 1 or tp_size < 1:
            raise ValueError("pp_size and tp_size must be at least 1")
        return cls(
            tuple(
                tuple(range(first_gpu + stage * tp_size, first_gpu + (stage + 1) * tp_size))
                for stage in range(pp_size)
            )
        )

    @property
    def last_stage(self) -> tuple[int, ...]:
        return self.stages[-1] if self.stages else ()

    @property
    def upstream(self) -> tuple[int, ...]:
        return tuple(i for stage in self.stages[:-1] for i in stage)

    @property
    def gpu_count(self) -> int:
        return sum(len(stage) for stage in self.stages)


@dataclass(frozen=True)
class TargetLayout:
    """What the config says about the server, known before it starts."""

    kind: TargetKind
    pp_size: int = 1
    tp_size: int = 1
    block_size: int = 16
    # The model the config names (None: the first one /v1/models lists).
    model: str | None = None
    # Whether usage objects report cached tokens (--enable-prompt-tokens-details):
    # True or False when the config says, None when it cannot be known.
    prompt_tokens_details: bool | None = None

    @property
    def topology(self) -> Topology:
        return Topology.pipeline(self.pp_size, self.tp_size)


@dataclass(frozen=True)
class TargetFacts:
    """What the run learned of the server once it answered (``soak.run.target_facts``
    reads it once, at start-up), handed to the parts that need a live target. The
    root PID is not a fact of the server's answers: it changes with a restart, and
    the target alone carries it."""

    layout: TargetLayout
    base_url: str
    # The model the requests name: the config's, else the first /v1/models lists.
    model: str | None
    models: tuple[str, ...]
    # From /v1/models (None: not listed, the workload's fit is not checked).
    max_model_len: int | None
    # From GET /version (soak.versions.profile_for).
    version_profile: VllmProfile
    # GET /version's own words as the build identity records them (the profile
    # keeps only a version it can parse); the same one read.
    reported_version: str | None = None


# --- the detector's results ----------------------------------------------------------


@dataclass(frozen=True)
class RuleStatus:
    """One rule's verdict at one instant, with the reasons behind it."""

    rule: str
    state: RuleState
    kind: IncidentKind = IncidentKind.HANG
    # Best estimate of when progress stopped (for a pending or fired rule).
    onset_at: float | None = None
    elapsed_s: float | None = None
    threshold_s: float | None = None
    reasons: tuple[str, ...] = ()
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    rule: str
    kind: IncidentKind
    onset_at: float
    decided_at: float
    reasons: tuple[str, ...]
    # signals, since when, thresholds in force
    evidence: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "kind": self.kind.value,
            "onset_at": self.onset_at,
            "decided_at": self.decided_at,
            "reasons": list(self.reasons),
            "evidence": dict(self.evidence),
        }


@dataclass(frozen=True)
class Assessment:
    now: float
    state: DetectorState
    rules: tuple[RuleStatus, ...]
    new_incidents: tuple[Decision, ...] = ()

    def rule(self, name: str) -> RuleStatus:
        for status in self.rules:
            if status.rule == name:
                return status
        raise KeyError(name)


# --- detection latency (derived) ------------------------------------------------------


def _instant(value: Any) -> float | None:
    """Unix seconds a date can be made of (as soak.jsonl.is_timestamp); anything else
    (None, NaN, inf, a bool, a string, an int past a float) reads as absent. Compared
    before converting, so a huge int never overflows."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0 <= value < 1e11 else None


@dataclass(frozen=True)
class DetectionLatency:
    """The detector decided between ``min_s`` and ``max_s`` seconds after the onset.

    ``point``: the rule gave no onset interval, so both are the one onset estimate's
    distance and a display must say it is a point estimate, not invent a width.
    ``onset_earliest``/``onset_latest`` (unix seconds) are the onset span it is
    measured from; None where it was read back from summary.json alone."""

    min_s: float
    max_s: float
    point: bool
    onset_earliest: float | None = None
    onset_latest: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"min": round(self.min_s, 3), "max": round(self.max_s, 3), "point": self.point}

    @classmethod
    def from_json(cls, value: Any) -> "DetectionLatency | None":
        """summary.json's ``detection_latency_s`` as written, or None where it is not
        two seconds (a hand edit, a damaged file): the reader then has nothing to show."""
        if not isinstance(value, Mapping):
            return None
        low, high = _instant(value.get("min")), _instant(value.get("max"))
        if low is None or high is None:
            return None
        return cls(min(low, high), max(low, high), point=value.get("point") is True)


def detection_latency(*, detected_at: Any, onset_at: Any, onset_earliest_at: Any = None,
                      onset_latest_at: Any = None) -> DetectionLatency | None:
    """How long after the onset the decision came, from an incident's times. Total:
    any value may be junk (an old or hand-edited summary.json); None only where no
    detection time or no onset at all can be read.

    With both interval ends: detected - latest .. detected - earliest (ends swapped
    if given the wrong way round). Without: the one onset estimate, as a point. A
    decision cannot precede its onset, so a latency below zero (clocks, hand edits)
    reads as 0."""
    detected = _instant(detected_at)
    if detected is None:
        return None
    earliest, latest = _instant(onset_earliest_at), _instant(onset_latest_at)
    if earliest is not None and latest is not None:
        earliest, latest = min(earliest, latest), max(earliest, latest)
        return DetectionLatency(max(0.0, detected - latest), max(0.0, detected - earliest), point=False,
                                onset_earliest=earliest, onset_latest=latest)
    onset = _instant(onset_at)
    onset = onset if onset is not None else (latest if latest is not None else earliest)
    if onset is None:
        return None
    gap = max(0.0, detected - onset)
    return DetectionLatency(gap, gap, point=True, onset_earliest=onset, onset_latest=onset)


# --- the responder's result ----------------------------------------------------------


@dataclass(frozen=True)
class IncidentRecord:
    """CONTRACTS.md's incident fields, plus what the kill path measured.

    ``killed_pids`` are the processes SIGKILL was sent to; ``gpus_released`` is
    true once the GPU source showed no target process and memory back within
    tolerance; ``gpu_free_s`` counts from the SIGKILL to that moment (None when
    it never happened within the bounded wait). ``evidence`` is relative to the
    run directory.
    """

    number: int
    kind: IncidentKind
    rule: str
    onset_at: float
    detected_at: float
    killed_pids: tuple[int, ...]
    # None: the GPU source could not confirm either way (the reason is in notes).
    gpus_released: bool | None
    gpu_free_s: float | None
    evidence: str
    summary: str
    reasons: tuple[str, ...] = ()
    killed_at: float | None = None
    gpus_free_at: float | None = None
    # PIDs still alive after the kill wait (should be empty; a non-empty tuple is a failure).
    survivors: tuple[int, ...] = ()
    # One line per evidence or kill step that failed, timed out or was skipped.
    notes: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)
    # The flight-recorder diagnosis line (soak.flightrec.diagnose), when the ranks dumped.
    diagnosis: str | None = None
    # The onset interval the evidence allows (issue 37; None: the rule gives none).
    onset_earliest_at: float | None = None
    onset_latest_at: float | None = None

    def __post_init__(self) -> None:
        # "hang" given for IncidentKind.HANG (a record read back from JSON) is the same member.
        object.__setattr__(self, "kind", IncidentKind(self.kind))

    @property
    def detection_latency(self) -> DetectionLatency | None:
        """Detected between min_s and max_s seconds after the onset (issue 37)."""
        return detection_latency(detected_at=self.detected_at, onset_at=self.onset_at,
                                 onset_earliest_at=self.onset_earliest_at, onset_latest_at=self.onset_latest_at)

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "kind": self.kind.value,
            "rule": self.rule,
            "onset_at": self.onset_at,
            "detected_at": self.detected_at,
            "killed_pids": list(self.killed_pids),
            "gpus_released": self.gpus_released,
            "gpu_free_s": self.gpu_free_s,
            "evidence": self.evidence,
            "summary": self.summary,
            "reasons": list(self.reasons),
            "killed_at": self.killed_at,
            "gpus_free_at": self.gpus_free_at,
            "survivors": list(self.survivors),
            "notes": list(self.notes),
            "extra": dict(self.extra),
            "diagnosis": self.diagnosis,
            "onset_earliest_at": self.onset_earliest_at,
            "onset_latest_at": self.onset_latest_at,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "IncidentRecord":
        data = dict(obj)
        for name in ("killed_pids", "reasons", "survivors", "notes"):
            data[name] = tuple(data.get(name) or ())
        data["extra"] = dict(data.get("extra") or {})
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})


# --- the run and its sinks -----------------------------------------------------------


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    run_dir: Path
    started_at: float  # unix seconds
    duration_s: float  # planned load duration (warm-up included)
    warmup_s: float
    target_kind: TargetKind
    base_url: str
    model: str | None
    root_pid: int | None
    config: Mapping[str, Any] = field(default_factory=dict)  # resolved, secrets redacted
    gpu_count: int | None = None
    plan: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_kind", TargetKind(self.target_kind))


class RunSink(Protocol):
    """Where everything the run learns goes (the run store, the exporter, the
    live view). Calls come from the event loop's thread, are synchronous and
    must be quick (append a line, bump a counter)."""

    def on_start(self, info: RunInfo) -> None: ...

    def on_sample(self, sample: Sample) -> None: ...

    def on_request(self, record: RequestRecord) -> None: ...

    def on_assessment(self, assessment: Assessment) -> None: ...

    def on_incident(self, incident: IncidentRecord) -> None: ...

    def on_event(self, type: str, fields: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class GpuSourceLike(Protocol):
    """Where GPU readings come from (NVML, dcgm-exporter, the simulator, the server's
    own processes): the probes sample it, the responder reads it again around a kill."""

    async def open(self) -> None: ...  # before the run: NVML missing raises GpuUnavailable (exit 3)

    async def read(self) -> GpuSample: ...

    async def aclose(self) -> None: ...
