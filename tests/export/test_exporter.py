"""The exporter over real HTTP on loopback: what a Prometheus scrape would read."""

from __future__ import annotations

import socket
import threading
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from soak.clock import ManualClock
from soak.events import EventType
from soak.errors import PortInUse
from soak.export.config import ExporterConfig
from soak.export.exporter import Exporter
from soak.export.names import exported_series_names
from soak.records import Assessment, DetectorState, IncidentKind, IncidentRecord, RuleState, RuleStatus, RunInfo
from soak.run.sinks import FanOut
from soak.samples import (
    ClientSample,
    GpuReading,
    GpuSample,
    GpuSource,
    HealthSample,
    LogSample,
    RequestRecord,
    ServerSample,
)

T0 = 1_700_000_000.0


@pytest.fixture
def make_exporter():
    made: list[Exporter] = []

    def make(*, port: int = 0, host: str = "127.0.0.1", clock=None, start: bool = True) -> Exporter:
        exporter = Exporter(
            ExporterConfig(host=host, port=port), registry=CollectorRegistry(), clock=clock or ManualClock(T0)
        )
        made.append(exporter)
        if start:
            exporter.start()
        return exporter

    yield make
    for exporter in made:
        exporter.close()


def scrape(exporter: Exporter | str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    url = exporter if isinstance(exporter, str) else exporter.url
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(scraped, series: str, **labels: str) -> float:
    return scraped[(series, tuple(sorted(labels.items())))]


def run_info(**overrides) -> RunInfo:
    fields = dict(
        run_id="20261202-1642-demo",
        run_dir=Path("/tmp/run"),
        started_at=T0,
        duration_s=3960.0,
        warmup_s=0.0,
        target_kind="simulator",
        base_url="http://127.0.0.1:8000",
        model="deepseek-v4-flash",
        root_pid=None,
        config={"name": "nightly", "workload": {"kind": "mooncake_trace", "path": "traces/agentic.jsonl"}},
    )
    fields.update(overrides)
    return RunInfo(**fields)


def incident(**fields) -> IncidentRecord:
    return IncidentRecord(number=1, killed_pids=(), gpus_released=None, gpu_free_s=None, evidence="incidents/1",
                          summary="", **fields)


def deadlock_gpus(ts: float) -> GpuSample:
    readings = tuple(
        GpuReading(index=i, util_pct=100.0 if i < 7 else 0.0, mem_used_mib=20000.0, mem_total_mib=24576.0,
                   power_w=300.0 if i < 7 else 110.0, pids=(4000 + i,))
        for i in range(8)
    )
    return GpuSample(ts=ts, source=GpuSource.SIM, gpus=readings)


def test_serves_on_loopback_with_a_bound_port(make_exporter):
    exporter = make_exporter()
    assert exporter.url == f"http://127.0.0.1:{exporter.port}/metrics"
    assert exporter.port and exporter.port > 0
    scraped = scrape(exporter)
    assert value(scraped, "soak_detector_state") == 0
    assert value(scraped, "soak_requests_total", outcome="ok") == 0


def test_run_info_and_time_remaining_follow_the_clock(make_exporter):
    clock = ManualClock(T0)
    exporter = make_exporter(clock=clock)
    exporter.on_start(run_info())
    clock.advance(960.0)
    scraped = scrape(exporter)
    assert value(
        scraped,
        "soak_run_info",
        run="20261202-1642-demo",
        name="nightly",
        workload="mooncake_trace:agentic.jsonl",
        target="simulator",
        model="deepseek-v4-flash",
        build="",
    ) == 1
    assert value(scraped, "soak_run_start_time_seconds") == T0
    assert value(scraped, "soak_run_time_remaining_seconds") == pytest.approx(3000.0)
    clock.advance(5000.0)
    assert value(scrape(exporter), "soak_run_time_remaining_seconds") == 0


def test_run_info_names_the_build_and_no_time_remains_once_the_load_stopped(make_exporter):
    """soak_run_info carries the build as soak history groups nights (the build
    event comes before the run starts); a run stopped early has 0 s remaining."""
    clock = ManualClock(T0)
    exporter = make_exporter(clock=clock)
    exporter.on_event(EventType.BUILD, {"label": "nightly-abc", "build": "nightly-abc", "vllm_version": "0.11.0"})
    exporter.on_start(run_info())
    clock.advance(60.0)
    exporter.on_event(EventType.LOAD_STOPPED, {"reason": "incident 1: on_hang: stop"})
    scraped = scrape(exporter)
    assert value(scraped, "soak_run_info", run="20261202-1642-demo", name="nightly",
                 workload="mooncake_trace:agentic.jsonl", target="simulator", model="deepseek-v4-flash",
                 build="nightly-abc") == 1
    assert value(scraped, "soak_run_time_remaining_seconds") == 0


def test_gpu_readings_per_gpu_and_a_failed_reading_keeps_the_last_good_one(make_exporter):
    exporter = make_exporter()
    exporter.on_sample(deadlock_gpus(T0))
    exporter.on_sample(GpuSample(ts=T0 + 1, source=GpuSource.NVML, gpus=(), error="NVML timed out"))
    scraped = scrape(exporter)
    assert [value(scraped, "soak_gpu_utilization_percent", gpu=str(i)) for i in range(8)] == [100.0] * 7 + [0.0]
    assert value(scraped, "soak_gpu_memory_used_bytes", gpu="3") == 20000 * 1024 * 1024
    assert value(scraped, "soak_gpu_power_watts", gpu="7") == 110.0
    assert value(scraped, "soak_gpu_processes", gpu="0") == 1
    assert value(scraped, "soak_probe_ok", probe="gpu") == 0
    assert value(scraped, "soak_probe_last_sample_timestamp_seconds", probe="gpu") == T0 + 1


def test_stage_cpu_readings_are_exported_per_stage_never_as_gpus(make_exporter):
    exporter = make_exporter()
    exporter.on_sample(GpuSample(ts=T0, source=GpuSource.STAGE_CPU, gpus=(
        GpuReading(index=0, util_pct=98.0, pids=(11,)), GpuReading(index=2, util_pct=0.5, pids=(12,)))))
    scraped = scrape(exporter)
    assert value(scraped, "soak_stage_cpu_percent", stage="0") == 98.0
    assert value(scraped, "soak_stage_cpu_percent", stage="1") == 0.5
    assert not [key for key in scraped if key[0] == "soak_gpu_utilization_percent"]


def test_requests_tokens_and_latency_histograms(make_exporter):
    exporter = make_exporter()
    for i, (outcome, ttft) in enumerate([("ok", 0.4), ("ok", 12.0), ("timeout_stall", None)]):
        exporter.on_request(
            RequestRecord(
                request_id=str(i), session="s0", turn=i, started_at=T0, ended_at=T0 + 30, outcome=outcome,
                prompt_tokens=200_000 + i, cached_tokens=188_000, output_tokens=500 if ttft else 12,
                ttft_s=ttft, itl_mean_s=0.05, itl_max_s=2.0, e2e_s=30.0,
            )
        )
    scraped = scrape(exporter)
    assert value(scraped, "soak_requests_total", outcome="ok") == 2
    assert value(scraped, "soak_requests_total", outcome="timeout_stall") == 1
    assert value(scraped, "soak_prompt_tokens_total") == 600_003
    assert value(scraped, "soak_cached_tokens_total") == 3 * 188_000
    assert value(scraped, "soak_generated_tokens_total") == 1012
    assert value(scraped, "soak_ttft_seconds_count") == 2
    assert value(scraped, "soak_ttft_seconds_bucket", le="0.5") == 1
    assert value(scraped, "soak_ttft_seconds_bucket", le="20.0") == 2
    assert value(scraped, "soak_request_max_itl_seconds_bucket", le="2.5") == 3
    assert value(scraped, "soak_request_prompt_tokens_bucket", le="196608.0") == 0
    assert value(scraped, "soak_request_prompt_tokens_bucket", le="212992.0") == 3
    assert value(scraped, "soak_context_length_tokens") == 200_002


def test_client_progress_counts_deltas_and_survives_a_fresh_tracker(make_exporter):
    exporter = make_exporter()
    for tokens in (100, 250, 40):  # the third: a tracker started afresh after a restart
        exporter.on_sample(
            ClientSample(ts=T0, in_flight=3, bytes_total=tokens * 10, tokens_total=tokens, requests_done=0,
                         max_silence_s=4.5)
        )
    exporter.on_sample(ClientSample(ts=T0, in_flight=0, bytes_total=400, tokens_total=40, requests_done=3))
    scraped = scrape(exporter)
    assert value(scraped, "soak_client_streamed_tokens_total") == 290
    assert value(scraped, "soak_client_received_bytes_total") == 2900
    assert value(scraped, "soak_requests_in_flight") == 0
    assert value(scraped, "soak_client_max_silence_seconds") == 0


def test_detector_states_incidents_events_and_probe_health(make_exporter):
    exporter = make_exporter()
    exporter.on_assessment(
        Assessment(
            now=T0,
            state=DetectorState.HUNG,
            rules=(
                RuleStatus(rule="pp_tail_stall", state=RuleState.FIRED),
                RuleStatus(rule="generation_frozen", state=RuleState.PENDING),
                RuleStatus(rule="client_stall", state=RuleState.CLEAR),
                RuleStatus(rule="log_signature", state=RuleState.INACTIVE),
            ),
        )
    )
    exporter.on_incident(
        IncidentRecord(
            number=1, kind="hang", rule="pp_tail_stall", onset_at=T0 - 9, detected_at=T0, killed_pids=(1, 2),
            gpus_released=True, gpu_free_s=0.4, evidence="incidents/1", summary="pp tail stall",
            onset_earliest_at=T0 - 11.5, onset_latest_at=T0 - 9,
        )
    )
    exporter.on_event("restart", {"attempt": 1})
    exporter.on_sample(HealthSample(ts=T0, ok=True, status=200))
    exporter.on_sample(ServerSample(ts=T0, ok=False, error="connection refused"))
    exporter.on_sample(LogSample(ts=T0, signature="shm_broadcast_timeout", line="No available shared memory"))
    scraped = scrape(exporter)
    assert value(scraped, "soak_detector_state") == 2
    assert value(scraped, "soak_detector_rule_state", rule="pp_tail_stall") == 2
    assert value(scraped, "soak_detector_rule_state", rule="generation_frozen") == 1
    assert value(scraped, "soak_detector_rule_state", rule="client_stall") == 0
    assert value(scraped, "soak_detector_rule_state", rule="log_signature") == -1
    assert value(scraped, "soak_incidents_total", kind="hang", rule="pp_tail_stall") == 1
    assert value(scraped, "soak_last_incident_detection_delay_seconds") == pytest.approx(9.0)
    # the latency's upper end, from the earliest onset the evidence allows (issue 37)
    assert value(scraped, "soak_last_incident_detection_delay_max_seconds") == pytest.approx(11.5)
    assert value(scraped, "soak_last_incident_gpu_free_seconds") == pytest.approx(0.4)
    assert value(scraped, "soak_events_total", type="restart") == 1
    assert value(scraped, "soak_probe_ok", probe="health") == 1
    assert value(scraped, "soak_probe_ok", probe="server") == 0
    assert value(scraped, "soak_log_signatures_total", signature="shm_broadcast_timeout", fatal="false") == 1


def test_every_series_of_the_table_is_on_the_wire_and_nothing_else(make_exporter):
    exporter = make_exporter()
    exporter.on_start(run_info())
    exporter.on_sample(deadlock_gpus(T0))
    exporter.on_sample(GpuSample(ts=T0, source=GpuSource.STAGE_CPU, gpus=(GpuReading(index=0, util_pct=1.0),)))
    exporter.on_sample(HealthSample(ts=T0, ok=True, status=200))
    exporter.on_sample(LogSample(ts=T0, signature="engine_dead", line="EngineDeadError", fatal=True))
    exporter.on_assessment(
        Assessment(now=T0, state=DetectorState.HEALTHY, rules=(RuleStatus(rule="pp_tail_stall", state=RuleState.CLEAR),))
    )
    exporter.on_incident(incident(kind="crash", rule="server_gone", onset_at=T0, detected_at=T0 + 1))
    exporter.on_event("run_started", {})
    on_wire = {series for series, _labels in scrape(exporter)}
    assert on_wire == exported_series_names()


def test_a_rules_incident_counter_exists_at_zero_before_it_first_fires(make_exporter):
    # Prometheus's increase() sees no step in a series born at 1: the first
    # incident of a run would show no annotation and fire no alert.
    exporter = make_exporter()
    exporter.on_assessment(
        Assessment(now=T0, state=DetectorState.HEALTHY, rules=(
            RuleStatus(rule="pp_tail_stall", state=RuleState.CLEAR),
            RuleStatus(rule="server_gone", state=RuleState.INACTIVE, kind=IncidentKind.SERVER_GONE),
        ))
    )
    scraped = scrape(exporter)
    assert value(scraped, "soak_incidents_total", kind="hang", rule="pp_tail_stall") == 0
    assert value(scraped, "soak_incidents_total", kind="server_gone", rule="server_gone") == 0
    # log_signature decides a crash or a hang depending on the line.
    assert value(scraped, "soak_incidents_total", kind="crash", rule="pp_tail_stall") == 0


def test_two_runs_in_one_process_keep_separate_registries(make_exporter):
    first, second = make_exporter(), make_exporter()
    first.on_event("restart", {})
    assert value(scrape(first), "soak_events_total", type="restart") == 1
    assert ("soak_events_total", (("type", "restart"),)) not in scrape(second)


def test_a_taken_port_is_port_in_use_and_close_is_idempotent(make_exporter):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        with pytest.raises(PortInUse, match="exporter.port"):
            make_exporter(port=held.getsockname()[1])
    exporter = make_exporter()
    url = exporter.url
    exporter.close()
    exporter.close()
    assert exporter.url is None
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)


def test_close_waits_for_a_scrape_of_the_final_values_when_someone_scrapes(make_exporter):
    # A run ends a fraction of a second after its incident; without this the
    # last scrape Prometheus holds says "healthy, no incident".
    exporter = make_exporter()
    url = exporter.url
    scrape(url)
    exporter.on_incident(incident(kind="hang", rule="pp_tail_stall", onset_at=T0, detected_at=T0 + 5))
    closer = threading.Thread(target=exporter.close)
    closer.start()
    final = scrape(url)
    closer.join(timeout=10)
    assert not closer.is_alive()
    assert value(final, "soak_incidents_total", kind="hang", rule="pp_tail_stall") == 1
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)


def test_disabled_exporter_serves_nothing_but_still_accepts_calls(make_exporter):
    exporter = Exporter(ExporterConfig(enabled=False, port=0), registry=CollectorRegistry())
    exporter.start()
    exporter.on_sample(deadlock_gpus(T0))
    assert exporter.url is None
    exporter.close()


def test_works_behind_the_run_loops_fan_out(make_exporter):
    exporter = make_exporter()
    errors = []
    fan_out = FanOut([exporter], on_error=lambda sink, method, exc: errors.append((method, exc)))
    fan_out.on_start(run_info())
    fan_out.on_sample(deadlock_gpus(T0))
    fan_out.close()
    assert errors == []
    assert exporter.url is None
