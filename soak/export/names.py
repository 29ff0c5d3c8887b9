"""The one table of the harness's own metric names (``soak_*``).

The exporter registers exactly these; the dashboard, the Prometheus rules and
their lint test look names up here, so a rename happens in one place. vLLM and
DCGM names live in ``soak.metric_names``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from soak.records import DetectorState, RuleState


class Kind(str, Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"
    INFO = "info"


@dataclass(frozen=True)
class HarnessMetric:
    name: str  # family name; a counter is exposed with ``_total``, an info with ``_info``
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None

    @property
    def series_names(self) -> tuple[str, ...]:
        """The sample names Prometheus stores for this family."""
        if self.kind is Kind.COUNTER:
            return (f"{self.name}_total", f"{self.name}_created")
        if self.kind is Kind.HISTOGRAM:
            return tuple(f"{self.name}{s}" for s in ("_bucket", "_sum", "_count", "_created"))
        if self.kind is Kind.INFO:
            return (f"{self.name}_info",)
        return (self.name,)


# Client-side latency bounds: vLLM's TTFT bounds, so the client and server
# histograms of the dashboard line up bucket for bucket.
LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
    160.0, 320.0, 640.0, 1280.0, 2560.0,
)
ITL_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5,
    5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0,
)
# Agentic contexts run 190K-230K tokens; max_model_len is 327680.
CONTEXT_BUCKETS = (
    1024, 4096, 16384, 32768, 65536, 98304, 131072, 163840, 196608, 212992,
    229376, 262144, 327680,
)

# Detector states as numbers, so a state timeline can colour them and an alert
# can compare them. A rule's RuleState maps onto the same scale (inactive below
# it), so one colour scheme reads both.
DETECTOR_STATE_VALUES: dict[DetectorState, int] = {DetectorState.HEALTHY: 0, DetectorState.SUSPECT: 1,
                                                   DetectorState.HUNG: 2}
RULE_STATE_VALUES: dict[RuleState, int] = {RuleState.INACTIVE: -1, RuleState.CLEAR: 0, RuleState.PENDING: 1,
                                           RuleState.FIRED: 2}

HARNESS_METRICS: dict[str, HarnessMetric] = {
    m.name: m
    for m in (
        # run
        HarnessMetric(
            "soak_run",
            Kind.INFO,
            "The run: its id, config name, workload, target kind, model and build (as soak history groups nights).",
            ("run", "name", "workload", "target", "model", "build"),
        ),
        HarnessMetric("soak_run_start_time_seconds", Kind.GAUGE, "When the run started (unix seconds)."),
        HarnessMetric("soak_run_end_time_seconds", Kind.GAUGE,
                      "When the run ended (unix seconds); 0 while it runs. Not a counter's _created: "
                      "that series is gone with PROMETHEUS_DISABLE_CREATED_SERIES."),
        HarnessMetric("soak_run_planned_duration_seconds", Kind.GAUGE, "The soak's planned duration."),
        HarnessMetric("soak_run_time_remaining_seconds", Kind.GAUGE, "Seconds of the planned soak still to go."),
        HarnessMetric("soak_events", Kind.COUNTER, "Run events (events.jsonl lines) by type.", ("type",)),
        # GPUs, as the run's GPU source sampled them (NVML, dcgm-exporter or the simulator)
        HarnessMetric("soak_gpu_utilization_percent", Kind.GAUGE, "GPU utilization as sampled (percent).", ("gpu",)),
        HarnessMetric("soak_gpu_memory_used_bytes", Kind.GAUGE, "GPU memory in use as sampled.", ("gpu",)),
        HarnessMetric("soak_gpu_memory_total_bytes", Kind.GAUGE, "GPU memory in all.", ("gpu",)),
        HarnessMetric("soak_gpu_power_watts", Kind.GAUGE, "GPU power draw as sampled.", ("gpu",)),
        HarnessMetric("soak_gpu_processes", Kind.GAUGE, "Compute processes holding the GPU.", ("gpu",)),
        # Not GPUs: each pipeline stage's CPU from the stage-CPU source (servers without GPUs)
        HarnessMetric("soak_stage_cpu_percent", Kind.GAUGE,
                      "A pipeline stage's CPU use: CPU time plus run-queue wait, percent of one core "
                      "(stage-CPU source; no GPUs).", ("stage",)),
        # probes
        HarnessMetric("soak_probe_ok", Kind.GAUGE, "1 when the probe's last reading succeeded.", ("probe",)),
        HarnessMetric(
            "soak_probe_last_sample_timestamp_seconds",
            Kind.GAUGE,
            "When the probe last produced a sample (unix seconds).",
            ("probe",),
        ),
        HarnessMetric(
            "soak_log_signatures", Kind.COUNTER, "Server log lines that matched a known signature.", ("signature", "fatal")
        ),
        # client side
        HarnessMetric("soak_requests", Kind.COUNTER, "Finished requests by outcome.", ("outcome",)),
        HarnessMetric("soak_prompt_tokens", Kind.COUNTER, "Prompt tokens of finished requests."),
        HarnessMetric("soak_cached_tokens", Kind.COUNTER, "Prompt tokens the server reported as cached."),
        HarnessMetric("soak_generated_tokens", Kind.COUNTER, "Output tokens of finished requests."),
        HarnessMetric(
            "soak_client_streamed_tokens",
            Kind.COUNTER,
            "Tokens the client has received, counted as they arrive: one per content chunk, so "
            "fewer than generated when speculative decoding sends several tokens a chunk.",
        ),
        HarnessMetric("soak_client_received_bytes", Kind.COUNTER, "Bytes the client has received on its streams."),
        HarnessMetric("soak_requests_in_flight", Kind.GAUGE, "Requests sent and not yet finished."),
        HarnessMetric(
            "soak_client_max_silence_seconds",
            Kind.GAUGE,
            "Seconds since the stalest in-flight stream last received a byte (0 when idle).",
        ),
        HarnessMetric(
            "soak_ttft_seconds", Kind.HISTOGRAM, "Time to first token of finished requests.", buckets=LATENCY_BUCKETS
        ),
        HarnessMetric(
            "soak_request_mean_itl_seconds",
            Kind.HISTOGRAM,
            "Mean inter-token latency of each finished request (one observation a request).",
            buckets=ITL_BUCKETS,
        ),
        HarnessMetric(
            "soak_request_max_itl_seconds",
            Kind.HISTOGRAM,
            "Longest gap between tokens of each finished request (one observation a request).",
            buckets=ITL_BUCKETS,
        ),
        HarnessMetric(
            "soak_e2e_request_latency_seconds",
            Kind.HISTOGRAM,
            "End-to-end latency of finished requests.",
            buckets=LATENCY_BUCKETS,
        ),
        HarnessMetric(
            "soak_request_prompt_tokens",
            Kind.HISTOGRAM,
            "Context length (prompt tokens) of finished requests.",
            buckets=CONTEXT_BUCKETS,
        ),
        HarnessMetric(
            "soak_context_length_tokens", Kind.GAUGE, "Context length (prompt tokens) of the last finished request."
        ),
        # detector and incidents
        HarnessMetric(
            "soak_detector_state", Kind.GAUGE, "Detector verdict now: 0 healthy, 1 suspect, 2 hung."
        ),
        HarnessMetric(
            "soak_detector_rule_state",
            Kind.GAUGE,
            "Each detector rule's state: -1 inactive, 0 clear, 1 pending, 2 fired.",
            ("rule",),
        ),
        HarnessMetric("soak_incidents", Kind.COUNTER, "Incidents by kind and by the rule that fired.", ("kind", "rule")),
        HarnessMetric(
            "soak_last_incident_onset_timestamp_seconds",
            Kind.GAUGE,
            "Best estimate of when progress stopped before the last incident (unix seconds).",
        ),
        HarnessMetric(
            "soak_last_incident_detection_delay_seconds",
            Kind.GAUGE,
            "Seconds from the last incident's onset to the detector's decision.",
        ),
        HarnessMetric(
            "soak_last_incident_detection_delay_max_seconds",
            Kind.GAUGE,
            "Seconds from the earliest onset the evidence allows to the last incident's decision "
            "(the upper end of the detection latency; the delay itself for a point estimate).",
        ),
        HarnessMetric(
            "soak_last_incident_gpu_free_seconds",
            Kind.GAUGE,
            "Seconds from the last kill until the GPUs showed no process.",
        ),
        # the correctness oracle (soak.oracle): greedy canaries judged against their reference
        HarnessMetric("soak_canaries", Kind.COUNTER,
                      "Canary answers the correctness oracle judged, by verdict: reference (a first answer taken as "
                      "the reference), match, explained (a near tie), corrupt, crosstalk (another canary's answer), "
                      "unjudged (no answer to judge).", ("verdict",)),
        HarnessMetric("soak_canary_share_ratio", Kind.GAUGE,
                      "The canaries' measured share of server time so far (0..1; bounded by oracle.max_share)."),
        # prove: the sequential test (soak.prove.sprt), on a run with a prove: section only
        HarnessMetric("soak_prove_exposure_seconds", Kind.GAUGE,
                      "The sequential test's exposure: loaded time at risk so far (or where it decided)."),
        HarnessMetric("soak_prove_hangs", Kind.GAUGE, "The sequential test's hangs so far (or where it decided)."),
        HarnessMetric("soak_prove_accept_at_seconds", Kind.GAUGE,
                      "Exposure at which the test accepts 'fixed' with the hangs it has now."),
        HarnessMetric("soak_prove_reject_at_hangs", Kind.GAUGE,
                      "Hang count that would reject 'fixed' at the exposure now (absent when the truncation comes first)."),
        HarnessMetric("soak_prove_decision", Kind.GAUGE,
                      "The test's state, one series per state: 1 for the state it is in, 0 for the others (all 0: no prove: section).",
                      ("decision",)),
    )
}


# What the end of a run (soak/report/push.py: soak_night_*) and `soak history --pushgateway`
# (soak_build_*) push to a Pushgateway: gauges in a registry of their own, never the
# exporter's. The "soak nights" dashboard reads these.
PUSHED_METRICS: dict[str, HarnessMetric] = {
    m.name: m
    for m in (
        HarnessMetric("soak_night", Kind.INFO, "The night's run: its id, build, vLLM version, launch digest and verdict.",
                      ("run", "build_label", "vllm_version", "launch_digest", "verdict")),
        HarnessMetric("soak_night_verdict", Kind.GAUGE, "The night's verdict: 0 pass, 1 fail, 2 aborted."),
        HarnessMetric("soak_night_exit_code", Kind.GAUGE, "soak run's exit status (CONTRACTS.md): 0 pass, 1 fail, "
                      "2 bad config, 3 target never ready, 4 harness fault, 5 prove: undecided, 99 threshold "
                      "breached, 130 interrupted."),
        HarnessMetric("soak_night_start_time_seconds", Kind.GAUGE, "When the night's run started (unix seconds)."),
        HarnessMetric("soak_night_exposure_seconds", Kind.GAUGE,
                      "Seconds the night was at risk of a hang: load, less each hang's wait for its restart."),
        HarnessMetric("soak_night_incidents", Kind.GAUGE, "Incidents of the night by kind: every one recorded.",
                      ("kind",)),
        HarnessMetric("soak_night_hangs", Kind.GAUGE, "Hangs of the night that ended time at risk "
                      "(the MTBF's count; <= soak_night_incidents{kind=\"hang\"})."),
        HarnessMetric("soak_night_mtbf_lower_bound_seconds", Kind.GAUGE,
                      "MTBF proven by this night alone (one-sided exact chi-square bound at the push's confidence)."),
        HarnessMetric("soak_night_output_tokens_per_second", Kind.GAUGE, "Generated tokens per second (warm-up excluded)."),
        HarnessMetric("soak_night_ttft_seconds", Kind.GAUGE, "TTFT quantiles of successful requests.", ("quantile",)),
        HarnessMetric("soak_night_tpot_seconds", Kind.GAUGE, "TPOT quantiles of successful requests.", ("quantile",)),
        HarnessMetric("soak_night_prefix_hit_ratio", Kind.GAUGE, "Server-measured prefix-cache hit ratio over the night."),
        HarnessMetric("soak_night_thresholds_breached", Kind.GAUGE, "Thresholds the night breached."),
        HarnessMetric("soak_build_runs", Kind.GAUGE, "Runs of the build in the history."),
        HarnessMetric("soak_build_exposure_seconds", Kind.GAUGE, "The build's pooled exposure (time at risk)."),
        HarnessMetric("soak_build_hangs", Kind.GAUGE, "The build's hangs in its pooled exposure."),
        HarnessMetric("soak_build_mtbf_seconds", Kind.GAUGE, "The build's MTBF point estimate (absent with no hang)."),
        HarnessMetric("soak_build_mtbf_lower_bound_seconds", Kind.GAUGE,
                      "The build's MTBF proven at the history's confidence (one-sided exact chi-square bound)."),
        HarnessMetric("soak_build_mtbf_interval_seconds", Kind.GAUGE,
                      "The build's two-sided exact MTBF interval (bound lower / upper; upper absent with no hang).",
                      ("bound",)),
        HarnessMetric("soak_build_fixed", Kind.GAUGE,
                      "The build's one verdict (soak history: the sequential test's where --prove tested it, else "
                      "against the baseline): 1 fixed, 0 not fixed, -1 not yet shown; absent for the baseline."),
        HarnessMetric("soak_build_verdict", Kind.INFO, "The build's one verdict as soak history says it: its "
                      "standing (fixed, not fixed, not yet shown, baseline) and its sentence.", ("standing", "sentence")),
        HarnessMetric("soak_build_better_confidence", Kind.GAUGE,
                      "Confidence that the build hangs less often than the baseline (exact Poisson rate-ratio test)."),
    )
}
# The Pushgateway's own series beside every pushed group.
PUSHGATEWAY_SERIES = frozenset({"push_time_seconds", "push_failure_time_seconds"})


def pushed_series_names() -> frozenset[str]:
    return frozenset(name for metric in PUSHED_METRICS.values() for name in metric.series_names) | PUSHGATEWAY_SERIES


def exported_series_names() -> frozenset[str]:
    """Every sample name the harness can expose."""
    return frozenset(name for metric in HARNESS_METRICS.values() for name in metric.series_names)
