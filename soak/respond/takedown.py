"""Taking the target down: who is ours right now (the tree freshly walked, the
GPU processes claimed), SIGKILL to all of it, the /dev/shm segments only the
killed tree held removed, and a bounded wait until the GPUs are free
(``soak.respond.gpu``). Each step's trouble becomes a note, never an exception
that would stop the next step.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable, Sequence

from soak.clock import Clock
from soak.proc.facts import Member
from soak.proc.kill import KillResult, kill_processes
from soak.proc.read import running
from soak.proc.shm import ShmCleanup
from soak.proc.tree import merge
from soak.records import GpuSourceLike
from soak.respond.config import ResponseConfig
from soak.respond.gpu import GpuRelease, learn_baselines, read_gpus, wait_gpus_free
from soak.respond.target_tree import TargetTree
from soak.samples import GpuSample, Sample


@dataclass(frozen=True)
class Survey:
    """The target as found when the incident was decided."""

    members: tuple[Member, ...]
    gpu_sample: GpuSample | None
    gpu_error: str | None
    notes: tuple[str, ...]


@dataclass(frozen=True)
class Kill:
    """What the SIGKILL reached."""

    to_kill: tuple[Member, ...]  # every process it was aimed at
    killed_at: float
    result: KillResult | None    # None: the kill could not finish
    shm: ShmCleanup | None       # None: nothing killed, or the cleanup failed
    notes: tuple[str, ...]

    @property
    def killed(self) -> tuple[Member, ...]:
        return tuple(self.result.killed) if self.result is not None else ()


class Takedown:
    """The kill and the GPU wait of one run's incidents, on the tree ``targets`` records."""

    def __init__(self, config: ResponseConfig, *, targets: TargetTree, gpu_source: GpuSourceLike | None,
                 clock: Clock, recent_samples: Callable[[], Sequence[Sample]]) -> None:
        self._config = config
        self._targets = targets
        self._read_gpus = gpu_source.read if gpu_source is not None else None
        self._clock = clock
        self._recent_samples = recent_samples
        self._gpu_baselines: dict[int, float] = {}

    async def learn_gpu_baselines(self) -> None:
        """At start: a GPU that lists no process now shows its baseline memory."""
        if self._read_gpus is not None:
            sample, error = await read_gpus(self._read_gpus, self._config.evidence.gpu_timeout)
            if sample is not None and error is None:
                learn_baselines([sample], self._gpu_baselines)

    async def survey(self) -> Survey:
        """The tree now, and who on the GPUs is ours."""
        targets, notes = self._targets, []
        root_pid = targets.root_pid()
        if root_pid is not None and root_pid != targets.target.root_pid:
            notes.append(f"root pid {root_pid} found listening on the target's port")
        await asyncio.to_thread(lambda: targets.tree.snapshot(root_pid, fresh=True))
        if root_pid is not None and targets.tree.root is None:
            notes.append(f"root pid {root_pid} is protected or gone: not adopted")
        if targets.root_lost:
            notes.append(targets.root_lost)
        gpu_sample, gpu_error = (None, "no GPU source")
        if self._read_gpus is not None:
            gpu_sample, gpu_error = await read_gpus(self._read_gpus, self._config.evidence.gpu_timeout)
        foreign = await asyncio.to_thread(targets.claim_gpu_processes, gpu_sample)
        if foreign:
            notes.append(f"GPU processes outside the target, left alone: {sorted(foreign)}")
        if targets.marker is not None:
            await asyncio.to_thread(targets.adopt_marked)
        return Survey(targets.tree.known(), gpu_sample, gpu_error, tuple(notes))

    async def kill(self) -> Kill:
        """SIGKILL, from a snapshot taken just now merged with everything seen before."""
        targets, notes = self._targets, []
        now_pid = targets.root_pid()
        fresh = await asyncio.to_thread(lambda: targets.tree.snapshot(now_pid, fresh=True))
        to_kill = merge(targets.tree.known(), fresh)
        await asyncio.to_thread(targets.shm.record, [info.pid for info in to_kill])
        killed_at = self._clock.now()
        try:
            identity = targets.identity()
            result: KillResult | None = await asyncio.to_thread(kill_processes, to_kill, target=identity,
                                                                timeout_s=self._config.kill_timeout,
                                                                reader=targets.kill_reader(identity))
        except Exception as exc:  # the kill could not finish: record it, go on to the GPU wait
            notes.append(f"kill failed: {type(exc).__name__}: {exc}")
            result = None
        killed = result.killed if result is not None else ()
        if result is not None:
            notes.extend(result.notes)
        if not killed:
            notes.append("no live target process to kill")
        targets.tree.forget_dead()
        # The shared-memory segments only the killed tree held: its resource
        # tracker died with it, so nobody else will unlink them.
        shm = None
        if killed:
            try:
                shm = await asyncio.to_thread(targets.shm.cleanup, [info.pid for info in to_kill])
            except Exception as exc:  # never let /dev/shm housekeeping stop the response
                notes.append(f"/dev/shm cleanup failed: {type(exc).__name__}: {exc}")
            else:
                notes.extend(f"/dev/shm: kept {path}: {why}" for path, why in shm.kept.items())
        return Kill(tuple(to_kill), killed_at, result, shm, tuple(notes))

    async def wait_gpus_free(self, kill: Kill, survey: Survey) -> GpuRelease:
        """Bounded: until the GPUs list none of the killed processes and their memory is back."""
        cfg = self._config
        if cfg.gpu_memory_baseline_mib is None:
            learn_baselines(self._recent_samples() or (), self._gpu_baselines)
        gpu_sample = survey.gpu_sample
        return await wait_gpus_free(
            self._read_gpus,
            target_pids={info.pid for info in kill.to_kill},
            pids_gone=lambda: not any(running(i.pin) for i in kill.to_kill),
            clock=self._clock,
            timeout_s=cfg.gpu_release_timeout,
            poll_s=cfg.gpu_poll_interval,
            tolerance_mib=cfg.gpu_memory_tolerance_mib,
            baselines={} if cfg.gpu_memory_baseline_mib is not None else self._gpu_baselines,
            default_baseline=cfg.gpu_memory_baseline_mib,
            read_timeout_s=cfg.evidence.gpu_timeout,
            source_hint=gpu_sample.source if gpu_sample is not None else None,
            before=gpu_sample if survey.gpu_error is None else None,
        )
