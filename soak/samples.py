"""Immutable sample records: what probes produce, the detector consumes, and the
run store writes one JSON object a line (``samples.jsonl``).

Every record has ``ts`` (unix seconds, from the run's clock) and a ``kind`` tag.
``to_json()`` gives the line's object; ``sample_from_json()`` reads one back, so
a recorded run replays through the detector exactly as it was seen live.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, Mapping, Union

from soak.plain import plain


class CutCause(str, Enum):
    """What cut a request short (``RequestRecord.cut_by``): the harness, never the server."""

    DRAIN = "drain"  # the end-of-run drain ran out
    INCIDENT = "incident"  # the harness was about to kill or restart the target
    INTERRUPT = "interrupt"  # Ctrl-C / SIGTERM to the harness, or its own fault

    def __str__(self) -> str:  # the value wherever it is formatted (labels, f-strings)
        return self.value


class GpuSource(str, Enum):
    NVML = "nvml"
    DCGM = "dcgm"
    SIM = "sim"
    # Not a GPU: each pipeline stage's CPU time from /proc (soak.probes.stage_cpu),
    # for servers without GPUs (vLLM's CPU build). Shown as "stage CPU".
    STAGE_CPU = "stage_cpu"


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one instant. Optional fields are None where the source lacks them."""

    index: int
    util_pct: float
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    pcie_tx_kbs: float | None = None
    pcie_rx_kbs: float | None = None
    pids: tuple[int, ...] = ()
    # NVML's 200 ms utilization samples since the previous reading, oldest first.
    util_samples: tuple[float, ...] = ()
    uuid: str | None = None


@dataclass(frozen=True)
class GpuSample:
    kind: ClassVar[str] = "gpu"
    ts: float
    source: GpuSource
    gpus: tuple[GpuReading, ...]
    error: str | None = None
    # When the source last produced new readings (unix seconds); None: new as of ``ts``.
    # An exporter collecting every 30 s repeats its last values in between; a wedged
    # NVML call gives errors: either way ``ts - fresh_at`` says how old the readings are.
    fresh_at: float | None = None


@dataclass(frozen=True)
class ServerSample:
    """One scrape of /metrics. ``values`` is keyed by soak.metric_names keys,
    summed over label sets (histograms as ``<key>_sum`` / ``<key>_count``)."""

    kind: ClassVar[str] = "server"
    ts: float
    ok: bool
    values: Mapping[str, float] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    error: str | None = None
    latency_s: float | None = None


@dataclass(frozen=True)
class HealthSample:
    kind: ClassVar[str] = "health"
    ts: float
    ok: bool
    status: int | None = None
    latency_s: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class ProcessSample:
    """Whether the target's root process is alive (launched or attached with a PID)."""

    kind: ClassVar[str] = "process"
    ts: float
    pid: int
    alive: bool
    exit_code: int | None = None
    tree_pids: tuple[int, ...] = ()


@dataclass(frozen=True)
class ClientSample:
    """Client-side progress across the in-flight streams."""

    kind: ClassVar[str] = "client"
    ts: float
    in_flight: int
    bytes_total: int
    tokens_total: int
    requests_done: int
    # Seconds since the stalest in-flight stream last generated a token (or started,
    # before its first); None when idle. Bytes alone (keep-alives) are not progress.
    max_silence_s: float | None = None
    # Streams past their first token that have been silent longest.
    streaming: int = 0
    # Seconds since any stream (in flight or ended) last generated a token; None before
    # the first. The probe runs every half second or so; this dates the last token to
    # the moment it arrived, so a stop is timed from it, not from the next probe.
    token_silence_s: float | None = None


@dataclass(frozen=True)
class LogSample:
    """A line of the server's log that matched a known signature."""

    kind: ClassVar[str] = "log"
    ts: float
    signature: str
    line: str
    fatal: bool = False
    fields: Mapping[str, Any] = field(default_factory=dict)


class CanaryVerdict(str, Enum):
    """What the correctness oracle (``soak.oracle.compare``) made of one canary answer."""

    REFERENCE = "reference"  # the first answer of this run to a canary with no reference file entry: it becomes the reference
    MATCH = "match"  # the same tokens as the reference
    EXPLAINED = "explained"  # diverged where the server's own logprobs show a near tie
    CORRUPT = "corrupt"  # diverged where nothing explains it
    CROSSTALK = "crosstalk"  # the answer is another canary's reference: another request's tokens reached it
    UNJUDGED = "unjudged"  # no answer to judge (the request failed, timed out, or came without logprobs)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class CanarySample:
    """One canary's answer, judged: a greedy request the oracle sent beside the
    load (never counted as workload), compared with its reference."""

    kind: ClassVar[str] = "canary"
    ts: float  # when the answer was judged
    canary_id: str
    verdict: CanaryVerdict | str
    started_at: float | None = None
    e2e_s: float | None = None
    long: bool = False
    prompt_tokens: int | None = None
    output_tokens: int = 0
    # The first position where the answer left the reference (None: it did not).
    position: int | None = None
    # "run" (this run's first answer) or "file" (a reference recorded from a known-good build).
    reference_source: str | None = None
    crosstalk_with: str | None = None
    # The canaries' measured share of server time so far (0..1).
    share: float | None = None
    error: str | None = None
    # Bounded: the tokens around the position, the alternatives there, the server's state.
    evidence: Mapping[str, Any] = field(default_factory=dict)


Sample = Union[GpuSample, ServerSample, HealthSample, ProcessSample, ClientSample, LogSample, CanarySample]
SAMPLE_TYPES: dict[str, type] = {
    t.kind: t for t in (GpuSample, ServerSample, HealthSample, ProcessSample, ClientSample, LogSample, CanarySample)
}


def to_json(sample: Sample) -> dict[str, Any]:
    """The line's object: ``kind`` first, then the fields (``soak.plain``)."""
    return plain(sample)


def sample_from_json(obj: Mapping[str, Any]) -> Sample:
    kind = obj.get("kind")
    cls = SAMPLE_TYPES.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown sample kind {kind!r}, known: {', '.join(SAMPLE_TYPES)}")
    # ``mono`` is the run store's (run-relative monotonic seconds), not a field of the record.
    data = {k: v for k, v in obj.items() if k not in ("kind", "mono")}
    if cls is GpuSample:
        data["source"] = GpuSource(data["source"])
        data["gpus"] = tuple(
            GpuReading(**{**g, "pids": tuple(g.get("pids", ())), "util_samples": tuple(g.get("util_samples", ()))})
            for g in data["gpus"]
        )
    for name, f in cls.__dataclass_fields__.items():  # type: ignore[attr-defined]
        if name in data and isinstance(data[name], list):
            data[name] = tuple(data[name])
    return cls(**data)


@dataclass(frozen=True)
class RequestRecord:
    """One finished request: a line of requests.jsonl."""

    request_id: str
    session: str | None
    turn: int | None
    started_at: float
    ended_at: float
    outcome: str  # "ok" or a TransportError outcome: refused, reset, http_status, timeout_<phase>, ...
    prompt_tokens: int | None = None  # as the server reported (usage), else the plan's figure
    planned_prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int = 0
    ttft_s: float | None = None
    itl_mean_s: float | None = None
    itl_p50_s: float | None = None
    itl_p99_s: float | None = None
    itl_max_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    bytes_sent: int = 0
    bytes_received: int = 0
    http_status: int | None = None
    error: str | None = None
    warmup: bool = False
    finish_reason: str | None = None
    # Outcome "aborted" only: what cut it short (a ``CutCause`` value; read back
    # from JSON, the plain string). Not the server's failure.
    cut_by: CutCause | str | None = None
    # Odd but survivable things in the stream (a usage count that is not a count,
    # a finish_reason that is not a string): how many, and the first few.
    anomalies: int = 0
    anomaly_notes: tuple[str, ...] = ()
    # Run-relative monotonic seconds (soak.clock: the run store's origin) at the
    # start and end: what durations and windows take; started_at/ended_at label.
    started_mono: float | None = None
    ended_mono: float | None = None
    # The model the answer's chunks named (the first seen; a change mid-stream is an anomaly).
    model: str | None = None
    # What the server's usage claimed for completion tokens, before any cap
    # (``output_tokens`` is what was counted from the text received).
    usage_output_tokens: int | None = None
    # The answer's text looked degenerate (soak.load.degenerate): "repetition",
    # "replacement_char" or "undecodable"; None when it did not.
    degenerate: str | None = None

    def to_json(self) -> dict[str, Any]:
        return plain(self)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "RequestRecord":
        known = cls.__dataclass_fields__  # type: ignore[attr-defined]
        data = {k: v for k, v in obj.items() if k in known}
        if isinstance(data.get("anomaly_notes"), list):
            data["anomaly_notes"] = tuple(data["anomaly_notes"])
        return cls(**data)


# Outcomes of a request that never reached a server willing to stream it (no
# HTTP status recorded): the server processed none of its prompt.
REJECTED_BEFORE_STREAM = frozenset({"refused", "reset", "timeout_connect", "error", "malformed_stream", "http_status"})


def server_accepted(record: Mapping[str, Any]) -> bool:
    """Whether the server took the request in (its prompt is in the server's
    counters): a 2xx status; with no status recorded, any outcome but one that
    says the server refused, reset or failed it before answering. The one
    place client token totals are made comparable with the server's."""
    status = record.get("http_status")
    if isinstance(status, int) and not isinstance(status, bool):
        return 200 <= status < 300
    outcome = record.get("outcome")
    return not (isinstance(outcome, str) and outcome in REJECTED_BEFORE_STREAM)
