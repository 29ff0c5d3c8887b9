"""Read a run directory (CONTRACTS.md + docs/ARCHITECTURE.md) into columns for the report.

This is the report's only input. It stays thin: the directory is opened
through ``soak.store.rundir.RunDir`` (the one answer to "is this a run?", the
one parse of config.yaml, the segment-aware sample reads); the run's verdict
and totals come from the judge (``soak.judge.rejudge``: the run's own reading,
also for a run that was cut off), held as a typed
``soak.summary_file.RunSummary``; this module only turns the JSONL files into
arrays for plots and lists for tables. A torn last line (a harness killed
mid-write) is skipped and counted, never fatal.
"""

from __future__ import annotations

import math
import sys
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from soak.errors import ConfigError, SoakError
from soak.jsonl import (FieldCheck, is_bool, is_dict, is_int, is_list, is_number, is_str, is_timestamp, parse_line,
                        read_json, typed_fields)
from soak.judge import rejudge
from soak.report.oracle import CanaryMark, CanaryTally, canary_mark, tally, thin
from soak.store.rundir import MARKERS_TEXT, RunDir
from soak.store.segments import line_head
from soak.store.store import EVENTS, REQUESTS
from soak.store.summary import EVENT_TYPES, REQUEST_TYPES
from soak.samples import GpuSource
from soak.summary_file import RunSummary

# The timelines are binned to at most 240 columns (the heatmap; the other plots fewer); more points than this per
# series only cost time and memory. A 66-minute run at the real probe rates is
# read whole; a 24-hour one keeps a sample every few seconds of each series.
MAX_TIMELINE_POINTS = 20_000
TIMELINE_KINDS = frozenset({"gpu", "server", "client"})

# The server series the report plots and ``soak compare`` windows (short keys of
# soak.metric_names.VLLM_METRICS); the summary's own counters are
# soak.store.summary.SERVER_KEYS, a different question.
PLOTTED_SERVER_SERIES = ("generation_tokens", "prefix_cache_hits", "prefix_cache_queries", "kv_cache_usage_perc",
                         "num_requests_running")


# The GPU columns a sample may name: an index (or a stage) past this is a field
# of the wrong type, read as absent and counted, never a column (the heatmap's
# allocation is rows x columns: one hostile index must not size it).
MAX_GPUS = 256


def _gpu_index(value: Any) -> bool:
    return type(value) is int and 0 <= value < MAX_GPUS


# The fields of each sample kind the report reads, with their types: a field of
# another type (a damaged or hostile line) reads as absent and is counted
# (soak.jsonl.typed_fields), so one bad line never loses the run.
SAMPLE_TYPES: dict[str, Mapping[str, FieldCheck]] = {
    "gpu": {"gpus": is_list, "source": is_str},
    "server": {"ok": is_bool, "values": is_dict},
    "client": {"tokens_total": is_number, "in_flight": is_number},
    "log": {"line": is_str},
}
GPU_READING_TYPES: Mapping[str, FieldCheck] = {"index": _gpu_index, "util_pct": is_number}
SERVER_VALUE_TYPES: Mapping[str, FieldCheck] = {k: is_number for k in PLOTTED_SERVER_SERIES}


def _strs(value: Any) -> bool:
    return is_list(value) and all(is_str(x) for x in value)


def _ints(value: Any) -> bool:
    return is_list(value) and all(is_int(x) for x in value)


# incident.json's fields as the report reads them (normalized: the responder's
# record and decision flattened): of another type, absent and counted.
INCIDENT_TYPES: Mapping[str, FieldCheck] = {
    "number": is_int, "status": is_str, "kind": is_str, "rule": is_str, "summary": is_str, "evidence": is_str,
    "diagnosis": is_str, "onset_at": is_timestamp, "detected_at": is_timestamp, "onset_earliest_at": is_timestamp,
    "onset_latest_at": is_timestamp, "decided_at": is_timestamp, "killed_pids": _ints, "gpus_released": is_bool,
    "gpu_free_s": is_number, "reasons": _strs, "notes": _strs, "steps": is_dict, "decision_evidence": is_dict,
    "evidence_signals": is_dict, "detection_latency_s": is_dict,
}


def typed_incident(record: Mapping[str, Any], stats: dict[str, int] | None = None) -> dict[str, Any]:
    """An incident record with every field of the wrong type left out (counted in
    ``stats['wrong_type_fields']``); the evidence's signals keep only values the
    page can show (a ``*_at`` signal that is no timestamp is left out too)."""
    out = dict(typed_fields(dict(record), INCIDENT_TYPES, stats))
    for key in ("decision_evidence", "evidence_signals"):
        evidence = out.get(key)
        if not isinstance(evidence, dict):
            continue
        signals = evidence.get("signals", evidence)
        if not isinstance(signals, dict):
            continue
        wrong = [k for k, v in signals.items() if isinstance(k, str) and k.endswith("_at")
                 and isinstance(v, (int, float)) and not is_timestamp(v)]
        if wrong:
            if stats is not None:
                stats["wrong_type_fields"] = stats.get("wrong_type_fields", 0) + len(wrong)
            kept = {k: v for k, v in signals.items() if k not in wrong}
            out[key] = {**evidence, "signals": kept} if "signals" in evidence else kept
    return out


# The figures of a request the report reads; the rest of a record stays on disk.
REQUEST_FIELDS = ("started_at", "ended_at", "ttft_s", "itl_mean_s", "itl_p99_s", "tpot_s", "e2e_s",
                  "prompt_tokens", "output_tokens", "cached_tokens")


@dataclass(frozen=True)
class RequestColumns:
    """The measured requests (warm-up left out) as columns, NaN where a record
    lacks a figure. A 24-hour soak records a few hundred thousand requests: as
    dicts they were most of the report's memory, as columns 90 bytes each."""

    outcome: tuple[str, ...]
    columns: Mapping[str, np.ndarray]
    ok: np.ndarray  # a mask of the requests that ended ``ok``

    def __len__(self) -> int:
        return len(self.outcome)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def ok_values(self, name: str) -> np.ndarray:
        """``name`` over the ok requests that report it."""
        values = self.columns[name][self.ok]
        return values[np.isfinite(values)]

    def outcome_counts(self) -> list[tuple[str, int]]:
        counts: dict[str, int] = {}
        for outcome in self.outcome:
            counts[outcome] = counts.get(outcome, 0) + 1
        return sorted(counts.items(), key=lambda kv: -kv[1])


class RequestColumnsBuilder:
    """Folds request records into ``RequestColumns``, one at a time (summarize's pass)."""

    def __init__(self) -> None:
        self._outcome: list[str] = []
        self._columns = {name: array("d") for name in REQUEST_FIELDS}
        self._appends = tuple((name, column.append) for name, column in self._columns.items())

    def add(self, record: Mapping[str, Any]) -> None:
        get = record.get
        if get("warmup"):
            return
        self._outcome.append(sys.intern(str(get("outcome"))))
        for name, append in self._appends:
            value = get(name)
            # the exact types first: this runs for every figure of every request
            append(value if type(value) is float or type(value) is int or isinstance(value, (int, float))
                   else math.nan)

    def build(self) -> RequestColumns:
        outcome = tuple(self._outcome)
        return RequestColumns(outcome=outcome,
                              columns={name: np.frombuffer(column, dtype=float) if column else np.empty(0)
                                       for name, column in self._columns.items()},
                              ok=np.fromiter((o == "ok" for o in outcome), dtype=bool, count=len(outcome)))


@dataclass
class Incident:
    number: int
    path: Path
    record: dict[str, Any]
    files: list[str]


@dataclass
class RunData:
    path: Path
    summary: RunSummary
    config_text: str
    config: dict[str, Any]
    plan: dict[str, Any] | None
    events: list[dict[str, Any]]
    requests: RequestColumns
    gpu_ts: np.ndarray
    gpu_util: np.ndarray  # (samples, gpus), NaN where a GPU was not read
    server_ts: np.ndarray
    server: dict[str, np.ndarray]
    client_ts: np.ndarray
    client_tokens: np.ndarray
    client_in_flight: np.ndarray
    log_lines: list[dict[str, Any]]
    incidents: list[Incident]
    bad_lines: dict[str, int] = field(default_factory=dict)
    # fields of the wrong type, read as absent, by file ("samples.jsonl", "incidents/N/incident.json")
    wrong_type_fields: dict[str, int] = field(default_factory=dict)
    gpu_source: GpuSource | None = None  # STAGE_CPU: the rows are stages' CPU, not GPUs
    # the oracle's judged canaries (samples of kind "canary"), in time order (soak.report.oracle)
    canaries: tuple[CanaryMark, ...] = ()  # thinned for drawing past soak.report.oracle.MAX_MARKS
    canary_tally: CanaryTally = field(default_factory=CanaryTally)  # every canary counted

    @property
    def stages(self) -> tuple[tuple[int, ...], ...]:
        """Column indices of ``gpu_util`` per pipeline stage, first stage first."""
        return stage_layout(self.config, self.gpu_util.shape[1] if self.gpu_util.ndim == 2 else 0,
                            stage_cpu=self.gpu_source is GpuSource.STAGE_CPU)

    @property
    def start(self) -> float | None:
        if self.summary.started_at is not None:
            return self.summary.started_at
        candidates = [a[0] for a in (self.gpu_ts, self.server_ts, self.client_ts) if a.size]
        candidates += [e["ts"] for e in self.events[:1] if isinstance(e.get("ts"), (int, float))]
        return min(candidates) if candidates else None


def stage_layout(config: Mapping[str, Any], columns: int, *, stage_cpu: bool) -> tuple[tuple[int, ...], ...]:
    """The GPUs of each pipeline stage as the recorded config gives them (pp and
    tp of the simulator, the config or the launch line); one stage a column where
    the readings are stage CPU, or where the config's layout does not match the
    GPUs that were read (an attached server sharing a box)."""
    one_each = tuple((i,) for i in range(columns))
    if stage_cpu or columns == 0:
        return one_each
    from pydantic import TypeAdapter, ValidationError

    from soak.target.config import TargetConfig, target_layout

    target = config.get("target") if isinstance(config.get("target"), Mapping) else {"kind": "simulator"}
    try:
        topology = target_layout(TypeAdapter(TargetConfig).validate_python(target)).topology
    except (ValidationError, ValueError, TypeError):
        return one_each
    return topology.stages if topology.gpu_count == columns else one_each


def _events(run: RunDir, bad: dict[str, int]) -> list[dict[str, Any]]:
    """events.jsonl's object lines, fields of the wrong type left out; unreadable
    lines (torn, bad, past a bound) counted in ``bad`` by file name."""
    stats: dict[str, int] = {}
    records = list(run.events(stats=stats, fields=EVENT_TYPES))
    unreadable = stats.get("bad_lines", 0) + stats.get("torn_lines", 0)
    if unreadable:
        bad[EVENTS] = bad.get(EVENTS, 0) + unreadable
    return records


def load_run(run_dir: str | Path, *, summary: Mapping[str, Any] | None = None) -> RunData:
    """The run directory read whole for the report, compare and history.

    Total: a damaged directory (bad or deep lines, fields of the wrong type, cut
    gzip segments, missing files) still reads, the damage counted in
    ``bad_lines`` and the summary's ``records``; what cannot be read at all is
    one ``ConfigError`` naming the directory, never another exception.
    ``summary``: the run's summary.json as its end wrote it (the report child):
    the run is not judged again, requests.jsonl is read for the columns only."""
    path = Path(run_dir)
    try:
        return _load_run(path) if summary is None else _load_run(path, summary)
    except SoakError:
        raise
    except (MemoryError, RecursionError, Exception) as exc:  # a damage no reader foresaw: one line
        raise ConfigError(f"cannot read the run: {type(exc).__name__}: {exc}"[:300], path=path) from exc


def _load_run(path: Path, judged: Mapping[str, Any] | None = None) -> RunData:
    run = RunDir(path)
    if not path.is_dir():
        raise ConfigError("not a run directory", path=path)
    if not run.is_run:
        raise ConfigError(f"not a run directory ({MARKERS_TEXT})", path=path)
    bad: dict[str, int] = {}
    events = _events(run, bad)

    gpu_ts: list[float] = []
    gpu_source: GpuSource | None = None  # STAGE_CPU once a stage-CPU reading is seen
    gpu_rows: list[dict[int, float]] = []
    server_ts: list[float] = []
    server_cols: dict[str, list[float]] = {k: [] for k in PLOTTED_SERVER_SERIES}
    client_ts: list[float] = []
    client_tokens: list[float] = []
    client_in_flight: list[float] = []
    log_lines: list[dict[str, Any]] = []
    canaries: list[CanaryMark] = []
    # One pass over requests.jsonl: the judge's figures and the report's columns.
    columns = RequestColumnsBuilder()
    request_stats: dict[str, int] = {}
    if judged is None:
        summary = rejudge(run, on_request=columns.add, request_stats=request_stats)[1]
    else:
        for record in run.requests(stats=request_stats, fields=REQUEST_TYPES):
            columns.add(record)
        summary = RunSummary.from_json(judged)
    requests = columns.build()
    unreadable_requests = request_stats.get("bad_lines", 0) + request_stats.get("torn_lines", 0)
    if unreadable_requests:
        bad[REQUESTS] = unreadable_requests
    started, ended = summary.started_at, summary.ended_at
    span = ended - started if started is not None and ended is not None else 0.0
    gap = max(0.0, span / MAX_TIMELINE_POINTS)
    last_kept: dict[str, float] = {}
    sample_stats: dict[str, int] = {}
    for source, number, raw in run.sample_lines(stats=sample_stats):  # rolled gzip segments, then samples.jsonl
        kind, ts = line_head(raw)
        if kind is not None and kind not in TIMELINE_KINDS and kind not in ("log", "canary"):
            continue  # health, process: not plotted
        if gap and kind in TIMELINE_KINDS and ts is not None and math.isfinite(ts):
            if ts < last_kept.get(kind, float("-inf")) + gap:
                continue
            last_kept[kind] = ts
        s = parse_line(raw, path=source, number=number, errors="skip", stats=sample_stats)
        if not isinstance(s, dict):
            continue
        kind, ts = s.get("kind"), s.get("ts")
        if kind == "canary":  # read totally: a field of the wrong type reads as absent
            mark = canary_mark(s)
            if mark is not None:
                canaries.append(mark)
            continue
        if not is_str(kind) or kind not in SAMPLE_TYPES:
            continue
        if not is_timestamp(ts):
            if ts is not None:  # a reading with no time to place it at: the line is passed over, the field counted
                _count(sample_stats, "wrong_type_fields")
            continue
        s = typed_fields(s, SAMPLE_TYPES[kind], sample_stats)
        if kind == "gpu":
            if s.get("error") or not s.get("gpus"):
                continue
            readings = s["gpus"]
            if s.get("source") == GpuSource.STAGE_CPU.value:
                # stage CPU: one reading per stage, in stage order; a row is a stage
                gpu_source = GpuSource.STAGE_CPU
                row = {stage: _util(g, sample_stats) for stage, g in enumerate(readings[:MAX_GPUS])}
                _count(sample_stats, "wrong_type_fields", max(0, len(readings) - MAX_GPUS))
            else:
                row = {}
                for g in readings:
                    if not isinstance(g, dict):
                        _count(sample_stats, "wrong_type_fields")
                        continue
                    g = typed_fields(g, GPU_READING_TYPES, sample_stats)
                    if g.get("index") is not None:
                        row[g["index"]] = _util(g, sample_stats)
            gpu_ts.append(ts)
            gpu_rows.append(row)
        elif kind == "server":
            if s.get("ok") is not True:
                continue
            values = typed_fields(s.get("values") or {}, SERVER_VALUE_TYPES, sample_stats)
            server_ts.append(ts)
            for k, col in server_cols.items():
                v = values.get(k)
                col.append(float(v) if v is not None else np.nan)
        elif kind == "client":
            client_ts.append(ts)
            tokens, in_flight = s.get("tokens_total"), s.get("in_flight")
            client_tokens.append(float(tokens) if tokens is not None else np.nan)
            client_in_flight.append(float(in_flight) if in_flight is not None else np.nan)
        elif kind == "log":
            log_lines.append(s)
    unreadable = sample_stats.get("bad_lines", 0) + sample_stats.get("torn_lines", 0) + sample_stats.get("bad_segments", 0)
    if unreadable:
        bad["samples.jsonl"] = unreadable  # the open segment and any rolled ones
    wrong_types: dict[str, int] = {}
    if sample_stats.get("wrong_type_fields"):
        wrong_types["samples.jsonl"] = sample_stats["wrong_type_fields"]

    # columns: GPU indices as read, each under MAX_GPUS (so the array is at most rows x MAX_GPUS)
    gpu_count = 1 + max((max(r) for r in gpu_rows if r), default=-1)
    util = np.full((len(gpu_rows), gpu_count), np.nan)
    for i, row in enumerate(gpu_rows):
        for j, v in row.items():
            util[i, j] = v

    plan = run.plan_json()
    return RunData(
        path=path, summary=summary, config_text=run.config_text, config=dict(run.config),
        plan=plan if isinstance(plan, dict) else None, events=events,
        requests=requests, gpu_ts=np.asarray(gpu_ts), gpu_util=util, server_ts=np.asarray(server_ts),
        server={k: np.asarray(v) for k, v in server_cols.items()}, client_ts=np.asarray(client_ts),
        client_tokens=np.asarray(client_tokens), client_in_flight=np.asarray(client_in_flight),
        log_lines=log_lines, incidents=_incidents(run, wrong_types), bad_lines=bad, gpu_source=gpu_source,
        wrong_type_fields=wrong_types, canaries=thin(sorted(canaries, key=lambda m: m.ts)),
        canary_tally=tally(canaries),
    )


def _util(reading: Any, stats: dict[str, int]) -> float:
    """A GPU (or stage) reading's ``util_pct``; NaN where it is missing or of the wrong type (counted)."""
    if not isinstance(reading, dict):
        _count(stats, "wrong_type_fields")
        return np.nan
    value = reading.get("util_pct")
    if value is None:
        return np.nan
    if not is_number(value):
        _count(stats, "wrong_type_fields")
        return np.nan
    return float(value)


def _count(stats: dict[str, int], key: str, n: int = 1) -> None:
    if n:
        stats[key] = stats.get(key, 0) + n


def normalize_incident(obj: Mapping[str, Any], stats: dict[str, int] | None = None) -> dict[str, Any]:
    """incident.json as the responder writes it (``{number, status, decision, target,
    steps, record}``) or a flat IncidentRecord, as one flat dict: the record's fields,
    plus ``decision_evidence`` (signals and thresholds in force) and ``steps``.
    Fields of the wrong type (``INCIDENT_TYPES``) read as absent, counted in
    ``stats['wrong_type_fields']``."""
    out: dict[str, Any] = {k: v for k, v in obj.items() if k not in ("record", "decision")}
    decision = obj.get("decision")
    if isinstance(decision, Mapping):
        decision = typed_fields(dict(decision), {**INCIDENT_TYPES, "evidence": is_dict}, stats)
        for key in ("kind", "rule", "onset_at", "reasons"):
            if key in decision:
                out.setdefault(key, decision[key])
        if "decided_at" in decision:
            out.setdefault("detected_at", decision["decided_at"])
        if isinstance(decision.get("evidence"), Mapping):
            out["decision_evidence"] = decision["evidence"]
    record = obj.get("record")
    if isinstance(record, Mapping):
        record = typed_fields(dict(record), INCIDENT_TYPES, stats)
        out.update({k: v for k, v in record.items() if k != "extra"})
    return typed_incident(out, stats)


def _incidents(run: RunDir, wrong_types: dict[str, int] | None = None) -> list[Incident]:
    """incidents/N, by number: the folders summary.json's incidents come from too.
    Fields of the wrong type are counted in ``wrong_types`` by file."""
    out: list[Incident] = []
    for child in run.incident_dirs():
        record = read_json(child / "incident.json")
        number = int(child.name)
        stats: dict[str, int] = {}
        record = normalize_incident(record, stats) if isinstance(record, Mapping) else {
            "number": number, "evidence": f"incidents/{child.name}"}
        record.setdefault("evidence", f"incidents/{child.name}")
        if stats.get("wrong_type_fields") and wrong_types is not None:
            wrong_types[f"incidents/{child.name}/incident.json"] = stats["wrong_type_fields"]
        files = sorted(str(p.relative_to(child)) for p in child.rglob("*") if p.is_file())
        out.append(Incident(number=number, path=child, record=record, files=files))
    return out
