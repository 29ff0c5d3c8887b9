"""A GPU source that reads NVML per process and reports one virtual GPU per
pipeline stage: for pipelines whose stages share GPUs (one GPU on a test box,
or several stages packed per GPU).

A device-level reading cannot show the deadlock signature when every stage
shares one GPU: one spinning rank is enough to read 100%. NVML also keeps
utilization per process (``nvmlDeviceGetProcessUtilization``: SM time of each
process in the last sample period; processes that ran nothing are left out).
This source maps each compute process on the GPU to its pipeline stage (its
process title ``VLLM::Worker_PP<r>``, or the ``--rank R`` of soak's own worker
programs), and reports stage ``r`` as ``GpuReading(index=r, ...)``: the rules
that read per-stage GPUs (``pp_tail_stall``) then work unchanged.

The pure part (``stage_of``, ``stage_readings``) takes plain values; the
adapter ``NvmlProcessGpuSource`` does the NVML calls in a worker thread with a
deadline, like every NVML probe, and never raises out of ``read()``.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from soak.samples import GpuReading, GpuSample, GpuSource

_TITLE = re.compile(r"::Worker_PP(\d+)(?:_TP\d+)?\b")
_OWN_PROGRAMS = ("soak.gpu.cuda_worker", "soak.gpu.pp_nccl")


def stage_of(cmdline: Sequence[str]) -> int | None:
    """The pipeline stage a process serves, from its command line, or None.

    ``VLLM::Worker_PP3`` (any prefix, any ``_TP`` suffix) is stage 3, as vLLM
    titles its workers; soak's own programs say ``--rank 3``.
    """
    text = " ".join(cmdline)
    match = _TITLE.search(text)
    if match:
        return int(match.group(1))
    if any(program in text for program in _OWN_PROGRAMS):
        for flag, value in zip(cmdline, cmdline[1:]):
            if flag == "--rank" and value.isdigit():
                return int(value)
    return None


@dataclass(frozen=True)
class ProcessUtilSample:
    """One entry of nvmlDeviceGetProcessUtilization."""

    pid: int
    ts_us: int
    sm_util: float


def stage_readings(
    *,
    stages: int,
    pid_stage: Mapping[int, int],
    util_samples: Iterable[ProcessUtilSample],
    mem_used_mib: Mapping[int, float],
    mem_total_mib: float | None,
    uuid: str | None = None,
) -> tuple[GpuReading, ...]:
    """One reading per stage: the summed SM utilization of its processes.

    A process NVML lists without a utilization sample ran nothing in the
    period (NVML leaves such processes out), so it counts as 0%. A stage's
    ``pids`` are its processes NVML lists on the GPU: empty once they are gone,
    which is how the kill path sees the stage's GPU free.
    """
    per_pid: dict[int, list[float]] = {}
    for sample in util_samples:
        per_pid.setdefault(sample.pid, []).append(sample.sm_util)
    readings = []
    for stage in range(stages):
        pids = tuple(sorted(pid for pid, s in pid_stage.items() if s == stage and pid in mem_used_mib))
        util = sum(sum(per_pid[p]) / len(per_pid[p]) for p in pids if p in per_pid)
        readings.append(
            GpuReading(
                index=stage,
                util_pct=min(float(util), 100.0),
                mem_used_mib=float(sum(mem_used_mib[p] for p in pids)),
                mem_total_mib=mem_total_mib,
                pids=pids,
                uuid=f"{uuid}/stage{stage}" if uuid else None,
            )
        )
    return tuple(readings)


def _cmdline(pid: int) -> Sequence[str]:
    import psutil

    try:
        return psutil.Process(pid).cmdline()
    except (psutil.Error, OSError):
        return ()


class NvmlProcessGpuSource:
    """``async read() -> GpuSample``: stage ``r`` of a pipeline whose stages share GPUs.

    ``stages`` is the pipeline size; stages with no process on the GPU read 0%
    with no PIDs. ``cmdline_of`` maps a PID to its command line (psutil by
    default); ``nvml`` is the ``pynvml`` module, injectable for tests.
    """

    def __init__(
        self,
        *,
        stages: int,
        device_indices: Sequence[int] = (0,),
        clock,
        deadline_s: float = 2.0,
        nvml: Any = None,
        cmdline_of: Callable[[int], Sequence[str]] = _cmdline,
    ) -> None:
        self._stages = stages
        self._indices = tuple(device_indices)
        self._clock = clock
        self._deadline_s = deadline_s
        self._nvml = nvml
        self._cmdline_of = cmdline_of
        self._pid_stage: dict[int, int | None] = {}
        self._last_ts_us: dict[int, int] = {}
        self._initialized = False

    def _init(self):
        if self._nvml is None:
            import pynvml

            self._nvml = pynvml
        if not self._initialized:
            self._nvml.nvmlInit()
            self._initialized = True
        return self._nvml

    def read_blocking(self) -> tuple[GpuReading, ...]:
        nvml = self._init()
        samples: list[ProcessUtilSample] = []
        mem: dict[int, float] = {}
        mem_total = 0.0
        uuid = None
        for index in self._indices:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            mem_total += nvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20
            if uuid is None:
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = proc.usedGpuMemory or 0
                mem[proc.pid] = mem.get(proc.pid, 0.0) + used / 2**20
            last = self._last_ts_us.get(index, 0)
            try:
                entries = nvml.nvmlDeviceGetProcessUtilization(handle, last)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) != nvml.NVML_ERROR_NOT_FOUND:
                    raise
                entries = []  # no process ran a kernel since the last reading
            for entry in entries:
                if entry.timeStamp > last:
                    samples.append(ProcessUtilSample(int(entry.pid), int(entry.timeStamp), float(entry.smUtil)))
            if samples:
                self._last_ts_us[index] = max(last, max(s.ts_us for s in samples))
        for pid in mem:
            if pid not in self._pid_stage:
                self._pid_stage[pid] = stage_of(self._cmdline_of(pid))
        pid_stage = {pid: stage for pid, stage in self._pid_stage.items() if stage is not None and pid in mem}
        return stage_readings(
            stages=self._stages,
            pid_stage=pid_stage,
            util_samples=samples,
            mem_used_mib=mem,
            mem_total_mib=mem_total or None,
            uuid=uuid,
        )

    async def read(self) -> GpuSample:
        ts = self._clock.now()
        try:
            gpus = await asyncio.wait_for(asyncio.to_thread(self.read_blocking), self._deadline_s)
        except asyncio.TimeoutError:
            return GpuSample(ts=ts, source=GpuSource.NVML, gpus=(), error=f"NVML did not answer in {self._deadline_s:g}s")
        except Exception as exc:  # any NVML failure is a failed reading, never an exception out of the probe
            return GpuSample(ts=ts, source=GpuSource.NVML, gpus=(), error=f"{type(exc).__name__}: {exc}")
        return GpuSample(ts=ts, source=GpuSource.NVML, gpus=gpus)

    def close(self) -> None:
        if self._initialized:
            self._initialized = False
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
