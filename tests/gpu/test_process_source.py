"""The per-process NVML source: stage mapping and virtual per-stage readings.

NVML itself cannot run here, so these use a stand-in module with pynvml's
call names, error class and record fields; the real module is exercised by
tests/gpu/test_cuda_signature.py on a GPU machine.
"""

from __future__ import annotations

import asyncio
import time
import types

import pytest

from soak.clock import ManualClock
from soak.probes.process_source import NvmlProcessGpuSource, ProcessUtilSample, stage_of, stage_readings


@pytest.mark.parametrize(
    "cmdline, stage",
    [
        (["VLLM::Worker_PP3"], 3),
        (["VLLM::Worker_PP12_TP1"], 12),
        (["MYPREFIX::Worker_PP0"], 0),
        (["/usr/bin/python3", "-m", "soak.rigs.cuda_worker", "--rank", "2", "--pp-size", "4"], 2),
        (["python", "-m", "soak.rigs.pp_nccl", "--rank", "1"], 1),
        (["python", "train.py", "--rank", "1"], None),  # somebody else's program: not a stage
        (["VLLM::EngineCore"], None),
        ([], None),
    ],
)
def test_stage_of_reads_titles_and_own_programs(cmdline, stage):
    assert stage_of(cmdline) == stage


def test_stage_readings_show_the_tail_stall_on_a_shared_gpu():
    # As measured on an H200: two stages spinning at once are time-sliced (about
    # 40/60 of the samples), the last holds memory but runs nothing, so NVML
    # leaves it out of the utilization entries; the device reads 100%.
    kwargs = dict(
        stages=3,
        pid_stage={100: 0, 101: 1, 102: 2, 999: 0},
        util_samples=[
            ProcessUtilSample(100, 1, 40.0),
            ProcessUtilSample(101, 1, 60.0),
            ProcessUtilSample(100, 2, 60.0),
            ProcessUtilSample(101, 2, 40.0),
            ProcessUtilSample(999, 2, 50.0),  # maps to stage 0 but is not on the GPU
        ],
        device_util_pct=99.0,
        mem_used_mib={100: 2048.0, 101: 2048.0, 102: 2048.0},
        mem_total_mib=143771.0,
        uuid="GPU-x",
    )
    dedicated = stage_readings(**kwargs)
    assert [r.index for r in dedicated] == [0, 1, 2]
    assert [r.util_pct for r in dedicated] == [99.0, 99.0, 0.0]
    assert dedicated[2].pids == (102,) and dedicated[2].mem_used_mib == 2048.0
    assert dedicated[0].pids == (100,)
    assert dedicated[1].uuid == "GPU-x/stage1"
    assert [r.util_pct for r in stage_readings(**kwargs, mode="dedicated")] == [99.0, 99.0, 0.0]
    shared = stage_readings(**kwargs, mode="share")
    assert [r.util_pct for r in shared] == [49.5, 49.5, 0.0]


def test_healthy_stages_sharing_a_gpu_each_read_the_pipeline_load():
    # Three busy stages at 84% device utilization, uneven samples (as measured).
    kwargs = dict(
        stages=3,
        pid_stage={1: 0, 2: 1, 3: 2},
        util_samples=[ProcessUtilSample(1, 1, 17.0), ProcessUtilSample(2, 1, 51.0), ProcessUtilSample(3, 1, 17.0),
                      ProcessUtilSample(1, 2, 42.0), ProcessUtilSample(2, 2, 26.0), ProcessUtilSample(3, 2, 17.0)],
        device_util_pct=84.0,
        mem_used_mib={1: 1.0, 2: 1.0, 3: 1.0},
        mem_total_mib=None,
    )
    assert [r.util_pct for r in stage_readings(**kwargs)] == [84.0, 84.0, 84.0]
    dedicated = stage_readings(**kwargs, mode="dedicated")
    assert all(r.util_pct > 40 for r in dedicated)  # no stage looks idle
    assert max(r.util_pct for r in dedicated) == 100.0  # capped


def test_a_stage_with_no_process_reads_free():
    readings = stage_readings(
        stages=2, pid_stage={}, util_samples=[], device_util_pct=0.0, mem_used_mib={}, mem_total_mib=None
    )
    assert [(r.util_pct, r.pids, r.mem_used_mib) for r in readings] == [(0.0, (), 0.0), (0.0, (), 0.0)]


class _NVMLError(Exception):
    def __init__(self, value):
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """A stand-in with pynvml's names: ``procs`` (pid, MiB) and ``running`` {pid: sm%} are mutable."""

    NVML_ERROR_NOT_FOUND = 6
    NVML_GPU_UTILIZATION_SAMPLES = 1
    NVMLError = _NVMLError

    def __init__(self, *, fail_with=None, hang_s=0.0):
        self.procs: list[tuple[int, int]] = []
        self.running: dict[int, float] = {}
        self.ran_ago_s: dict[int, float] = {}  # pid: how long ago its latest sample was (NVML keeps the latest)
        self.fail_with = fail_with
        self.hang_s = hang_s
        self.polls = 0

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("h", i)

    def nvmlDeviceGetMemoryInfo(self, h):
        if self.hang_s:
            time.sleep(self.hang_s)
        return types.SimpleNamespace(total=143771 * 2**20, used=0)

    def nvmlDeviceGetUUID(self, h):
        return b"GPU-abc"

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [types.SimpleNamespace(pid=p, usedGpuMemory=m * 2**20) for p, m in self.procs]

    def nvmlDeviceGetProcessUtilization(self, h, last_ts):
        self.polls += 1
        if self.fail_with is not None:
            raise _NVMLError(self.fail_with)
        if not self.running:
            raise _NVMLError(self.NVML_ERROR_NOT_FOUND)
        now = int(time.time() * 1e6)
        return [types.SimpleNamespace(pid=p, timeStamp=now - int(self.ran_ago_s.get(p, 0.0) * 1e6), smUtil=u)
                for p, u in self.running.items()]

    def nvmlDeviceGetSamples(self, h, kind, last_ts):
        now = int(time.time() * 1e6)
        value = min(100.0, sum(self.running.values()))
        return 1, [types.SimpleNamespace(timeStamp=now, sampleValue=types.SimpleNamespace(uiVal=value))]

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=min(100.0, sum(self.running.values())))


async def _read_until(source, predicate, what):
    for _ in range(200):  # bounded: the sampler polls every 10 ms
        sample = await source.read()
        if predicate(sample):
            return sample
        await asyncio.sleep(0.02)
    raise AssertionError(f"never saw {what}; last: {sample}")


@pytest.fixture
def make_source():
    made = []

    def make(nvml, **kwargs):
        titles = {10: ["VLLM::Worker_PP0"], 11: ["VLLM::Worker_PP1"], 12: ["VLLM::Worker_PP2"], 50: ["python", "other.py"]}
        defaults = dict(stages=3, clock=ManualClock(), nvml=nvml, window_s=0.3, poll_interval_s=0.01,
                        cmdline_of=lambda pid: titles.get(pid, []))
        source = NvmlProcessGpuSource(**{**defaults, **kwargs})
        made.append(source)
        return source

    yield make
    for source in made:
        source.close()


async def test_source_maps_processes_to_stages_and_sees_the_gpu_free(make_source):
    nvml = FakeNvml()
    nvml.procs = [(10, 2048), (11, 2048), (12, 2048), (50, 512)]
    nvml.running = {10: 25.0, 11: 25.0, 12: 25.0, 50: 5.0}
    source = make_source(nvml)
    healthy = await _read_until(source, lambda s: s.gpus and s.gpus[2].util_pct > 0, "a healthy pipeline")
    assert healthy.error is None
    assert all(g.util_pct > 50 for g in healthy.gpus)
    # Deadlocked: stages 0 and 1 spin, time-sliced; stage 2 ran nothing.
    nvml.running = {10: 50.0, 11: 50.0}
    stalled = await _read_until(source, lambda s: s.gpus and s.gpus[2].util_pct == 0.0, "the tail stall")
    assert [g.util_pct for g in stalled.gpus] == [100.0, 100.0, 0.0]
    assert stalled.gpus[2].mem_used_mib == 2048.0 and stalled.gpus[2].pids == (12,)
    # The other program (pid 50) is never counted in any stage.
    assert all(50 not in g.pids for g in stalled.gpus)
    nvml.procs, nvml.running = [(50, 512)], {}  # the pipeline was killed
    after = await _read_until(source, lambda s: all(not g.pids for g in s.gpus), "the GPU free")
    assert [g.mem_used_mib for g in after.gpus] == [0.0, 0.0, 0.0]
    source.close()
    source.close()  # idempotent


async def test_source_turns_failures_and_deadlines_into_failed_readings(make_source):
    broken = make_source(FakeNvml(fail_with=15), stages=2)
    sample = await _read_until(broken, lambda s: s.error is not None, "an error")
    assert sample.gpus == () and "NVML error 15" in sample.error
    wedged = make_source(FakeNvml(hang_s=0.5), stages=2, deadline_s=0.05)
    sample = await wedged.read()
    assert sample.gpus == () and "did not answer" in sample.error
    await asyncio.sleep(0.6)  # let the stuck thread finish before the loop closes


async def test_stages_are_counted_when_not_configured(make_source):
    nvml = FakeNvml()
    nvml.procs = [(10, 100), (11, 100)]
    nvml.running = {10: 30.0, 11: 30.0}
    source = make_source(nvml, stages=None)
    sample = await _read_until(source, lambda s: len(s.gpus) == 2 and s.gpus[1].util_pct > 0, "two stages")
    assert [g.index for g in sample.gpus] == [0, 1]
    nvml.procs = [(10, 100)]  # stage 1 died: its virtual GPU stays, free
    sample = await _read_until(source, lambda s: not s.gpus[1].pids, "stage 1 gone")
    assert len(sample.gpus) == 2


async def test_open_without_nvml_is_gpu_unavailable():
    from soak.errors import GpuUnavailable

    class NoDriver(FakeNvml):
        def nvmlInit(self):
            raise _NVMLError(12)  # NVML_ERROR_LIBRARY_NOT_FOUND

    source = NvmlProcessGpuSource(stages=2, clock=ManualClock(), nvml=NoDriver())
    with pytest.raises(GpuUnavailable, match="NVML unavailable"):
        await source.open()
    await source.aclose()


def test_probes_config_selects_the_per_process_source():
    from soak.probes.build import build_gpu_source
    from soak.probes.config import ProbesConfig

    config = ProbesConfig.model_validate({"gpu": {"kind": "nvml", "per_process": True, "stages": 4}})
    source = build_gpu_source(config, base_url="http://127.0.0.1:1", session=None, clock=ManualClock(),
                              is_simulator=True, nvml_provider=FakeNvml())
    assert isinstance(source, NvmlProcessGpuSource)
    plain = build_gpu_source(ProbesConfig.model_validate({"gpu": {"kind": "nvml"}}), base_url="http://127.0.0.1:1",
                             session=None, clock=ManualClock(), is_simulator=True, nvml_provider=FakeNvml())
    assert not isinstance(plain, NvmlProcessGpuSource)


@pytest.mark.parametrize("window, tail_reads_dark", [(None, True), ("2s", False), ("0.5s", True)])
async def test_the_configured_window_is_how_long_a_stage_s_last_kernel_keeps_it_reading_working(
        window, tail_reads_dark):
    # The tail's latest NVML sample is 1.5 s old, upstream's fresh: the default 1-s window
    # already reads the tail dark (what bounds detection on a shared GPU), a 2-s window
    # still reads it as having run.
    from soak.probes.build import build_gpu_source
    from soak.probes.config import ProbesConfig

    nvml = FakeNvml()
    nvml.procs = [(10, 2048), (11, 2048), (12, 2048)]
    nvml.running = {10: 50.0, 11: 50.0, 12: 30.0}
    nvml.ran_ago_s = {12: 1.5}
    gpu = {"kind": "nvml", "per_process": True, "stages": 3, **({"window": window} if window else {})}
    source = build_gpu_source(ProbesConfig.model_validate({"gpu": gpu}), base_url="http://127.0.0.1:1",
                              session=None, clock=ManualClock(), is_simulator=False, nvml_provider=nvml)
    titles = {10: ["VLLM::Worker_PP0"], 11: ["VLLM::Worker_PP1"], 12: ["VLLM::Worker_PP2"]}
    source._cmdline_of = lambda pid: titles.get(pid, [])
    try:
        sample = await _read_until(source, lambda s: s.gpus and s.gpus[0].util_pct > 0, "upstream running")
        assert sample.gpus[1].util_pct > 0
        assert (sample.gpus[2].util_pct == 0.0) is tail_reads_dark
    finally:
        source.close()


def test_a_window_shorter_than_the_driver_s_samples_is_refused():
    from pydantic import ValidationError

    from soak.probes.config import ProbesConfig

    with pytest.raises(ValidationError, match="window"):
        ProbesConfig.model_validate({"gpu": {"kind": "nvml", "per_process": True, "window": "0.1s"}})
