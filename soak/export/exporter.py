"""The harness's Prometheus exporter: a run sink over one registry per run.

``Exporter`` turns what the run loop hands its sinks (samples, finished
requests, assessments, incidents, events) into the ``soak_*`` families of
``soak.export.names`` on the registry it is given, never the global one.
``start()`` serves that registry over HTTP (127.0.0.1 by default) from a
daemon thread, so a scrape never waits on the event loop and a busy loop never
delays a scrape.

What other stages hand it (RunInfo, Assessment, IncidentRecord) are the
typed records of ``soak.records``; only ``RunInfo.config``, the resolved config
as plain JSON, is read as open data.
"""

from __future__ import annotations

import errno
import functools
import threading
from pathlib import PurePath
from typing import Any, Callable, Mapping, TypeVar
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import start_http_server

from soak.clock import Clock, SystemClock
from soak.errors import PortInUse
from soak.events import EventType
from soak.export.config import ExporterConfig
from soak.export.names import DETECTOR_STATE_VALUES, HARNESS_METRICS, RULE_STATE_VALUES, Kind
from soak.prove.sprt import Decision, ProofState
from soak.samples import server_accepted
from soak.records import Assessment, DetectorState, IncidentKind, IncidentRecord, RunInfo
from soak.samples import (
    CanarySample,
    CanaryVerdict,
    ClientSample,
    GpuSample,
    GpuSource,
    HealthSample,
    LogSample,
    ProcessSample,
    RequestRecord,
    Sample,
    ServerSample,
)

_MIB = 1024 * 1024
_FAMILY_CLASSES = {Kind.COUNTER: Counter, Kind.GAUGE: Gauge, Kind.HISTOGRAM: Histogram, Kind.INFO: Info}


def _label(value: object) -> str:
    return "" if value is None else str(value)


def _workload_label(workload: object) -> str:
    """``synthetic_agentic``, or ``mooncake_trace:trace.jsonl`` for a file-backed kind.
    ``workload`` is the resolved config's plain JSON: a section, or a file name."""
    if workload is None:
        return ""
    if not isinstance(workload, Mapping):
        return str(workload)
    kind = _label(workload.get("kind"))
    path = workload.get("path")
    return f"{kind}:{PurePath(str(path)).name}" if path else kind


class _ScrapeWatcher:
    """A collector that exports nothing and counts scrapes against changes."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._version = 0  # bumped by every sink call
        self._scraped_version = -1  # the version the latest scrape started after
        self._scraped = 0

    def describe(self) -> list:
        return []

    def collect(self) -> list:
        with self._cond:
            self._scraped += 1
            self._scraped_version = self._version
            self._cond.notify_all()
        return []

    def changed(self) -> None:
        with self._cond:
            self._version += 1

    def wait_for_final(self, timeout_s: float) -> bool:
        """True once a scrape began after the last change (at once if nobody ever scraped)."""
        with self._cond:
            if self._scraped == 0:
                return True
            version = self._version
            return self._cond.wait_for(lambda: self._scraped_version >= version, timeout=timeout_s)


_Method = TypeVar("_Method", bound=Callable[..., None])


def _marks_change(method: _Method) -> _Method:
    """After a sink call has updated the families, note that a scrape is due."""

    @functools.wraps(method)
    def wrapper(self: "Exporter", *args: Any, **kwargs: Any) -> None:
        try:
            method(self, *args, **kwargs)
        finally:
            self._scrapes.changed()

    return wrapper  # type: ignore[return-value]


def build_families(registry: CollectorRegistry) -> dict[str, Any]:
    """Register every family of the table on ``registry``; name -> metric object
    (a Counter, Gauge, Histogram or Info: each name is used with its own kind's methods)."""
    families: dict[str, Any] = {}
    for metric in HARNESS_METRICS.values():
        cls = _FAMILY_CLASSES[metric.kind]
        kwargs: dict[str, Any] = {"registry": registry}
        if metric.buckets is not None:
            kwargs["buckets"] = metric.buckets
        # prometheus_client appends _total (counters) and _info (info) itself.
        # An info metric's "labels" are the keys of its one value, not label names.
        labels = () if metric.kind is Kind.INFO else metric.labels
        families[metric.name] = cls(metric.name, metric.help, labels, **kwargs)
    return families


class Exporter:
    """A RunSink that publishes the run as Prometheus metrics."""

    def __init__(
        self,
        config: ExporterConfig,
        *,
        registry: CollectorRegistry,
        clock: Clock | None = None,
    ) -> None:
        self._config = config
        self._registry = registry
        self._clock = clock or SystemClock()
        # Registered first, so a scrape notes itself before it reads the families.
        self._scrapes = _ScrapeWatcher()
        registry.register(self._scrapes)
        self._m = build_families(registry)
        self._lock = threading.Lock()
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._ends_at: float | None = None
        self._run_labels: dict[str, str] | None = None  # soak_run_info's, once the run started
        self._build = ""  # the build event's label (soak.history.build.build_key), as history groups nights
        self._last_client_tokens = 0
        self._rules_seen: set[str] = set()
        self._last_client_bytes = 0
        self._m["soak_run_time_remaining_seconds"].set_function(self._time_remaining)
        # Series that exist from the start, so rates and alerts have data
        # before the first request finishes or the detector first speaks.
        self._m["soak_requests"].labels(outcome="ok")
        self._m["soak_detector_state"].set(DETECTOR_STATE_VALUES[DetectorState.HEALTHY])
        for verdict in CanaryVerdict:  # at 0 from the start: increase() sees a run's first corrupt canary
            self._m["soak_canaries"].labels(verdict=verdict.value)

    # serving -------------------------------------------------------------
    def start(self) -> None:
        """Bind and serve the registry; no-op when the exporter is disabled."""
        if not self._config.enabled or self._server is not None:
            return
        try:
            self._server, self._thread = start_http_server(
                self._config.port, addr=self._config.host, registry=self._registry
            )
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(
                    f"exporter: {self._config.host}:{self._config.port} is taken; "
                    "set exporter.port to a free port or 0"
                ) from exc
            raise PortInUse(f"exporter: cannot bind {self._config.host}:{self._config.port}: {exc}") from exc

    @property
    def port(self) -> int | None:
        """The bound port (useful with port 0), or None when not serving."""
        return None if self._server is None else int(self._server.server_port)

    @property
    def url(self) -> str | None:
        if self._server is None:
            return None
        host = self._config.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving. Idempotent; the registry keeps its values.

        A run usually ends a fraction of a second after its incident, sooner
        than the next scrape: when someone has been scraping, wait (at most
        ``final_scrape_wait``) for one scrape that reads the final values.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            server = self._server
        if server is not None:
            self._scrapes.wait_for_final(self._config.final_scrape_wait)
            with self._lock:
                self._server = None
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # RunSink -------------------------------------------------------------
    @_marks_change
    def on_start(self, info: RunInfo) -> None:
        config = info.config
        self._run_labels = {
            "run": info.run_id,
            "name": _label(config.get("name")),
            "workload": _workload_label(config.get("workload")),
            "target": info.target_kind.value,
            "model": _label(info.model),
            "build": self._build or _label(config.get("build")),
        }
        self._m["soak_run"].info(self._run_labels)
        self._m["soak_run_start_time_seconds"].set(info.started_at)
        self._m["soak_run_planned_duration_seconds"].set(info.duration_s)
        self._ends_at = info.started_at + info.duration_s
        for state in ProofState:  # every state 0 until a prove: run's first tick: no test (yet)
            self._m["soak_prove_decision"].labels(decision=state.value).set(0)

    @_marks_change
    def on_sample(self, sample: Sample) -> None:
        if isinstance(sample, GpuSample):
            self._on_gpu(sample)
        elif isinstance(sample, ServerSample):
            self._probe("server", sample.ts, sample.ok)
        elif isinstance(sample, HealthSample):
            self._probe("health", sample.ts, sample.ok)
        elif isinstance(sample, ProcessSample):
            self._probe("process", sample.ts, sample.alive)
        elif isinstance(sample, ClientSample):
            self._on_client(sample)
        elif isinstance(sample, CanarySample):
            self._on_canary(sample)
        elif isinstance(sample, LogSample):
            self._m["soak_log_signatures"].labels(signature=sample.signature, fatal=str(sample.fatal).lower()).inc()

    @_marks_change
    def on_request(self, record: RequestRecord) -> None:
        m = self._m
        m["soak_requests"].labels(outcome=record.outcome).inc()
        if record.prompt_tokens is not None:
            if server_accepted({"http_status": record.http_status, "outcome": record.outcome}):
                # Comparable with vllm:prompt_tokens_total: only what the server took in.
                m["soak_prompt_tokens"].inc(record.prompt_tokens)
            m["soak_request_prompt_tokens"].observe(record.prompt_tokens)
            m["soak_context_length_tokens"].set(record.prompt_tokens)
        if record.cached_tokens:
            m["soak_cached_tokens"].inc(record.cached_tokens)
        if record.output_tokens:
            m["soak_generated_tokens"].inc(record.output_tokens)
        for value, family in (
            (record.ttft_s, "soak_ttft_seconds"),
            (record.itl_mean_s, "soak_request_mean_itl_seconds"),
            (record.itl_max_s, "soak_request_max_itl_seconds"),
            (record.e2e_s, "soak_e2e_request_latency_seconds"),
        ):
            if value is not None:
                m[family].observe(value)

    @_marks_change
    def on_assessment(self, assessment: Assessment) -> None:
        self._m["soak_detector_state"].set(DETECTOR_STATE_VALUES[assessment.state])
        for rule in assessment.rules:
            name = rule.rule
            self._m["soak_detector_rule_state"].labels(rule=name).set(RULE_STATE_VALUES[rule.state])
            if name not in self._rules_seen:
                # The rule's incident counters exist at 0 before it first fires,
                # so increase() sees the step to 1 (a series born at 1 shows
                # none). Every kind: a rule may decide a crash or a hang.
                self._rules_seen.add(name)
                for kind in IncidentKind:
                    self._m["soak_incidents"].labels(kind=kind.value, rule=name)

    @_marks_change
    def on_incident(self, incident: IncidentRecord) -> None:
        m = self._m
        m["soak_incidents"].labels(kind=incident.kind.value, rule=incident.rule).inc()
        m["soak_last_incident_onset_timestamp_seconds"].set(incident.onset_at)
        m["soak_last_incident_detection_delay_seconds"].set(incident.detected_at - incident.onset_at)
        latency = incident.detection_latency
        if latency is not None:
            m["soak_last_incident_detection_delay_max_seconds"].set(latency.max_s)
        if incident.gpu_free_s is not None:
            m["soak_last_incident_gpu_free_seconds"].set(incident.gpu_free_s)

    @_marks_change
    def on_proof(self, decision: Decision) -> None:
        """A prove: run's sequential test, each detector tick (soak.run.proving)."""
        m = self._m
        m["soak_prove_exposure_seconds"].set(decision.exposure_s)
        m["soak_prove_hangs"].set(decision.hangs)
        m["soak_prove_accept_at_seconds"].set(decision.accept_at_s)
        need = decision.needed
        if need is not None and need.hangs is not None:
            m["soak_prove_reject_at_hangs"].set(decision.hangs + need.hangs)
        else:  # decided, or only the truncation is left: no hang count rejects from here
            m["soak_prove_reject_at_hangs"].set(float("nan"))
        for state in ProofState:
            m["soak_prove_decision"].labels(decision=state.value).set(1 if state is decision.state else 0)

    @_marks_change
    def on_event(self, type: EventType | str, fields: Mapping[str, Any]) -> None:  # noqa: A002 - the RunSink signature
        self._m["soak_events"].labels(type=str(type)).inc()
        if type == EventType.BUILD:
            self._build = _label(fields.get("build") or fields.get("label"))
            if self._run_labels is not None:
                self._run_labels["build"] = self._build
                self._m["soak_run"].info(self._run_labels)
        elif type == EventType.RUN_ENDED:
            # set before close()'s final scrape: soak:run_in_progress reads start > end
            self._m["soak_run_end_time_seconds"].set(self._clock.now())
        elif type == EventType.LOAD_STOPPED:
            # the load is over: no time remains, whatever was planned
            self._ends_at = self._clock.now()

    # internals -----------------------------------------------------------
    def _time_remaining(self) -> float:
        if self._ends_at is None:
            return 0.0
        return max(0.0, self._ends_at - self._clock.now())

    def _probe(self, probe: str, ts: float, ok: bool) -> None:
        self._m["soak_probe_ok"].labels(probe=probe).set(1 if ok else 0)
        self._m["soak_probe_last_sample_timestamp_seconds"].labels(probe=probe).set(ts)

    def _on_gpu(self, sample: GpuSample) -> None:
        m = self._m
        self._probe("gpu", sample.ts, sample.error is None)
        if sample.error is not None:
            return  # keep the last good reading rather than invent one
        if sample.source is GpuSource.STAGE_CPU:
            # stages' CPU, not GPUs: never under a GPU name (one reading per stage, in order)
            for stage, reading in enumerate(sample.gpus):
                m["soak_stage_cpu_percent"].labels(stage=str(stage)).set(reading.util_pct)
            return
        for gpu in sample.gpus:
            label = str(gpu.index)
            m["soak_gpu_utilization_percent"].labels(gpu=label).set(gpu.util_pct)
            m["soak_gpu_processes"].labels(gpu=label).set(len(gpu.pids))
            if gpu.mem_used_mib is not None:
                m["soak_gpu_memory_used_bytes"].labels(gpu=label).set(gpu.mem_used_mib * _MIB)
            if gpu.mem_total_mib is not None:
                m["soak_gpu_memory_total_bytes"].labels(gpu=label).set(gpu.mem_total_mib * _MIB)
            if gpu.power_w is not None:
                m["soak_gpu_power_watts"].labels(gpu=label).set(gpu.power_w)

    def _on_canary(self, sample: CanarySample) -> None:
        verdict = str(sample.verdict)
        known = {v.value for v in CanaryVerdict}
        # a label value from the oracle's own enum only: an unknown one is no new series
        self._m["soak_canaries"].labels(verdict=verdict if verdict in known else CanaryVerdict.UNJUDGED.value).inc()
        share = sample.share
        if isinstance(share, (int, float)) and not isinstance(share, bool) and 0.0 <= share <= 1.0:
            self._m["soak_canary_share_ratio"].set(share)

    def _on_client(self, sample: ClientSample) -> None:
        m = self._m
        self._probe("client", sample.ts, True)
        m["soak_requests_in_flight"].set(sample.in_flight)
        m["soak_client_max_silence_seconds"].set(sample.max_silence_s or 0.0)
        # The tracker's totals are cumulative; a tracker started afresh (after
        # a restart) counts from zero again, and its new total is all new.
        tokens = sample.tokens_total - self._last_client_tokens
        received = sample.bytes_total - self._last_client_bytes
        m["soak_client_streamed_tokens"].inc(tokens if tokens >= 0 else sample.tokens_total)
        m["soak_client_received_bytes"].inc(received if received >= 0 else sample.bytes_total)
        self._last_client_tokens = sample.tokens_total
        self._last_client_bytes = sample.bytes_total
