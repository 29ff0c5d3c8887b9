"""After the kill: a bounded wait until the GPUs hold no target process and
their memory is back (NVIDIA resiliency-ext waits up to 50 s, tolerance 512 MB).

"Back" is measured against a per-GPU baseline: the memory the GPU used while
it listed no process at all (an idle H200 reads about 615 MiB through NVML,
more than resiliency-ext's tolerance, so zero is not the baseline). Baselines
are learned from GPU readings the responder sees before the incident, or set in
the config. A GPU without a known baseline counts as back once no target
process is listed and two readings in a row agree within the tolerance.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Awaitable, Callable, Collection, Iterable, Mapping

from soak.clock import Clock
from soak.samples import GpuSample, GpuSource, Sample


@dataclass(frozen=True)
class GpuRelease:
    # True: the GPU source showed the server's GPUs free. False: still held when
    # the wait ran out. None: the source cannot tell (no source, no reading, the
    # server's GPUs unknown): never taken as free.
    released: bool | None
    free_at: float | None      # the run clock's time the GPUs were seen free
    free_after_s: float | None  # from the start of the wait (the SIGKILL)
    last: GpuSample | None
    notes: tuple[str, ...]
    # The source reads processes, not GPUs (stage CPU): there was nothing to release.
    no_gpus: bool = False


def learn_baselines(samples: Iterable[Sample], into: dict[int, float] | None = None) -> dict[int, float]:
    """Per GPU, the least memory used in a reading that listed no process."""
    out = into if into is not None else {}
    for sample in samples:
        if not isinstance(sample, GpuSample) or sample.error:
            continue
        for gpu in sample.gpus:
            if not gpu.pids and gpu.mem_used_mib is not None:
                out[gpu.index] = min(out.get(gpu.index, gpu.mem_used_mib), gpu.mem_used_mib)
    return out


def still_held(
    sample: GpuSample,
    target_pids: Collection[int],
    *,
    tolerance_mib: float,
    baselines: Mapping[int, float],
    default_baseline: float | None = None,
    previous: GpuSample | None = None,
    scope: Collection[int] | None = None,
) -> list[str]:
    """Why the GPUs are not free yet: one reason per GPU (of ``scope``, default
    all); empty when free."""
    reasons = []
    before = {g.index: g for g in previous.gpus} if previous is not None else {}
    for gpu in sample.gpus:
        if scope is not None and gpu.index not in scope:
            continue
        held = sorted(set(gpu.pids) & set(target_pids))
        if held:
            reasons.append(f"gpu {gpu.index} lists target pids {held}")
            continue
        if gpu.mem_used_mib is None:
            continue
        baseline = baselines.get(gpu.index, default_baseline)
        if baseline is not None:
            if gpu.mem_used_mib > baseline + tolerance_mib:
                reasons.append(
                    f"gpu {gpu.index} uses {gpu.mem_used_mib:.0f} MiB"
                    f" > {baseline + tolerance_mib:.0f} MiB allowed (baseline {baseline:.0f})"
                )
            continue
        prior = before.get(gpu.index)
        if prior is None or prior.mem_used_mib is None or set(prior.pids) & set(target_pids):
            reasons.append(f"gpu {gpu.index}: no baseline, memory ({gpu.mem_used_mib:.0f} MiB) not yet seen settled")
        elif abs(gpu.mem_used_mib - prior.mem_used_mib) > tolerance_mib:
            reasons.append(
                f"gpu {gpu.index}: no baseline, memory still moving"
                f" ({prior.mem_used_mib:.0f} -> {gpu.mem_used_mib:.0f} MiB)"
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
    baselines: Mapping[int, float] | None = None,
    default_baseline: float | None = None,
    read_timeout_s: float = 3.0,
    source_hint: GpuSource | None = None,
    before: GpuSample | None = None,
) -> GpuRelease:
    """Poll the GPU source until the hung server's GPUs list no target PID and
    their memory is back.

    The server's GPUs are those that listed a target PID in ``before`` (the
    reading taken before the kill); with a memory baseline for every GPU, all
    GPUs are checked. Released is only ever True on the source's own word: when
    it cannot answer (the simulator's GPUs die with the simulated server) or
    never showed which GPUs were the server's, it is None with the reason, never
    "every PID I killed is gone".
    """
    start_mono = clock.monotonic()
    if read is None:
        return GpuRelease(None, None, None, None, ("no GPU source: release not confirmed",))
    baselines = dict(baselines or {})
    target = set(target_pids)
    server_gpus = {g.index for g in before.gpus if set(g.pids) & target} if before is not None else set()
    last: GpuSample | None = None
    last_reasons: list[str] = []
    last_error: str | None = None
    while True:
        sample, error = await read_gpus(read, min(read_timeout_s, max(timeout_s, 0.1)))
        now_mono = clock.monotonic()
        if error is None and sample is not None:
            all_known = bool(sample.gpus) and all(
                g.index in baselines or default_baseline is not None for g in sample.gpus
            )
            scope: set[int] | None = None if all_known else server_gpus
            if not all_known and not server_gpus:
                note = (
                    "the GPU source listed no process of the target before the kill and no memory baseline "
                    "is known, so which GPUs were the server's cannot be told: release not confirmed"
                )
                return GpuRelease(None, None, None, sample, (note,))
            last_reasons = still_held(
                sample, target, tolerance_mib=tolerance_mib, baselines=baselines,
                default_baseline=default_baseline, previous=last, scope=scope,
            )
            last = sample
            if not last_reasons:
                return GpuRelease(True, clock.now(), now_mono - start_mono, sample, ())
        else:
            last_error = error
            source = sample.source if sample is not None else source_hint
            if source == GpuSource.STAGE_CPU and pids_gone():
                # Stage CPU reads processes, not GPUs: with them gone there is nothing to wait for.
                return GpuRelease(
                    None, None, None, last,
                    (f"no GPUs: the stage CPU source read the target's processes ({error}); "
                     "every target PID is gone",),
                    no_gpus=True,
                )
            if source == GpuSource.SIM and pids_gone():
                # The simulated GPUs lived in the simulated server: no one is left to ask.
                return GpuRelease(
                    None, None, None, last,
                    (f"the simulator's GPU source went with the server ({error}): release not confirmed "
                     "by the GPU source (every target PID is gone)",),
                )
        if now_mono - start_mono >= timeout_s:
            break
        await asyncio.sleep(poll_s)
    notes = [f"GPUs not free after {timeout_s:g}s"]
    notes += last_reasons
    if last_error:
        notes.append(last_error)
    if last is None:
        return GpuRelease(None, None, None, None, tuple(notes + ["the GPU source never answered after the kill"]))
    return GpuRelease(False, None, None, last, tuple(notes))
