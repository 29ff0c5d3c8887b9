"""The one table of the metric names soak reads and the simulator writes.

Versions drift, so names are data: every other module looks a metric up here by
its short key (``"generation_tokens"``) and never spells ``vllm:...`` itself.

``exposed`` is the family name as prometheus_client's parser reports it (a
counter's family drops ``_total``); ``aliases`` are other family names the same
quantity has been published under (hidden deprecated names, v0 names), tried in
order when the primary is absent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class MetricType(str, Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True)
class MetricSpec:
    key: str
    exposed: str
    type: MetricType
    help: str
    extra_labels: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None
    spec_decode_only: bool = False
    hidden: bool = False  # only with --show-hidden-metrics-for-version

    @property
    def sample_names(self) -> tuple[str, ...]:
        """The sample names as they appear on the wire."""
        if self.type is MetricType.COUNTER:
            return (f"{self.exposed}_total", f"{self.exposed}_created")
        if self.type is MetricType.HISTOGRAM:
            return tuple(f"{self.exposed}{s}" for s in ("_bucket", "_sum", "_count", "_created"))
        return (self.exposed,)


BASE_LABELS: tuple[str, ...] = ("model_name", "engine")

# vLLM 0.11 bucket bounds (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def buckets_1_2_5(max_value: int) -> tuple[int, ...]:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to max_value."""
    out: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(value)
        exponent += 1


def _c(key, help, **kw) -> MetricSpec:
    return MetricSpec(key, f"vllm:{key}", MetricType.COUNTER, help, **kw)


def _g(key, help, **kw) -> MetricSpec:
    return MetricSpec(key, f"vllm:{key}", MetricType.GAUGE, help, **kw)


def _h(key, help, buckets, **kw) -> MetricSpec:
    return MetricSpec(key, f"vllm:{key}", MetricType.HISTOGRAM, help, buckets=tuple(buckets), **kw)


# Bucket bounds of the token-count histograms depend on max_model_len; the
# simulator fills them in with buckets_1_2_5(max_model_len).
VLLM_METRICS: dict[str, MetricSpec] = {
    m.key: m
    for m in (
        _g("num_requests_running", "Number of requests in model execution batches."),
        _g("num_requests_waiting", "Number of requests waiting to be processed."),
        _g(
            "kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            aliases=("vllm:gpu_cache_usage_perc",),
        ),
        _g(
            "gpu_cache_usage_perc",
            "GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
            hidden=True,
        ),
        _c("prompt_tokens", "Number of prefill tokens processed."),
        _c("generation_tokens", "Number of generation tokens processed."),
        _c("request_success", "Count of successfully processed requests.", extra_labels=("finished_reason",)),
        _c(
            "prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            aliases=("vllm:gpu_prefix_cache_queries",),
        ),
        _c(
            "prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            aliases=("vllm:gpu_prefix_cache_hits",),
        ),
        _c(
            "gpu_prefix_cache_queries",
            "GPU prefix cache queries, in terms of number of queried tokens. DEPRECATED: Use vllm:prefix_cache_queries instead.",
            hidden=True,
        ),
        _c(
            "gpu_prefix_cache_hits",
            "GPU prefix cache hits, in terms of number of cached tokens. DEPRECATED: Use vllm:prefix_cache_hits instead.",
            hidden=True,
        ),
        _c("num_preemptions", "Cumulative number of preemption from the engine."),
        _c("spec_decode_num_drafts", "Number of spec decoding drafts.", spec_decode_only=True),
        _c("spec_decode_num_draft_tokens", "Number of draft tokens.", spec_decode_only=True),
        _c("spec_decode_num_accepted_tokens", "Number of accepted tokens.", spec_decode_only=True),
        _c(
            "spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            extra_labels=("position",),
            spec_decode_only=True,
        ),
        _h("time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS),
        _h("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS),
        _h(
            "time_per_output_token_seconds",
            "Histogram of time per output token in seconds.DEPRECATED: Use vllm:inter_token_latency_seconds instead.",
            ITL_BUCKETS,
        ),
        _h("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS),
        _h("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS),
        _h("request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS),
        _h("request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS),
        _h(
            "request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ),
        _h("request_prompt_tokens", "Number of prefill tokens processed.", ()),
        _h("request_generation_tokens", "Number of generation tokens processed.", ()),
        _h("iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_TOKENS_BUCKETS),
    )
}


@dataclass(frozen=True)
class DcgmField:
    key: str
    exposed: str
    help: str
    unit: str


# dcgm-exporter's default port and the fields soak reads. GeForce cards have no
# DCGM_FI_PROF_* fields, so none are relied on.
DCGM_DEFAULT_PORT = 9400
DCGM_LABELS: tuple[str, ...] = ("gpu", "UUID", "device", "modelName", "Hostname")
DCGM_FIELDS: dict[str, DcgmField] = {
    f.key: f
    for f in (
        DcgmField("util", "DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "percent"),
        DcgmField("mem_used_mib", "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "MiB"),
        DcgmField("mem_free_mib", "DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "MiB"),
        DcgmField("power_w", "DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "W"),
        DcgmField("sm_clock_mhz", "DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "MHz"),
        DcgmField("xid_errors", "DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", "xid"),
        DcgmField("pcie_tx_bytes", "DCGM_FI_PROF_PCIE_TX_BYTES", "PCIe tx bytes (profiling; not on GeForce).", "B/s"),
        DcgmField("pcie_rx_bytes", "DCGM_FI_PROF_PCIE_RX_BYTES", "PCIe rx bytes (profiling; not on GeForce).", "B/s"),
    )
}


# vLLM's process titles (setproctitle, prefix VLLM_PROCESS_NAME_PREFIX).
PROCESS_NAME_PREFIX = "VLLM"


def api_server_title(prefix: str = PROCESS_NAME_PREFIX) -> str:
    return f"{prefix}::APIServer"


def engine_core_title(prefix: str = PROCESS_NAME_PREFIX) -> str:
    return f"{prefix}::EngineCore"


def worker_title(pp_rank: int, tp_rank: int | None = None, prefix: str = PROCESS_NAME_PREFIX) -> str:
    title = f"{prefix}::Worker_PP{pp_rank}"
    return f"{title}_TP{tp_rank}" if tp_rank is not None else title
