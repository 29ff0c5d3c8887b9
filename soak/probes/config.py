"""Probe schedules and sources (section ``probes:`` of a run config).

``gpu`` is tagged by ``kind``:
  ``auto`` (the simulator's GPUs for the simulator target, NVML otherwise),
  ``sim``, ``nvml`` (``indices``: which GPUs; ``deadline``: per NVML call),
  ``dcgm`` (``url`` of a dcgm-exporter), ``stage_cpu`` (no GPU: each pipeline
  stage's CPU time from /proc, soak.probes.stage_cpu), ``none``.
``auto`` on a launched or attached target falls back to ``stage_cpu`` when NVML is
missing (vLLM's CPU build): opened before the server starts, its readings fail
naming why while the server shows no ``VLLM::Worker``; opened beside a server
with no worker, NVML's absence stops the run (exit 3). ``nvml`` always does.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BeforeValidator, Field

from soak.configbase import Duration, StrictModel
from soak.metric_names import DCGM_DEFAULT_PORT


class AutoGpu(StrictModel):
    kind: Literal["auto"] = "auto"


class SimGpu(StrictModel):
    kind: Literal["sim"] = "sim"


class NvmlGpu(StrictModel):
    kind: Literal["nvml"] = "nvml"
    indices: Optional[tuple[int, ...]] = None
    # A call past this is a failed reading (a wedged driver blocks NVML calls).
    deadline: Duration = 2.0
    # Stages share GPUs (one GPU on a test box): read NVML per process and report
    # one virtual GPU per pipeline stage (soak.probes.process_source); ``stages``:
    # the pipeline size, or None to count the stages seen.
    per_process: bool = False
    stages: Optional[int] = None
    # per_process only: a stage reads as having run when its process ran a kernel in
    # the last ``window`` seconds. The tail of a hung pipeline reads dark this long
    # after its last kernel, so it bounds detection from below; shorter than a few of
    # the driver's per-process sample periods (1/6 s on H100/H200) and a healthy
    # stage between kernels would read dark. At most the detector's
    # ``pp_tail_stall.sequential.reading_span`` (2 s): the onset interval takes a
    # reading to cover that long, no longer.
    window: Duration = Field(default=1.0, ge=0.5, le=2.0)


class DcgmGpu(StrictModel):
    kind: Literal["dcgm"] = "dcgm"
    url: str = f"http://127.0.0.1:{DCGM_DEFAULT_PORT}/metrics"
    indices: Optional[tuple[int, ...]] = None


class StageCpuGpu(StrictModel):
    """Not a GPU: each ``VLLM::Worker`` stage's CPU use (percent of one core)."""

    kind: Literal["stage_cpu"] = "stage_cpu"


class NoGpu(StrictModel):
    kind: Literal["none"] = "none"


_GPU_KINDS = {m.model_fields["kind"].default: m for m in (AutoGpu, SimGpu, NvmlGpu, DcgmGpu, StageCpuGpu, NoGpu)}


def _check_gpu_kind(value: Any) -> Any:
    if isinstance(value, dict):
        kind = value.get("kind", "auto")
        if kind not in _GPU_KINDS:
            raise ValueError(f"unknown kind {kind}, known: {', '.join(_GPU_KINDS)}")
        if "kind" not in value:
            value = {**value, "kind": "auto"}
    return value


GpuConfig = Annotated[
    Union[AutoGpu, SimGpu, NvmlGpu, DcgmGpu, StageCpuGpu, NoGpu],
    Field(discriminator="kind"),
    BeforeValidator(_check_gpu_kind),
]


class ProbesConfig(StrictModel):
    gpu: GpuConfig = AutoGpu()
    gpu_interval: Duration = 0.5
    metrics_interval: Duration = 1.0
    health_interval: Duration = 1.0
    process_interval: Duration = 1.0
    client_interval: Duration = 0.5
    log_interval: Duration = 0.1
    # Per HTTP call of a probe (/metrics, /health, dcgm-exporter, /sim/*).
    timeout: Duration = 2.0
    # A log file to watch instead of (or for an attached server, in the absence of)
    # the launched server's captured output.
    log_path: Optional[str] = None
