"""A server without GPUs (stage CPU) has nothing to release: the incident line says
so instead of "GPU release not confirmed", which reads like a GPU leak on a box
that has no GPU."""

from __future__ import annotations

import asyncio

from soak.clock import ManualClock
from soak.records import IncidentKind
from soak.respond.gpu import wait_gpus_free
from soak.respond.responder import _summary
from soak.samples import GpuSample, GpuSource


def _release(source: GpuSource):
    async def read() -> GpuSample:
        return GpuSample(ts=0.0, source=source, gpus=(), error="the target shows no worker")

    return asyncio.run(wait_gpus_free(read, target_pids=(101, 102), pids_gone=lambda: True, clock=ManualClock(),
                                      timeout_s=1.0, poll_s=0.1, tolerance_mib=0.0, source_hint=source))


def test_a_stage_cpu_incident_says_there_were_no_gpus() -> None:
    release = _release(GpuSource.STAGE_CPU)
    assert release.released is None and release.no_gpus
    line = _summary(IncidentKind.HANG, "stage_cpu_stall", "detected 6.0 s after the onset (point estimate)", (), release, None, None)
    assert "no GPUs (stage CPU)" in line and "not confirmed" not in line


def test_a_gpu_source_that_cannot_tell_still_says_not_confirmed() -> None:
    release = _release(GpuSource.SIM)
    assert release.released is None and not release.no_gpus
    assert "GPU release not confirmed" in _summary(IncidentKind.HANG, "pp_tail_stall", "detected 4.0 s after the onset", (), release,
                                                   None, None)
