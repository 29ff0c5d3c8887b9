"""The per-process NVML source: stage mapping and virtual per-stage readings.

NVML itself cannot run here, so these use a stand-in module with pynvml's
call names, error class and record fields; the real module is exercised by
tests/gpu/test_cuda_signature.py on a GPU machine.
"""

from __future__ import annotations

import asyncio
import types

import pytest

from soak.clock import ManualClock
from soak.gpu.process_source import NvmlProcessGpuSource, ProcessUtilSample, stage_of, stage_readings


@pytest.mark.parametrize(
    "cmdline, stage",
    [
        (["VLLM::Worker_PP3"], 3),
        (["VLLM::Worker_PP12_TP1"], 12),
        (["MYPREFIX::Worker_PP0"], 0),
        (["/usr/bin/python3", "-m", "soak.gpu.cuda_worker", "--rank", "2", "--pp-size", "4"], 2),
        (["python", "-m", "soak.gpu.pp_nccl", "--rank", "1"], 1),
        (["python", "train.py", "--rank", "1"], None),  # somebody else's program: not a stage
        (["VLLM::EngineCore"], None),
        ([], None),
    ],
)
def test_stage_of_reads_titles_and_own_programs(cmdline, stage):
    assert stage_of(cmdline) == stage


def test_stage_readings_show_the_tail_stall_on_a_shared_gpu():
    # Two stages spin (NVML reports them), the last holds memory but runs nothing,
    # so NVML leaves it out of the utilization entries.
    readings = stage_readings(
        stages=3,
        pid_stage={100: 0, 101: 1, 102: 2, 999: 0},
        util_samples=[
            ProcessUtilSample(100, 1, 96.0),
            ProcessUtilSample(100, 2, 100.0),
            ProcessUtilSample(101, 2, 99.0),
        ],
        mem_used_mib={100: 2048.0, 101: 2048.0, 102: 2048.0},
        mem_total_mib=143771.0,
        uuid="GPU-x",
    )
    assert [r.index for r in readings] == [0, 1, 2]
    assert [r.util_pct for r in readings] == [98.0, 99.0, 0.0]
    assert readings[2].pids == (102,) and readings[2].mem_used_mib == 2048.0
    # 999 maps to stage 0 but is not on the GPU: not counted.
    assert readings[0].pids == (100,)
    assert readings[1].uuid == "GPU-x/stage1"


def test_a_stage_with_no_process_reads_free():
    readings = stage_readings(stages=2, pid_stage={}, util_samples=[], mem_used_mib={}, mem_total_mib=None)
    assert [(r.util_pct, r.pids, r.mem_used_mib) for r in readings] == [(0.0, (), 0.0), (0.0, (), 0.0)]


class _NVMLError(Exception):
    def __init__(self, value):
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_nvml(procs, util_entries, *, fail_with=None, hang_s=0.0):
    """A stand-in with pynvml's names. ``util_entries`` is a list of lists, one per call."""
    calls = iter(util_entries)

    def get_util(handle, last_ts):
        if hang_s:
            import time

            time.sleep(hang_s)
        if fail_with is not None:
            raise _NVMLError(fail_with)
        entries = next(calls, [])
        if not entries:
            raise _NVMLError(6)  # NVML_ERROR_NOT_FOUND: no process ran since last_ts
        return [types.SimpleNamespace(pid=p, timeStamp=t, smUtil=u) for p, t, u in entries if t > last_ts]

    return types.SimpleNamespace(
        NVMLError=_NVMLError,
        NVML_ERROR_NOT_FOUND=6,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: ("h", i),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=143771 * 2**20, used=0),
        nvmlDeviceGetUUID=lambda h: b"GPU-abc",
        nvmlDeviceGetComputeRunningProcesses=lambda h: [
            types.SimpleNamespace(pid=p, usedGpuMemory=m * 2**20) for p, m in procs()
        ],
        nvmlDeviceGetProcessUtilization=get_util,
    )


async def test_source_maps_processes_to_stages_and_sees_the_gpu_free():
    titles = {10: ["VLLM::Worker_PP0"], 11: ["VLLM::Worker_PP1"], 12: ["VLLM::Worker_PP2"], 50: ["python", "other.py"]}
    alive = [(10, 2048), (11, 2048), (12, 2048), (50, 512)]
    nvml = fake_nvml(
        lambda: list(alive),
        [
            [(10, 1000, 70), (11, 1000, 72), (12, 1000, 69), (50, 1000, 30)],  # healthy
            [(10, 2000, 100), (11, 2000, 100)],  # deadlocked: stage 2 ran nothing
            [],  # nothing new since the last reading
        ],
    )
    source = NvmlProcessGpuSource(stages=3, clock=ManualClock(), nvml=nvml, cmdline_of=lambda pid: titles[pid])
    healthy = await source.read()
    assert healthy.error is None
    assert [g.util_pct for g in healthy.gpus] == [70.0, 72.0, 69.0]
    stalled = await source.read()
    assert [g.util_pct for g in stalled.gpus] == [100.0, 100.0, 0.0]
    assert stalled.gpus[2].mem_used_mib == 2048.0
    # The other program (pid 50) is never counted in any stage.
    assert all(50 not in g.pids for g in stalled.gpus)
    alive[:] = [(50, 512)]  # the pipeline was killed
    after = await source.read()
    assert [g.pids for g in after.gpus] == [(), (), ()]
    assert [g.util_pct for g in after.gpus] == [0.0, 0.0, 0.0]
    source.close()
    source.close()  # idempotent


async def test_source_turns_failures_and_deadlines_into_failed_readings():
    broken = NvmlProcessGpuSource(
        stages=2, clock=ManualClock(), nvml=fake_nvml(lambda: [], [], fail_with=15), cmdline_of=lambda pid: []
    )
    sample = await broken.read()
    assert sample.gpus == () and "NVML error 15" in sample.error
    wedged = NvmlProcessGpuSource(
        stages=2,
        clock=ManualClock(),
        deadline_s=0.05,
        nvml=fake_nvml(lambda: [], [], hang_s=0.5),
        cmdline_of=lambda pid: [],
    )
    sample = await wedged.read()
    assert sample.gpus == () and "did not answer" in sample.error
    await asyncio.sleep(0.5)  # let the stuck thread finish before the loop closes
