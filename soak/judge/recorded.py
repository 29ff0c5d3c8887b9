"""What a run directory recorded, read in one pass: the judge's only I/O.

``read_recorded(run_dir)`` opens events.jsonl, config.yaml, requests.jsonl, the
sample segments and incidents/ once each, through ``soak.store.rundir.RunDir``,
and folds them into a ``Recorded`` value: the event digest, the request digest
(plus the threshold window columns when a threshold has a window), the server
counter deltas and metrics coverage, the incidents, and the run's recorded
criteria and thresholds. Everything after this (``soak.judge.judgement``) is
pure. At the end of a run the run loop writes ``run_ended`` after the judgement
and folds it in with ``Recorded.with_run_ended``, without reading again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from soak.criteria.claims import MAX_MODELS, ServerWork, expected_models
from soak.criteria.config import CriteriaConfig
from soak.criteria.rules import LoadSpan
from soak.events import EventType
from soak.jsonl import typed_fields
from soak.percentiles import latency_stats
from soak.prove.live import RISK_EVENTS, RISK_FIELDS
from soak.prove.sprt import Plan
from soak.counters import CounterDelta
from soak.store.rundir import RunDir
from soak.store.summary import (
    EVENT_TYPES, INCIDENT_FIELDS, REQUEST_TYPES, SERVER_KEYS, MetricsCoverage, RequestDigest, disk_incidents,
    fold_requests, merge_incidents, recorded_cut_short, server_counter_deltas, server_values,
)
from soak.store.store import CONFIG
from soak.thresholds.evaluate import Threshold, ThresholdConfigError, compile_thresholds

# A moment of the run as recorded: its wall label and its run-relative monotonic seconds.
Moment = tuple[float | None, float | None]
NOWHEN: Moment = (None, None)

# What a window's figures read of a request (soak.thresholds.metrics.window_values);
# a whole record is several times the size, and a 24-hour run has a few hundred thousand.
WINDOW_FIELDS = ("ended_at", "outcome", "warmup", "output_tokens", "ttft_s", "tpot_s", "e2e_s", "itl_p50_s")
LATENCIES = ("ttft_s", "tpot_s", "e2e_s", "itl_p50_s")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def _later(a: float | None, b: float | None) -> float | None:
    return b if a is None else (a if b is None else max(a, b))


@dataclass(frozen=True)
class EventDigest:
    """What summary.json and the judge take from events.jsonl."""

    started: Moment = NOWHEN
    load_started: Moment = NOWHEN
    load_stopped: Moment = NOWHEN
    ended: Moment = NOWHEN
    last_ts: float | None = None
    last_mono: float | None = None
    unmarked_ts: float | None = None  # the latest label of an event that has no mono
    run_started: Mapping[str, Any] = field(default_factory=dict)
    run_ended: Mapping[str, Any] | None = None
    incidents: tuple[Mapping[str, Any], ...] = ()
    restarts: int = 0
    # (incident_started, restart_done): the load paused, then a new server life
    lives: tuple[tuple[Mapping[str, Any] | None, Mapping[str, Any]], ...] = ()
    load_events: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    wall_steps: tuple[Mapping[str, Any], ...] = ()
    gpu_source: Mapping[str, Any] = field(default_factory=dict)
    server_version: Mapping[str, Any] | None = None
    warnings: tuple[str, ...] = ()
    build: Mapping[str, Any] = field(default_factory=dict)
    criteria_section: Mapping[str, Any] | None = None
    threshold_breaches: tuple[Mapping[str, Any], ...] = ()  # live abort_on_fail stops
    # What the time at risk is read from (soak.exposure.intervals_of): the load's start and
    # stop, restarts and incidents, with only the fields it reads.
    risk_events: tuple[Mapping[str, Any], ...] = ()
    prove_plan: Mapping[str, Any] | None = None  # the prove_plan event's plan, as the run resolved it
    # The prove_plan event's horizon_s: the longest a hang could go undetected in this run
    # (an accept stands only on clean time that old, live and at the end alike).
    prove_horizon_s: float = 0.0
    served_models: tuple[str, ...] = ()  # target_ready's /v1/models ids (every life's)

    def expected_models(self) -> frozenset[str] | None:
        """The models the answers may name: the run's model, the build's and /v1/models' ids."""
        return expected_models(self.run_started.get("model"), self.build.get("model"),
                               lists=(list(self.served_models),))

    def span(self, *, cut_short: bool | None = None) -> LoadSpan:
        """The load's span; ``cut_short`` None: as ``run_ended`` recorded it."""
        if cut_short is None:
            cut_short = recorded_cut_short(self.run_ended)
        return LoadSpan.of_events(self.load_events.get("started"), self.load_events.get("stopped"),
                                  cut_short=cut_short, restarts=self.lives)

    def with_run_ended(self, event: Mapping[str, Any]) -> EventDigest:
        ts, mono = _number(event.get("ts")), _number(event.get("mono"))
        return replace(self, run_ended=event, ended=(ts, mono), last_ts=_later(self.last_ts, ts),
                       last_mono=_later(self.last_mono, mono),
                       unmarked_ts=self.unmarked_ts if mono is not None else _later(self.unmarked_ts, ts))


def digest_events(events: Iterable[Mapping[str, Any]]) -> EventDigest:
    """One fold over the events (read with ``fields=EVENT_TYPES``)."""
    started = load_started = load_stopped = ended = NOWHEN
    last_ts = last_mono = unmarked_ts = None
    run_started: Mapping[str, Any] = {}
    run_ended: Mapping[str, Any] | None = None
    incidents: list[Mapping[str, Any]] = []
    lives: list[tuple[Mapping[str, Any] | None, Mapping[str, Any]]] = []
    load_events: dict[str, Mapping[str, Any]] = {}
    wall_steps: list[Mapping[str, Any]] = []
    gpu_source: dict[str, Any] = {"stale": False, "stale_periods": 0, "max_age_s": None, "messages": []}
    server_version = criteria_section = None
    warnings: list[str] = []
    build: Mapping[str, Any] = {}
    breaches: list[Mapping[str, Any]] = []
    paused: Mapping[str, Any] | None = None
    risk_events: list[Mapping[str, Any]] = []
    prove_plan = None
    prove_horizon_s = 0.0
    served: list[str] = []
    for event in events:
        ts, mono = _number(event.get("ts")), _number(event.get("mono"))
        last_ts, last_mono = _later(last_ts, ts), _later(last_mono, mono)
        if mono is None and ts is not None:
            unmarked_ts = _later(unmarked_ts, ts)
        kind = event.get("type")
        if kind in RISK_EVENTS:
            risk_events.append({k: event[k] for k in RISK_FIELDS if k in event})
        if kind == EventType.RUN_STARTED:
            run_started, started = event, (ts, mono)
        elif kind == EventType.LOAD_STARTED:
            load_started = (ts, mono)
            load_events.setdefault("started", event)
        elif kind == EventType.LOAD_STOPPED:
            load_stopped = (ts, mono)
            load_events["stopped"] = event
        elif kind == EventType.RUN_ENDED:
            run_ended, ended = event, (ts, mono)
        elif kind == EventType.WALL_CLOCK_STEP and len(wall_steps) < 20:
            wall_steps.append({k: event.get(k) for k in ("ts", "mono", "step_s", "wall_before", "wall_after")})
        elif kind == EventType.INCIDENT:
            incidents.append({k: event.get(k) for k in (*INCIDENT_FIELDS, "number", "summary", "gpu_free_s", "diagnosis",
                                                         "onset_earliest_at", "onset_latest_at")})
        elif kind == EventType.INCIDENT_STARTED:
            paused = event
        elif kind == EventType.RESTART_DONE:
            lives.append((paused, event))
        elif kind == EventType.GPU_SOURCE_STALE:
            gpu_source["stale"] = True
            gpu_source["stale_periods"] += 1
            age = event.get("age_s")
            if isinstance(age, (int, float)):
                gpu_source["max_age_s"] = max(age, gpu_source["max_age_s"] or 0.0)
            if event.get("message") and len(gpu_source["messages"]) < 5:
                gpu_source["messages"].append(str(event["message"]))
        elif kind == EventType.CRITERIA_CONFIG and isinstance(event.get("criteria"), dict):
            criteria_section = event["criteria"]
        elif kind == EventType.SERVER_VERSION:
            server_version = {k: event.get(k) for k in ("server_version", "basis", "covered", "covered_versions")}
        elif kind == EventType.WARNING and event.get("message") and len(warnings) < 20:
            warnings.append(str(event["message"]))
        elif kind == EventType.BUILD:
            build = {k: v for k, v in event.items() if k not in ("ts", "type")}
        elif kind == EventType.THRESHOLD_BREACHED:
            breaches.append(event)
        elif kind == EventType.PROVE_PLAN and isinstance(event.get("plan"), dict):
            prove_plan = event["plan"]
            horizon = event.get("horizon_s")
            if isinstance(horizon, (int, float)) and not isinstance(horizon, bool) and 0 <= horizon < 1e7:
                prove_horizon_s = float(horizon)
        elif kind == EventType.TARGET_READY and isinstance(event.get("models"), list):
            served.extend(m for m in event["models"][:MAX_MODELS] if isinstance(m, str) and m not in served)
    return EventDigest(
        started=started, load_started=load_started, load_stopped=load_stopped, ended=ended, last_ts=last_ts,
        last_mono=last_mono, unmarked_ts=unmarked_ts, run_started=run_started, run_ended=run_ended,
        incidents=tuple(incidents), restarts=len(lives), lives=tuple(lives), load_events=load_events,
        wall_steps=tuple(wall_steps), gpu_source=gpu_source, server_version=server_version,
        warnings=tuple(warnings), build=build, criteria_section=criteria_section, threshold_breaches=tuple(breaches),
        risk_events=tuple(risk_events), prove_plan=prove_plan, served_models=tuple(served[:MAX_MODELS]),
        prove_horizon_s=prove_horizon_s)


@dataclass(frozen=True)
class SampleDigest:
    """One pass over the server samples of every segment."""

    deltas: Mapping[str, CounterDelta]
    coverage: MetricsCoverage
    lines: int  # every sample line, of every kind
    last_ts: float | None
    last_mono: float | None
    last_unmarked_ts: float | None
    series: tuple[tuple[float, Mapping[str, Any]], ...] | None  # (ts, values), only for windowed thresholds


@dataclass(frozen=True)
class Recorded:
    """Everything the judge and summary.json read of a run directory."""

    path: Path
    events: EventDigest
    criteria: CriteriaConfig
    criteria_note: str | None
    thresholds: tuple[Threshold, ...] | None  # None: the run configured none
    thresholds_error: str | None  # a recorded thresholds section that no longer compiles
    requests: RequestDigest
    latency: Mapping[str, Mapping[str, float | None]]  # ok, measured requests: mean, p50, p90, p95, p99, max
    window_requests: tuple[Mapping[str, Any], ...] | None  # WINDOW_FIELDS of every request, for windows
    samples: SampleDigest
    incidents: tuple[Mapping[str, Any], ...]  # the events' and incidents/N's, merged
    read_stats: Mapping[str, int]
    proof_plan: Plan | None = None  # prove: the sequential test the run asked for
    proof_note: str | None = None  # a prove section that could not be read back, said

    @property
    def windowed(self) -> bool:
        return any(t.window_s is not None for t in self.thresholds or ())

    def with_run_ended(self, event: Mapping[str, Any]) -> Recorded:
        """This record with the ``run_ended`` event the run just wrote (as written,
        ts and mono included), so the end of a run never reads its files again."""
        return replace(self, events=self.events.with_run_ended(typed_fields(dict(event), EVENT_TYPES)))


def criteria_of(section: Mapping[str, Any] | None, config: Mapping[str, Any], *,
                config_exists: bool) -> tuple[CriteriaConfig, str | None]:
    """The run's own ``criteria:`` settings: the ``criteria_config`` event the run
    loop writes at start (JSON, so a config.yaml a redactor or a hand made
    unparsable cannot silently swap in the defaults), else config.yaml's section,
    else the defaults (said so when config.yaml cannot be read)."""
    if section is not None:
        try:
            return CriteriaConfig.model_validate(section), None
        except Exception as exc:
            return CriteriaConfig(), f"recorded criteria unreadable ({type(exc).__name__}), defaults used"
    from_config = config.get("criteria")
    if from_config is None:
        if not config and config_exists:
            return CriteriaConfig(), "config.yaml unreadable: the failure criteria were judged with their defaults"
        return CriteriaConfig(), None
    try:
        return CriteriaConfig.model_validate(from_config), None
    except Exception as exc:  # a hand-edited config.yaml: judge with the defaults, say so
        return CriteriaConfig(), f"config.yaml criteria unreadable ({type(exc).__name__}), defaults used"


def proof_plan_of(recorded_plan: Mapping[str, Any] | None, section: Any) -> tuple[Plan | None, str | None]:
    """The run's sequential test: the ``prove_plan`` event (the plan as the run
    resolved it, a broken MTBF from history included), else config.yaml's
    ``prove:`` section where it gives the broken MTBF itself."""
    from soak.prove.config import ProveConfig, plan_of
    from soak.prove.sprt import plan

    if recorded_plan is not None:
        try:
            return plan(**{k: recorded_plan.get(k) for k in ("broken_mtbf_s", "target_mtbf_s", "alpha", "beta",
                                                             "max_exposure_s", "max_hangs")}), None
        except (TypeError, ValueError, ArithmeticError) as exc:  # sprt.plan bounds every field: a note, not a crash
            return None, f"recorded prove plan unreadable: {exc}"
    if section is None:
        return None, None
    if section.get("broken_build") is not None:  # its MTBF came from history at the run's start
        return None, "no prove plan recorded: the run ended before its load started"
    try:
        return plan_of(ProveConfig.model_validate(section)), None
    except Exception as exc:  # a hand-edited config.yaml: no proof, said
        return None, f"config.yaml prove section unreadable ({type(exc).__name__})"


def stale_after_of(config: Mapping[str, Any]) -> float:
    """Seconds without a fresh /metrics scrape that make the server figures stale:
    three scrape intervals, at least 5 s."""
    probes = config.get("probes")
    interval = probes.get("metrics_interval") if isinstance(probes, Mapping) else None
    interval = float(interval) if isinstance(interval, (int, float)) and interval > 0 else 1.0
    return max(5.0, 3.0 * interval)


def thresholds_of(section: Mapping[str, Any] | None) -> tuple[tuple[Threshold, ...] | None, str | None]:
    if not isinstance(section, Mapping) or not section:
        return None, None
    try:
        return compile_thresholds(section), None
    except ThresholdConfigError as exc:  # reported in summary.json, never raised
        return (), f"{exc.field}: {exc.message}"


def _read_samples(run: RunDir, *, stats: dict[str, int], stale_after_s: float, keep_series: bool) -> SampleDigest:
    coverage = MetricsCoverage(stale_after_s=stale_after_s)
    series: list[tuple[float, Mapping[str, Any]]] = []

    def seen(records: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
        for sample in records:
            coverage.add(sample)
            values = server_values(sample) if keep_series else None
            ts = sample.get("ts")
            if values is not None and isinstance(ts, (int, float)) and not isinstance(ts, bool) and math.isfinite(ts):
                series.append((ts, values))
            yield sample

    # Only server samples are parsed; the rest (most of a long run's lines) are counted unparsed.
    scan: dict[str, float] = {}
    deltas = server_counter_deltas(seen(run.samples(kinds={"server"}, stats=stats, scan=scan)), SERVER_KEYS)
    return SampleDigest(deltas=deltas, coverage=coverage, lines=int(scan.get("lines", 0)),
                        last_ts=scan.get("last_ts"), last_mono=scan.get("last_mono"),
                        last_unmarked_ts=scan.get("last_unmarked_ts"),
                        series=tuple(series) if keep_series else None)


def cross_check(requests: RequestDigest, samples: SampleDigest, events: EventDigest) -> None:
    """Hand the work claims what only the whole record knows: the served models,
    and the server's generation_tokens over the span its fresh scrapes cover
    beside the client's work inside that span (the run scrapes just before the
    first request and just after the drain, so a healthy run's span is the load's)."""
    claims = requests.tally.claims
    claims.expected = events.expected_models()
    delta = samples.deltas.get("generation_tokens")
    coverage = samples.coverage
    covered = coverage.report(None, None).get("complete") is True
    claims.server = ServerWork(
        seen=delta is not None and delta.seen, generated=delta.total if delta is not None else 0.0,
        client_within=claims.client_within(coverage.first_fresh, coverage.last_fresh) if delta is not None
        and delta.seen else 0, client_all=claims.client_all, resets=delta.resets if delta is not None else 0,
        covered=covered, claimed=claims.usage_claimed if claims.usage_checked else None)


def read_recorded(run_dir: RunDir | str | Path, *, cut_short: bool | None = None,
                  on_request: Callable[[dict[str, Any]], None] | None = None,
                  request_stats: dict[str, int] | None = None) -> Recorded:
    """The run directory, each file read once. ``cut_short``: whether the harness
    cut the load short, for a run whose ``run_ended`` is not written yet (None:
    as recorded). ``on_request`` sees every parsed request in the one pass (the
    report builds its columns there); ``request_stats`` gets requests.jsonl's
    unreadable-line counts."""
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)  # a caller's RunDir: config.yaml parsed once
    read_stats: dict[str, int] = {}
    events = digest_events(run.events(stats=read_stats, fields=EVENT_TYPES))
    config = run.config
    criteria, note = criteria_of(events.criteria_section, config, config_exists=(run.path / CONFIG).exists())
    thresholds, thresholds_error = thresholds_of(run.section("thresholds"))
    windowed = any(t.window_s is not None for t in thresholds or ())
    window_requests: list[Mapping[str, Any]] = []

    def each_request(record: dict[str, Any]) -> None:
        if windowed:
            window_requests.append({k: record.get(k) for k in WINDOW_FIELDS})
        if on_request is not None:
            on_request(record)

    own_stats: dict[str, int] = {}
    requests = fold_requests(run.requests(stats=own_stats, fields=REQUEST_TYPES), criteria,
                             read_stats=own_stats, on_request=each_request, stats=read_stats,
                             span=events.span(cut_short=cut_short))
    if request_stats is not None:
        request_stats.update(own_stats)
    samples = _read_samples(run, stats=read_stats, stale_after_s=stale_after_of(config), keep_series=windowed)
    cross_check(requests, samples, events)
    incidents = merge_incidents([dict(i) for i in events.incidents], disk_incidents(run.path))
    return Recorded(
        path=run.path, events=events, criteria=criteria, criteria_note=note, thresholds=thresholds,
        thresholds_error=thresholds_error, requests=requests,
        latency={name: latency_stats(getattr(requests, name)) for name in LATENCIES},
        window_requests=tuple(window_requests) if windowed else None, samples=samples,
        incidents=tuple(incidents), read_stats=read_stats,
        **dict(zip(("proof_plan", "proof_note"), proof_plan_of(events.prove_plan, run.section("prove")))))


__all__ = ["EventDigest", "Moment", "NOWHEN", "Recorded", "SampleDigest", "WINDOW_FIELDS", "digest_events",
           "read_recorded"]
