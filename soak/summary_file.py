"""summary.json as a typed record: what the judge writes and every reader reads.

The judge (``soak.judge``) serializes a run's judgement and figures to
summary.json; the report, junit, history, compare, retention, the Pushgateway
push and the CLI read it back through ``RunSummary.from_json``, never by string
key. Reading is total: summary.json is a file on disk, written by an older soak,
by hand or damaged, so a field of the wrong type reads as absent (None, empty),
never as an exception. ``to_json()`` gives back exactly the object read, so a
record passed along keeps what no reader names.

A figure by name (thresholds, compare, history) is read with ``figure(path)``
along a ``soak.thresholds.metrics.RunMetric.summary_path``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, ClassVar, Mapping

from soak.jsonl import is_timestamp
from soak.records import DetectionLatency, Verdict, detection_latency
from soak.numbers import finite


_number = finite  # a finite float or None (soak.numbers)


def _timestamp(value: Any) -> float | None:
    """Unix seconds a date can be made of (soak.jsonl.is_timestamp); a label
    outside that reads as absent, so no reader formats a date that cannot be."""
    return float(value) if is_timestamp(value) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _mapping(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def _amount(value: Any) -> int | float | None:
    """A count that may be fractional (server counters): int kept int, finite float kept."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return _number(value)


def _mappings(value: Any) -> tuple[Mapping[str, Any], ...]:
    return tuple(v for v in value if isinstance(v, Mapping)) if isinstance(value, list) else ()


def _numbers(value: Any) -> Mapping[str, float]:
    """The finite numbers of a mapping, by key (a stats block: mean, p50, ...)."""
    if not isinstance(value, Mapping):
        return {}
    return {k: n for k, v in value.items() if isinstance(k, str) and (n := _number(v)) is not None}


# How a field is read, by its declared type (the annotation's text: this module
# uses postponed annotations); a value of another type reads as absent.
_READERS: Mapping[str, Callable[[Any], Any]] = {
    "bool | None": _bool, "int | None": _int, "float | None": _number, "str | None": _str,
    "int | float | None": _amount, "tuple[str, ...]": _strs, "tuple[Mapping[str, Any], ...]": _mappings,
    "Mapping[str, Any] | None": _mapping,
}


class _Fields:
    """A small record of summary.json read field by field by declared type: the
    object's key is the field's name (or ``_recorded_as[name]``). Not a mapping:
    every field absent."""

    _recorded_as: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def from_json(cls, obj: Any) -> Any:
        obj = obj if isinstance(obj, Mapping) else {}
        return cls(**{f.name: _READERS[f.type](obj.get(cls._recorded_as.get(f.name, f.name)))  # type: ignore[call-arg]
                      for f in fields(cls)})  # type: ignore[arg-type]


class _Section(_Fields):
    """A section of summary.json that a run may lack: None where it is not a mapping."""

    @classmethod
    def from_json(cls, obj: Any) -> Any:
        return super().from_json(obj) if isinstance(obj, Mapping) else None


@dataclass(frozen=True)
class IncidentEntry:
    """One entry of ``incidents``: a detected hang or crash and the response."""

    number: int | None
    kind: str | None  # "hang" | "crash" | "server_gone" (soak.records.IncidentKind)
    rule: str | None
    onset_at: float | None
    detected_at: float | None
    killed_pids: tuple[int, ...]
    gpus_released: bool | None
    evidence: str | None
    summary: str | None
    gpu_free_s: float | None
    diagnosis: str | None  # the flight-recorder diagnosis line (IncidentRecord.diagnosis)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # the detector's reasons: incident.json carries them (a report's merged record), summary.json not
    reasons: tuple[str, ...] = ()

    @property
    def is_hang(self) -> bool:
        return self.kind == "hang"

    @property
    def onset_earliest_at(self) -> float | None:
        """The onset interval's earliest end as recorded (None: no interval, or junk)."""
        return _timestamp(self.raw.get("onset_earliest_at"))

    @property
    def onset_latest_at(self) -> float | None:
        return _timestamp(self.raw.get("onset_latest_at"))

    @property
    def detection_latency(self) -> DetectionLatency | None:
        """Detected between min_s and max_s seconds after the onset: from the onset
        keys (an old summary.json has no ``detection_latency_s``), else as recorded."""
        raw = self.raw
        return detection_latency(detected_at=raw.get("detected_at"), onset_at=raw.get("onset_at"),
                                 onset_earliest_at=raw.get("onset_earliest_at"),
                                 onset_latest_at=raw.get("onset_latest_at")) \
            or DetectionLatency.from_json(raw.get("detection_latency_s"))

    @classmethod
    def from_json(cls, obj: Any) -> IncidentEntry:
        obj = obj if isinstance(obj, Mapping) else {}
        pids = obj.get("killed_pids")
        return cls(
            number=_int(obj.get("number")), kind=_str(obj.get("kind")), rule=_str(obj.get("rule")),
            onset_at=_timestamp(obj.get("onset_at")), detected_at=_timestamp(obj.get("detected_at")),
            killed_pids=tuple(p for p in pids if _int(p) is not None) if isinstance(pids, list) else (),
            gpus_released=_bool(obj.get("gpus_released")), evidence=_str(obj.get("evidence")),
            summary=_str(obj.get("summary")), gpu_free_s=_number(obj.get("gpu_free_s")),
            diagnosis=_str(obj.get("diagnosis")), raw=obj, reasons=_strs(obj.get("reasons")),
        )


@dataclass(frozen=True)
class RequestCounts:
    """``requests``: every line of requests.jsonl, by outcome."""

    ok: int | None
    failed: int | None
    warmup: int | None
    by_outcome: Mapping[str, int]
    cut_by: Mapping[str, int]  # cause (drain, incident, interrupt) -> requests the harness cut

    @property
    def cut(self) -> int:
        """Requests the harness cut short, every cause together."""
        return sum(self.cut_by.values())

    @classmethod
    def from_json(cls, obj: Any) -> RequestCounts:
        obj = obj if isinstance(obj, Mapping) else {}
        outcomes = _mapping(obj.get("by_outcome")) or {}
        return cls(
            ok=_int(obj.get("ok")), failed=_int(obj.get("failed")), warmup=_int(obj.get("warmup")),
            by_outcome={k: v for k, v in outcomes.items() if isinstance(k, str) and _int(v) is not None},
            cut_by={k[len("cut_by_"):]: v for k, v in obj.items()
                    if isinstance(k, str) and k.startswith("cut_by_") and _int(v) is not None},
        )


@dataclass(frozen=True)
class ThresholdRow(_Fields):
    """One threshold's result (soak.thresholds.evaluate.ThresholdResult.to_json)."""

    name: str | None
    passed: bool | None
    outcome: str | None  # "passed" | "breached" | "no_data"
    reason: str | None


@dataclass(frozen=True)
class CriterionRow(_Fields):
    """One failure criterion's result (soak.criteria.rules.CriterionResult.to_json)."""

    name: str | None
    state: str | None  # "pass" | "fail" | ...
    reasons: tuple[str, ...]

    @property
    def failed(self) -> bool:
        return self.state == "fail"


@dataclass(frozen=True)
class ThresholdsEntry:
    """``thresholds``: each threshold's result over the run (soak.thresholds)."""

    passed: bool | None
    breached: tuple[str, ...]
    results: tuple[Mapping[str, Any], ...]
    error: str | None  # the recorded section no longer compiles
    aborted_by: Mapping[str, Any] | None  # a live abort_on_fail stop

    @property
    def rows(self) -> tuple[ThresholdRow, ...]:
        return tuple(ThresholdRow.from_json(r) for r in self.results)

    @classmethod
    def from_json(cls, obj: Any) -> ThresholdsEntry | None:
        if not isinstance(obj, Mapping):
            return None
        results = obj.get("results")
        return cls(
            passed=_bool(obj.get("passed")), breached=_strs(obj.get("breached")),
            results=tuple(r for r in results if isinstance(r, Mapping)) if isinstance(results, list) else (),
            error=_str(obj.get("error")), aborted_by=_mapping(obj.get("aborted_by")),
        )


@dataclass(frozen=True)
class CriteriaEntry:
    """``criteria``: the failure criteria judged on the recorded requests (soak.criteria)."""

    passed: bool | None
    failed: tuple[str, ...]
    results: tuple[Mapping[str, Any], ...]
    note: str | None

    @property
    def rows(self) -> tuple[CriterionRow, ...]:
        return tuple(CriterionRow.from_json(r) for r in self.results)

    @classmethod
    def from_json(cls, obj: Any) -> CriteriaEntry | None:
        if not isinstance(obj, Mapping):
            return None
        results = obj.get("results")
        rows = tuple(r for r in results if isinstance(r, Mapping)) if isinstance(results, list) else ()
        return cls(passed=_bool(obj.get("passed")), failed=_strs(obj.get("failed")), results=rows,
                   note=_str(obj.get("note")))


@dataclass(frozen=True)
class TokenCounts(_Fields):
    """``tokens`` (the client's count) or ``server_tokens`` (the server's counters)."""

    prompt: int | float | None
    generated: int | float | None
    cached: int | float | None  # None: the server did not say (and never for server_tokens)


@dataclass(frozen=True)
class Throughput(_Fields):
    """``throughput``: over the measured time (the load less its warm-up)."""

    generated_tokens_per_s: float | None
    requests_per_s: float | None


@dataclass(frozen=True)
class ClockEntry(_Section):
    """``clock``: which time line the figures were read on, and the wall clock's steps."""

    basis: str | None  # "monotonic" | "wall" (a run recorded before mono existed)
    wall_steps: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class BuildEntry(_Section):
    """``build``: what the nights are grouped by (soak.history.build.build_identity)."""

    label: str | None
    vllm_version: str | None
    launch_digest: str | None  # the build's identity: soak.history.build.identity_of all of this record
    model: str | None
    key: str | None  # recorded as "build" (a word like "key" reads as a secret to the redactor)
    served_model: str | None = None
    settings_digest: str | None = None  # the config's side: flags, VLLM_*/NCCL_* env, the sim: section
    launch: Mapping[str, Any] | None = None  # what the server ran (soak.target.launch), as recorded

    _recorded_as: ClassVar[Mapping[str, str]] = {"key": "build"}


def _error_rate(value: Any) -> float | None:
    # An older summary kept the failure criterion's object here ({"value": ...} or {"rate": ...}).
    if isinstance(value, Mapping):
        value = value.get("value", value.get("rate"))
    return _number(value)


@dataclass(frozen=True)
class RunSummary:
    """summary.json, typed. Build it with ``from_json``; ``raw`` is the object read."""

    verdict: Verdict | None
    cut_off: bool | None
    run_id: str | None
    target: str | None
    model: str | None
    started_at: float | None
    ended_at: float | None
    duration_s: float | None
    planned_duration_s: float | None
    warmup_s: float | None
    stop_reason: str | None
    exit_code: int | None
    verdict_reasons: tuple[str, ...]
    requests: RequestCounts
    error_rate: float | None
    incidents: tuple[IncidentEntry, ...]
    restarts: int | None
    criteria: CriteriaEntry | None
    thresholds: ThresholdsEntry | None
    build: Mapping[str, Any] | None
    server_metrics: Mapping[str, Any] | None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    name: str | None = None
    hostname: str | None = None
    tokens: TokenCounts = TokenCounts(None, None, None)
    server_tokens: TokenCounts = TokenCounts(None, None, None)
    prefix_cache_hit_ratio: float | None = None
    throughput: Throughput = Throughput(None, None)
    latency: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # "ttft_s" -> {"p99": ...}
    clock: ClockEntry | None = None
    warnings: tuple[str, ...] = ()
    records: Mapping[str, int] = field(default_factory=dict)  # lines read, and the damage skipped, by kind
    stopped_by: str | None = None  # why the load stopped (load_stopped's reason): neutral, not why it failed
    time_at_risk_s: float | None = None  # the judge's one count of time at risk (soak.exposure)
    hangs_at_risk: int | None = None  # the hangs that ended an interval at risk
    proof: Mapping[str, Any] | None = None  # prove: the sequential test (soak.prove.sprt.Decision.to_json)

    @classmethod
    def from_json(cls, obj: Any) -> RunSummary:
        obj = obj if isinstance(obj, Mapping) else {}
        verdict = _str(obj.get("verdict"))  # a list or a dict is no verdict (and unhashable)
        incidents = obj.get("incidents")
        return cls(
            verdict=Verdict(verdict) if verdict in {v.value for v in Verdict} else None,
            cut_off=_bool(obj.get("cut_off")),
            run_id=_str(obj.get("run_id")), target=_str(obj.get("target")), model=_str(obj.get("model")),
            started_at=_timestamp(obj.get("started_at")), ended_at=_timestamp(obj.get("ended_at")),
            duration_s=_number(obj.get("duration_s")), planned_duration_s=_number(obj.get("planned_duration_s")),
            warmup_s=_number(obj.get("warmup_s")),
            stop_reason=_str(obj.get("stop_reason")), exit_code=_int(obj.get("exit_code")),
            verdict_reasons=_strs(obj.get("verdict_reasons")),
            requests=RequestCounts.from_json(obj.get("requests")),
            error_rate=_error_rate(obj.get("error_rate")),
            incidents=tuple(IncidentEntry.from_json(i) for i in incidents if isinstance(i, Mapping))
            if isinstance(incidents, list) else (),
            restarts=_int(obj.get("restarts")),
            criteria=CriteriaEntry.from_json(obj.get("criteria")),
            thresholds=ThresholdsEntry.from_json(obj.get("thresholds")),
            build=_mapping(obj.get("build")),
            server_metrics=_mapping(obj.get("server_metrics")),
            raw=obj,
            name=_str(obj.get("name")), hostname=_str(obj.get("hostname")),
            tokens=TokenCounts.from_json(obj.get("tokens")),
            server_tokens=TokenCounts.from_json(obj.get("server_tokens")),
            prefix_cache_hit_ratio=_number(obj.get("prefix_cache_hit_ratio")),
            throughput=Throughput.from_json(obj.get("throughput")),
            latency={k: _numbers(v) for k, v in (_mapping(obj.get("latency")) or {}).items()
                     if isinstance(k, str) and isinstance(v, Mapping)},
            clock=ClockEntry.from_json(obj.get("clock")),
            warnings=_strs(obj.get("warnings")),
            records={k: v for k, v in (_mapping(obj.get("records")) or {}).items()
                     if isinstance(k, str) and _int(v) is not None},
            stopped_by=_str(obj.get("stopped_by")),
            time_at_risk_s=_number(obj.get("time_at_risk_s")), hangs_at_risk=_int(obj.get("hangs_at_risk")),
            proof=_mapping(obj.get("proof")),
        )

    @classmethod
    def of(cls, summary: RunSummary | Any) -> RunSummary:
        """``summary`` itself where it is a RunSummary, else read with ``from_json``:
        for callers that still hold summary.json as parsed (a dict)."""
        return summary if isinstance(summary, RunSummary) else cls.from_json(summary)

    def to_json(self) -> dict[str, Any]:
        return dict(self.raw)

    @property
    def hangs(self) -> int:
        return sum(1 for i in self.incidents if i.is_hang)

    @property
    def at_risk(self) -> tuple[int, float] | None:
        """(hangs, exposure seconds) as the judge counted them; None in a summary
        written before it did."""
        if self.time_at_risk_s is None or self.hangs_at_risk is None:
            return None
        return self.hangs_at_risk, self.time_at_risk_s

    @property
    def build_entry(self) -> BuildEntry | None:
        return BuildEntry.from_json(self.build)

    @property
    def server_metrics_note(self) -> str | None:
        """Why the server's counters cover less than the run, where they do."""
        return _str((self.server_metrics or {}).get("note")) or None

    def figure(self, path: tuple[str, ...]) -> float | None:
        """The number at ``path`` (a RunMetric.summary_path), None where absent or not a number."""
        node: Any = self.raw
        for key in path:
            node = node.get(key) if isinstance(node, Mapping) else None
        return _number(node)


__all__ = [
    "BuildEntry", "ClockEntry", "CriteriaEntry", "CriterionRow", "IncidentEntry", "RequestCounts", "RunSummary",
    "ThresholdRow", "ThresholdsEntry", "Throughput", "TokenCounts",
]
