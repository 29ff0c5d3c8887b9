"""After the kill: a bounded wait until the GPUs hold no target process and
their memory is back (NVIDIA resiliency-ext waits up to 50 s, tolerance 512 MB)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Collection

from soak.clock import Clock
from soak.samples import GpuSample, GpuSource


@dataclass(frozen=True)
class GpuRelease:
    released: bool
    free_at: float | None      # the run clock's time the GPUs were seen free
    free_after_s: float | None  # from the start of the wait (the SIGKILL)
    last: GpuSample | None
    notes: tuple[str, ...]


def still_held(
    sample: GpuSample,
    target_pids: Collection[int],
    *,
    tolerance_mib: float,
    baseline_mib: float = 0.0,
) -> list[str]:
    """Why the GPUs are not free yet: one reason per GPU; empty when free."""
    reasons = []
    for gpu in sample.gpus:
        held = sorted(set(gpu.pids) & set(target_pids))
        if held:
            reasons.append(f"gpu {gpu.index} lists target pids {held}")
        elif gpu.mem_used_mib is not None and gpu.mem_used_mib > baseline_mib + tolerance_mib:
            reasons.append(
                f"gpu {gpu.index} uses {gpu.mem_used_mib:.0f} MiB"
                f" > {baseline_mib + tolerance_mib:.0f} MiB allowed"
            )
    return reasons


async def read_gpus(read: Callable[[], Awaitable[GpuSample]], timeout_s: float) -> tuple[GpuSample | None, str | None]:
    """One reading with a deadline: (sample, None) or (None, why it failed)."""
    try:
        sample = await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        return None, f"GPU read timed out after {timeout_s:g}s"
    except Exception as exc:  # a source that raises instead of returning error samples
        return None, f"GPU read failed: {type(exc).__name__}: {exc}"
    if sample.error:
        return sample, f"GPU read failed: {sample.error}"
    return sample, None


async def wait_gpus_free(
    read: Callable[[], Awaitable[GpuSample]] | None,
    *,
    target_pids: Collection[int],
    pids_gone: Callable[[], bool],
    clock: Clock,
    timeout_s: float,
    poll_s: float,
    tolerance_mib: float,
    baseline_mib: float = 0.0,
    read_timeout_s: float = 3.0,
    source_hint: Any = None,
) -> GpuRelease:
    """Poll the GPU source until no GPU lists a target PID and memory is back.

    The simulator's GPUs live in the simulated server, so once it is killed its
    source cannot answer; for ``source_hint == GpuSource.SIM`` a failing read
    after the kill counts as free once every target PID is gone (noted).
    """
    start_mono = clock.monotonic()
    if read is None:
        return GpuRelease(False, None, None, None, ("no GPU source: release not confirmed",))
    last: GpuSample | None = None
    last_reasons: list[str] = []
    last_error: str | None = None
    while True:
        sample, error = await read_gpus(read, min(read_timeout_s, max(timeout_s, 0.1)))
        now_mono = clock.monotonic()
        if error is None and sample is not None:
            last = sample
            last_reasons = still_held(sample, target_pids, tolerance_mib=tolerance_mib, baseline_mib=baseline_mib)
            if not last_reasons:
                return GpuRelease(True, clock.now(), now_mono - start_mono, sample, ())
        else:
            last_error = error
            source = sample.source if sample is not None else source_hint
            if source == GpuSource.SIM and pids_gone():
                return GpuRelease(
                    True,
                    clock.now(),
                    now_mono - start_mono,
                    last,
                    (f"simulator GPU source gone with the server ({error}); released = every target pid gone",),
                )
        if now_mono - start_mono >= timeout_s:
            break
        await asyncio.sleep(poll_s)
    notes = [f"GPUs not free after {timeout_s:g}s"]
    notes += last_reasons
    if last_error:
        notes.append(last_error)
    return GpuRelease(False, None, None, last, tuple(notes))
