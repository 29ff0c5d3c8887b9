"""A GPU source that reads NVML per process and reports one virtual GPU per
pipeline stage: for pipelines whose stages share GPUs (one GPU on a test box,
or several stages packed on one GPU).

A device-level reading cannot show the deadlock signature when every stage
shares one GPU: one spinning rank is enough to read 100%. NVML also keeps SM
utilization per process (``nvmlDeviceGetProcessUtilization``), but differently
from the device figure, as measured on an H200 (tests/gpu/device/):

- it returns one entry per process, its latest sample, and leaves out processes
  that ran nothing in that sample: so a sampler thread polls it every 100 ms
  and keeps the distinct entries, and a stage with no entry in the window ran
  no kernel at all (exact: it reads 0%);
- processes sharing a GPU are time-sliced, so two ranks spinning at once read
  about 50% each (40/60, 50/50) while the device reads 100%.

So a stage's reading is built on what per-process NVML tells reliably: whether
the stage ran a kernel at all in the window (``window_s``, 1 s by default: a hung
tail reads dark that long after its last kernel; shorter, and a stage that
time-slicing kept off the GPU for a moment reads dark too). ``mode="device_if_ran"`` (the
default) gives a stage that ran the device's utilization over the window and a
stage that ran nothing 0%: the tail stall reads upstream 100% / last 0%
exactly, and a healthy stage reads 0% only when it ran nothing for a whole window.
``mode="dedicated"`` estimates ``device_util x share x k`` capped at 100 (``k``:
the stages that ran), what a stage would read on a GPU of its own if the stages'
work overlaps; on the H200 three spinning stages read 25-100% in successive
2-second windows with it, since their time slices are uneven.
``mode="share"`` is the plain ``device_util x share``.

Each compute process on the GPU is mapped to its stage by its process title
(``VLLM::Worker_..._PP<r>_...``, parsed by soak.metric_names.parse_process_title) or, for soak's own programs, its ``--rank R``. Stage
``r`` is reported as ``GpuReading(index=r, ...)`` with the stage's PIDs, so the
detector's per-stage rules and the responder's "GPU free" check work unchanged.

The pure part (``stage_of``, ``stage_readings``) takes plain values; the
adapter ``NvmlProcessGpuSource`` does the NVML calls off the event loop, with
a deadline, and never raises out of ``read()``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

from soak.metric_names import ProcessRole, parse_process_title
from soak.samples import GpuReading, GpuSample, GpuSource

_OWN_PROGRAMS = ("soak.rigs.cuda_worker", "soak.rigs.pp_nccl")

Mode = Literal["device_if_ran", "dedicated", "share"]


def stage_of(cmdline: Sequence[str]) -> int | None:
    """The pipeline stage a process serves, from its command line, or None.

    vLLM titles its workers ``VLLM::Worker`` plus a part per parallel group
    larger than one (``Worker_DP0_PP3_TP1``, ``_PCP``, ``_DCP``, ``_EP``; any
    prefix): the PP rank is the stage, a worker with no ``_PP`` part serves the
    one stage 0, and a bare ``Worker`` (0.33, before its groups exist) is not
    placed yet. soak's own programs say ``--rank 3``.
    """
    text = " ".join(cmdline)
    title = parse_process_title(text)
    if title is not None and title.role is ProcessRole.WORKER:
        return title.pipeline_stage
    if any(program in text for program in _OWN_PROGRAMS):
        for flag, value in zip(cmdline, cmdline[1:]):
            if flag == "--rank" and value.isdigit():
                return int(value)
    return None


@dataclass(frozen=True)
class ProcessUtilSample:
    """One entry of nvmlDeviceGetProcessUtilization: a process's SM time in one sample."""

    pid: int
    ts_us: int
    sm_util: float


def stage_readings(
    *,
    stages: int,
    pid_stage: Mapping[int, int],
    util_samples: Iterable[ProcessUtilSample],
    device_util_pct: float,
    mem_used_mib: Mapping[int, float],
    mem_total_mib: float | None,
    mode: Mode = "device_if_ran",
    uuid: str | None = None,
) -> tuple[GpuReading, ...]:
    """One reading per stage from the per-process samples of one window.

    ``mem_used_mib`` holds the processes NVML lists on the GPU; a stage's
    ``pids`` are those of its processes, empty once they are gone (how the kill
    path sees the stage's GPU free).
    """
    per_stage = [0.0] * stages
    for sample in util_samples:
        stage = pid_stage.get(sample.pid)
        if stage is not None and 0 <= stage < stages and sample.pid in mem_used_mib:
            per_stage[stage] += max(sample.sm_util, 0.0)
    total = sum(per_stage)
    running = sum(1 for value in per_stage if value > 0)
    readings = []
    for stage in range(stages):
        share = per_stage[stage] / total if total > 0 else 0.0
        if mode == "device_if_ran":
            util = device_util_pct if per_stage[stage] > 0 else 0.0
        else:
            util = device_util_pct * share * (running if mode == "dedicated" else 1)
        pids = tuple(sorted(pid for pid, s in pid_stage.items() if s == stage and pid in mem_used_mib))
        readings.append(
            GpuReading(
                index=stage,
                util_pct=round(min(util, 100.0), 1),
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


class _Sampler:
    """Polls per-process and device utilization on a daemon thread, keeping a window."""

    def __init__(self, nvml: Any, handles: Sequence[Any], *, interval_s: float, keep_s: float) -> None:
        self._nvml = nvml
        self._handles = handles
        self._interval_s = interval_s
        self._keep_us = int(keep_s * 1e6)
        self._lock = threading.Lock()
        self._proc: deque[ProcessUtilSample] = deque()
        self._seen: set[tuple[int, int]] = set()
        self._device: deque[tuple[int, float]] = deque()
        self._device_last_us = [0] * len(handles)
        self.last_ok: float | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="nvml-per-process")
        self._thread.start()

    def _poll_once(self) -> None:
        nvml = self._nvml
        now_us = int(time.time() * 1e6)
        fresh: list[ProcessUtilSample] = []
        device: list[tuple[int, float]] = []
        for i, handle in enumerate(self._handles):
            try:
                entries = nvml.nvmlDeviceGetProcessUtilization(handle, 0)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) != nvml.NVML_ERROR_NOT_FOUND:
                    raise
                entries = []  # no process ran a kernel in the latest sample
            for e in entries:
                fresh.append(ProcessUtilSample(int(e.pid), int(e.timeStamp), float(e.smUtil)))
            try:
                _, samples = nvml.nvmlDeviceGetSamples(handle, nvml.NVML_GPU_UTILIZATION_SAMPLES, self._device_last_us[i])
                for s in samples:
                    device.append((int(s.timeStamp), float(s.sampleValue.uiVal)))
                    self._device_last_us[i] = max(self._device_last_us[i], int(s.timeStamp))
            except nvml.NVMLError:
                device.append((now_us, float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)))
        with self._lock:
            for sample in fresh:
                key = (sample.pid, sample.ts_us)
                if key not in self._seen:
                    self._seen.add(key)
                    self._proc.append(sample)
            self._device.extend(device)
            horizon = now_us - self._keep_us
            while self._proc and self._proc[0].ts_us < horizon:
                old = self._proc.popleft()
                self._seen.discard((old.pid, old.ts_us))
            while self._device and self._device[0][0] < horizon:
                self._device.popleft()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll_once()
                self.last_ok, self.error = time.monotonic(), None
            except Exception as exc:  # reported by the next read()
                self.error = f"{type(exc).__name__}: {exc}"
            self._stop.wait(self._interval_s)

    def window(self, seconds: float) -> tuple[list[ProcessUtilSample], float | None]:
        since = int((time.time() - seconds) * 1e6)
        with self._lock:
            proc = [s for s in self._proc if s.ts_us >= since]
            device = [v for ts, v in self._device if ts >= since]
        return proc, (sum(device) / len(device) if device else None)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=self._interval_s + 2.0)


class NvmlProcessGpuSource:
    """``async read() -> GpuSample``: stage ``r`` of a pipeline whose stages share GPUs.

    ``stages`` is the pipeline size (None: one more than the highest stage seen
    so far); a stage with no process on the GPU reads 0% with no PIDs. Each reading covers the last ``window_s`` seconds of samples.
    ``cmdline_of`` maps a PID to its command line (psutil by default); ``nvml``
    is the ``pynvml`` module, injectable for tests.
    """

    def __init__(
        self,
        *,
        stages: int | None,
        clock,
        device_indices: Sequence[int] = (0,),
        mode: Mode = "device_if_ran",
        window_s: float = 1.0,
        poll_interval_s: float = 0.1,
        deadline_s: float = 2.0,
        nvml: Any = None,
        cmdline_of: Callable[[int], Sequence[str]] = _cmdline,
    ) -> None:
        self._stages = stages
        self._clock = clock
        self._indices = tuple(device_indices)
        self._mode: Mode = mode
        self._window_s = window_s
        self._poll_interval_s = poll_interval_s
        self._deadline_s = deadline_s
        self._nvml = nvml
        self._cmdline_of = cmdline_of
        self._pid_stage: dict[int, int | None] = {}
        self._stages_seen = 0
        self._handles: list[Any] = []
        self._sampler: _Sampler | None = None
        self._lock = threading.Lock()
        self._closed = False

    def _start(self) -> None:
        with self._lock:
            if self._sampler is not None:
                return
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in self._indices]
            self._sampler = _Sampler(
                self._nvml, self._handles, interval_s=self._poll_interval_s, keep_s=max(self._window_s * 3, 10.0)
            )

    def read_blocking(self) -> tuple[GpuReading, ...]:
        self._start()
        assert self._sampler is not None
        nvml = self._nvml
        if self._sampler.error is not None:
            raise RuntimeError(self._sampler.error)
        if self._sampler.last_ok is not None and time.monotonic() - self._sampler.last_ok > self._deadline_s + 1.0:
            raise RuntimeError("NVML per-process sampler stalled")
        mem: dict[int, float] = {}
        mem_total = 0.0
        uuid = None
        for handle in self._handles:
            mem_total += nvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20
            if uuid is None:
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                mem[proc.pid] = mem.get(proc.pid, 0.0) + (proc.usedGpuMemory or 0) / 2**20
        for pid in mem:
            if self._pid_stage.get(pid) is None:  # a bare ``Worker`` gets its groups later: read it again
                self._pid_stage[pid] = stage_of(self._cmdline_of(pid))
        pid_stage = {pid: stage for pid, stage in self._pid_stage.items() if stage is not None and pid in mem}
        self._stages_seen = max([self._stages_seen, *(stage + 1 for stage in pid_stage.values())])
        stages = self._stages if self._stages is not None else self._stages_seen
        samples, device_util = self._sampler.window(self._window_s)
        if device_util is None:
            device_util = float(sum(nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self._handles)) / len(self._handles)
        return stage_readings(
            stages=stages,
            pid_stage=pid_stage,
            util_samples=samples,
            device_util_pct=device_util,
            mem_used_mib=mem,
            mem_total_mib=mem_total or None,
            mode=self._mode,
            uuid=uuid,
        )

    async def open(self) -> None:
        """Start NVML and the sampler; GpuUnavailable (exit 3) when there is no NVML or GPU."""
        from soak.errors import GpuUnavailable

        try:
            await asyncio.wait_for(asyncio.to_thread(self._start), self._deadline_s + 3.0)
        except asyncio.TimeoutError as exc:
            raise GpuUnavailable("NVML did not answer") from exc
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, a bad index, ...
            raise GpuUnavailable(f"NVML unavailable: {exc}") from exc

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
        """Stops the sampler and shuts NVML down; idempotent."""
        with self._lock:
            sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.stop()
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass

    async def aclose(self) -> None:
        self.close()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
