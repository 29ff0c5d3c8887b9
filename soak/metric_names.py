"""The one table of the metric names soak reads and the simulator writes.

Versions drift, so names are data: every other module looks a metric up here by
its short key (``"generation_tokens"``) and never spells ``vllm:...`` itself.

``exposed`` is the family name as prometheus_client's parser reports it (a
counter's family drops ``_total``); ``aliases`` are other family names the same
quantity has been published under (hidden deprecated names, v0 names), tried in
order when the primary is absent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Sequence


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
DCGM_FIELDS: dict[str, DcgmField] = {
    f.key: f
    for f in (
        DcgmField("util", "DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "percent"),
        DcgmField("mem_used_mib", "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "MiB"),
        DcgmField("mem_free_mib", "DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "MiB"),
        DcgmField("power_w", "DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "W"),
        DcgmField("sm_clock_mhz", "DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "MHz"),
        DcgmField("xid_errors", "DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", "xid"),
        # A counter that grows whenever a GPU draws power: proof that the exporter collected anew.
        DcgmField("energy_mj", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).", "mJ"),
        # 3.3.x images (the compose file's) export PCIe as NVML throughput in KB/s.
        DcgmField("pcie_tx_kbs", "DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "Total number of bytes transmitted through PCIe TX (in KB) via NVML.", "KB/s"),
        DcgmField("pcie_rx_kbs", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "Total number of bytes received through PCIe RX (in KB) via NVML.", "KB/s"),
        DcgmField("pcie_tx_bytes", "DCGM_FI_PROF_PCIE_TX_BYTES", "PCIe tx bytes (profiling; not on GeForce).", "B/s"),
        DcgmField("pcie_rx_bytes", "DCGM_FI_PROF_PCIE_RX_BYTES", "PCIe rx bytes (profiling; not on GeForce).", "B/s"),
    )
}


# vLLM's process titles (setproctitle, ``{prefix}::{name}``, prefix VLLM_PROCESS_NAME_PREFIX).
# - The API server is untitled when it is the only one (the title stays the command
#   line, ``vllm serve ...``); with ``--api-server-count`` > 1 each is ``APIServer_<i>``.
# - The engine core is ``EngineCore`` (``EngineCore_DP<d>`` with data parallelism).
# - A worker is ``Worker`` plus one ``_<GROUP><rank>`` for each parallel group larger
#   than one, in the order of WORKER_GROUPS (0.11.2: DP, PP, TP, DCP, EP; 0.33 adds
#   PCP after PP); 0.33 titles a worker a bare ``Worker`` before the groups exist.
PROCESS_NAME_PREFIX = "VLLM"
WORKER_GROUPS: tuple[str, ...] = ("DP", "PP", "PCP", "TP", "DCP", "EP")


class ProcessRole(str, Enum):
    API_SERVER = "api_server"
    ENGINE_CORE = "engine_core"
    WORKER = "worker"
    OTHER = "other"  # a titled vLLM process soak has no use for (DPCoordinator, ...)


@dataclass(frozen=True)
class ProcessTitle:
    """A parsed vLLM process title: ``VLLM::Worker_DP0_PP3_TP1`` -> worker, groups {DP: 0, PP: 3, TP: 1}."""

    prefix: str
    name: str
    role: ProcessRole
    groups: tuple[tuple[str, int], ...] = ()
    index: int | None = None  # APIServer_<i>

    def group(self, name: str) -> int | None:
        return dict(self.groups).get(name)

    @property
    def pipeline_stage(self) -> int | None:
        """The worker's pipeline stage: its PP rank, 0 when the pipeline is one stage
        (no ``_PP`` part), None for a bare ``Worker`` (groups not set up yet) or a non-worker."""
        if self.role is not ProcessRole.WORKER or not self.groups:
            return None
        return self.group("PP") or 0


_TITLE_RE = re.compile(r"(?:^|[\s/])(?P<prefix>[A-Za-z0-9_.-]+)::(?P<name>[A-Za-z]+(?:_[A-Za-z0-9]+)*)(?=$|\s)")
_GROUP_RE = re.compile(r"^(?P<group>[A-Z]+?)(?P<rank>\d+)$")


def parse_process_title(text: str | Sequence[str]) -> ProcessTitle | None:
    """The vLLM title in a process's title or command line (a string or argv), or None.

    Unknown group names, repeated groups or trailing junk make it None rather than
    a guess: a misread stage would point the detector at the wrong GPU.
    """
    if not isinstance(text, str):
        text = " ".join(text)
    match = _TITLE_RE.search(text)
    if match is None:
        return None
    prefix, name = match.group("prefix"), match.group("name")
    base, *parts = name.split("_")
    if base == "Worker":
        groups: list[tuple[str, int]] = []
        for part in parts:
            m = _GROUP_RE.match(part)
            if m is None or m.group("group") not in WORKER_GROUPS or m.group("group") in dict(groups):
                return None
            groups.append((m.group("group"), int(m.group("rank"))))
        order = [WORKER_GROUPS.index(g) for g, _ in groups]
        if order != sorted(order):
            return None
        return ProcessTitle(prefix, name, ProcessRole.WORKER, tuple(groups))
    if base == "APIServer":
        if len(parts) > 1 or (parts and not parts[0].isdigit()):
            return None
        return ProcessTitle(prefix, name, ProcessRole.API_SERVER, index=int(parts[0]) if parts else None)
    if base == "EngineCore":
        groups = []
        for part in parts:
            m = _GROUP_RE.match(part)
            if m is None or m.group("group") != "DP":
                return None
            groups.append(("DP", int(m.group("rank"))))
        return ProcessTitle(prefix, name, ProcessRole.ENGINE_CORE, tuple(groups))
    return ProcessTitle(prefix, name, ProcessRole.OTHER)


def engine_core_title(prefix: str = PROCESS_NAME_PREFIX) -> str:
    return f"{prefix}::EngineCore"


def worker_name(*, pp_rank: int | None = None, tp_rank: int | None = None, dp_rank: int | None = None,
                pcp_rank: int | None = None, dcp_rank: int | None = None, ep_rank: int | None = None) -> str:
    """vLLM's worker name: ``Worker`` plus the ranks of the groups given (those larger than one)."""
    ranks = {"DP": dp_rank, "PP": pp_rank, "PCP": pcp_rank, "TP": tp_rank, "DCP": dcp_rank, "EP": ep_rank}
    return "Worker" + "".join(f"_{g}{r}" for g, r in ranks.items() if r is not None)


def worker_title(pp_rank: int, tp_rank: int | None = None, prefix: str = PROCESS_NAME_PREFIX) -> str:
    return f"{prefix}::{worker_name(pp_rank=pp_rank, tp_rank=tp_rank)}"
