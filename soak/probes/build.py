"""Wiring: the probes a run needs, from the config and the target's facts."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from soak.clock import Clock
from soak.proc.snapshots import ProcSnapshots
from soak.probes.config import DcgmGpu, NoGpu, NvmlGpu, ProbesConfig, SimGpu, StageCpuGpu
from soak.probes.gpu import DcgmGpuSource, GpuProbe, NvmlGpuSource, SimGpuSource
from soak.records import GpuSourceLike, Topology
from soak.probes.logwatch import LogProbe
from soak.probes.metrics import MetricsProbe
from soak.probes.scheduler import Probe
from soak.probes.target import ClientProbe, HealthProbe, ProcessProbe, ProgressSource


def build_gpu_source(
    config: ProbesConfig,
    *,
    base_url: str,
    session,
    clock: Clock,
    is_simulator: bool,
    nvml_provider: Any | None = None,
    root_pid: Callable[[], int | None] | None = None,
    proc: ProcSnapshots | None = None,
    topology: Topology | None = None,
) -> GpuSourceLike | None:
    """The configured GPU source (None for ``kind: none``). For ``nvml`` call
    ``await source.open()`` before the run: it raises GpuUnavailable (exit 3).
    ``root_pid``/``proc``/``topology``: what the stage-CPU source reads (the
    target's tree through the shared /proc reader; the detector's stage indices)."""
    gpu = config.gpu
    if isinstance(gpu, NoGpu):
        return None
    if isinstance(gpu, StageCpuGpu):
        return stage_cpu_source(clock=clock, root_pid=root_pid, proc=proc, topology=topology)
    if isinstance(gpu, SimGpu) or (gpu.kind == "auto" and is_simulator):
        return SimGpuSource(base_url, session=session, clock=clock, timeout_s=config.timeout)
    if isinstance(gpu, DcgmGpu):
        return DcgmGpuSource(gpu.url, session=session, clock=clock, timeout_s=config.timeout, indices=gpu.indices)
    if isinstance(gpu, NvmlGpu) and gpu.per_process:
        from soak.probes.process_source import NvmlProcessGpuSource

        return NvmlProcessGpuSource(stages=gpu.stages, clock=clock, device_indices=gpu.indices or (0,),
                                    window_s=gpu.window, deadline_s=gpu.deadline, nvml=nvml_provider)
    if isinstance(gpu, NvmlGpu):
        return NvmlGpuSource(clock=clock, provider=nvml_provider, indices=gpu.indices, deadline_s=gpu.deadline)
    return NvmlGpuSource(clock=clock, provider=nvml_provider)


def stage_cpu_source(*, clock: Clock, root_pid: Callable[[], int | None] | None,
                     proc: ProcSnapshots | None, topology: Topology | None, why: str = "") -> GpuSourceLike:
    from soak.probes.stage_cpu import StageCpuSource

    reader = proc or ProcSnapshots()
    return StageCpuSource(clock=clock, root_pid=root_pid or (lambda: None),
                          descendants=lambda pid: reader.table().descendants(pid), topology=topology, why=why)


async def open_gpu_source(source: GpuSourceLike | None, config: ProbesConfig, *, is_simulator: bool,
                          clock: Clock, root_pid: Callable[[], int | None] | None = None,
                          proc: ProcSnapshots | None = None, topology: Topology | None = None) -> GpuSourceLike | None:
    """``source`` opened. ``auto`` without NVML on a server whose processes carry
    ``VLLM::Worker`` titles (vLLM's CPU build) reads stage CPU instead; with no such
    process the NVML error stands (GpuUnavailable, exit 3). Before the server has
    started (no root yet) the titles cannot be checked: stage CPU is taken, and its
    readings fail, naming why, while no worker shows."""
    from soak.errors import GpuUnavailable

    if source is None:
        return None
    try:
        await source.open()
        return source
    except GpuUnavailable as nvml_missing:
        if config.gpu.kind != "auto" or is_simulator or root_pid is None:
            raise
        fallback = stage_cpu_source(clock=clock, root_pid=root_pid, proc=proc, topology=topology,
                                    why=f"auto: {nvml_missing}")
        if root_pid() is None:
            # Opened before the server starts (launched, attached): its titles cannot be
            # checked yet; each reading says so while the server shows no VLLM::Worker.
            return fallback
        try:
            await fallback.open()
        except GpuUnavailable:
            raise nvml_missing from None
        return fallback


def build_probes(
    config: ProbesConfig,
    *,
    base_url: str,
    session,
    clock: Clock,
    gpu_source: GpuSourceLike | None = None,
    root_pid: int | None = None,
    returncode: Callable[[], int | None] | None = None,
    log_path: str | Path | None = None,
    log_from_start: bool = True,
    progress: ProgressSource | None = None,
    version_profile: Any = None,
    proc: ProcSnapshots | None = None,
) -> list[Probe]:
    metrics = MetricsProbe(base_url, session=session, clock=clock, interval_s=config.metrics_interval, timeout_s=config.timeout)
    metrics.version_profile = version_profile  # soak.versions.VllmProfile: no warning for names the version lacks
    probes: list[Probe] = [
        metrics,
        HealthProbe(base_url, session=session, clock=clock, interval_s=config.health_interval, timeout_s=config.timeout),
    ]
    if gpu_source is not None:
        probes.append(GpuProbe(gpu_source, interval_s=config.gpu_interval))
    if root_pid is not None:
        probes.append(ProcessProbe(root_pid, clock=clock, interval_s=config.process_interval, returncode=returncode,
                                   proc=proc))
    path = config.log_path or log_path
    if path is not None:
        from_start = log_from_start if config.log_path is None else False
        probes.append(LogProbe(path, clock=clock, interval_s=config.log_interval, from_start=from_start))
    if progress is not None:
        probes.append(ClientProbe(progress, clock=clock, interval_s=config.client_interval))
    return probes


def build_canary_probe(oracle: Any, *, workload: Any, model: str, base_url: str, session, clock: Clock,
                       on_sample: Callable, emit: Callable, seed: int, concurrency: int, tracker: Any = None,
                       api_key: str | None = None) -> Any:
    """The canary probe for ``oracle`` (the ``oracle:`` section), or None when it is
    off or has no prompt. Its references: the file ``oracle.reference`` names (the
    entries whose request digest matches), else this run's first answers."""
    from soak.oracle.book import ReferenceBook
    from soak.probes.canary import Canary, CanaryProbe
    from soak.probes.canary_prompts import body_of, long_prompts, short_prompts

    if oracle is None or not oracle.enabled:
        return None
    prompts = [(p, None) for p in short_prompts(count=oracle.short, seed=seed, max_tokens=oracle.max_tokens)]
    longs, note = long_prompts(workload, count=oracle.long, max_tokens=oracle.max_tokens)
    if note:
        from soak.events import EventType

        emit(EventType.WARNING, message=note)
    # Long ones between the short ones, so each kind is asked early in the night.
    ordered = []
    for i in range(max(len(prompts), len(longs))):
        ordered += prompts[i:i + 1] + longs[i:i + 1]
    canaries = [Canary(p, body_of(p, model=model, top_logprobs=oracle.top_logprobs, tool_choice=choice))
                for p, choice in ordered]
    if not canaries:
        return None
    recorded = None
    if oracle.reference:
        from soak.events import EventType
        from soak.oracle.reference import matching, mismatches, read_reference

        ref_file = read_reference(oracle.reference)
        digests = {c.prompt.canary_id: c.prompt.digest for c in canaries}
        budgets = {c.prompt.canary_id: c.prompt.max_tokens for c in canaries}
        recorded = matching(ref_file, digests, max_tokens=budgets, model=model)
        for why in mismatches(ref_file, digests, max_tokens=budgets, model=model):
            emit(EventType.WARNING, message=f"oracle reference: {why}")
    book = ReferenceBook(tie_margin=oracle.tie_margin, recorded=recorded)
    return CanaryProbe(canaries, base_url=base_url, session=session, book=book, on_sample=on_sample, emit=emit,
                       clock=clock, interval_s=oracle.interval, max_share=oracle.max_share,
                       timeout_s=oracle.timeout, concurrency=concurrency, tracker=tracker, api_key=api_key)
