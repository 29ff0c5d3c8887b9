"""Stage activity without GPUs: each pipeline stage's CPU use, from /proc.

vLLM's CPU build has no GPU to read, so the stage rules (``pp_tail_stall``) had
nothing to look at. Every worker carries a title (``VLLM::Worker_PP<r>...``,
parsed by soak.metric_names.parse_process_title), and the kernel counts each
process's CPU time (utime + stime). The difference between two readings over
the time between them is how busy the worker was: a rank spinning in a
collective reads 100%, a rank asleep in a blocking wait or SIGSTOPped reads 0%.

Readings are ``GpuSample(source=GpuSource.STAGE_CPU)`` with one ``GpuReading``
per stage (at the stage's first index in the detector's ``Topology``), so the detector's
per-stage rules and the responder's "processes gone" check read it as they read
a GPU source; everything a person sees names it "stage CPU".

Choices:
- busy = CPU time (utime + stime) plus the time its threads waited on a
  run queue (``/proc/PID/task/*/schedstat``): on a loaded box a spinning rank gets a
  share of a core and waits for the rest; with CPU time alone it read 30-55%
  beside a sleeper's 0% on a 2-core box shared with other work, and a healthy
  rank's turn read no different. Where there is no schedstat, CPU time alone.
- percent of ONE core, capped at 100: a spinning rank busies at least one core,
  which is what the stall pattern asks; a CPU worker's compute threads (OpenMP)
  may use several cores, and "more than one core" is no busier for the rules.
- several processes of one stage: the MAX, not the sum: the stage is busy when
  any of its workers is (one TP rank spinning is a spinning stage), and the tail
  reads idle only when every one of its workers is; a sum would let two
  half-busy ranks pass for one spinning one.
- a PID whose start time changed is a new process: no delta is taken across it
  (its CPU time counts from its own start), nor for a process seen only once.

The pure part is ``process_utilization`` and ``stage_readings``; the edge
(``StageCpuSource``) reads /proc through soak.proc and never raises out of
``read()``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from soak.metric_names import ProcessRole, parse_process_title
from soak.proc.cpu import ProcCpu, read_cpu
from soak.records import Topology
from soak.samples import GpuReading, GpuSample, GpuSource


@dataclass(frozen=True)
class StageCpu:
    """A stage's activity over one interval: percent of one core (max over its
    workers), its workers' PIDs and their states (``T``: stopped)."""

    stage: int
    util_pct: float
    pids: tuple[int, ...]
    states: tuple[str, ...]


def worker_stage(cmdline: Sequence[str]) -> int | None:
    """The pipeline stage of a vLLM worker from its title, None for any other process."""
    title = parse_process_title(tuple(cmdline)) if cmdline else None
    if title is None or title.role is not ProcessRole.WORKER:
        return None
    return title.pipeline_stage


def process_utilization(before: ProcCpu | None, after: ProcCpu, *, elapsed_s: float) -> float | None:
    """Percent of one core ``after``'s process used or waited for since ``before`` (0..100), or None
    when there is no delta to take: no earlier reading, a reused PID (another start
    time), or no time between the readings."""
    if before is None or before.pid != after.pid or before.started != after.started or elapsed_s <= 0:
        return None
    used = max(after.cpu_s - before.cpu_s, 0.0)  # counters never go back; a torn read must not read negative
    if before.wait_s is not None and after.wait_s is not None:
        used += max(after.wait_s - before.wait_s, 0.0)
    return min(used / elapsed_s * 100.0, 100.0)


def stage_readings(
    before: Mapping[int, ProcCpu],
    after: Mapping[int, ProcCpu],
    *,
    elapsed_s: float,
    stage_of: Mapping[int, int],
) -> tuple[StageCpu, ...]:
    """Each stage that has a worker with a delta: its max utilization, first stage first.
    A stage with no measurable worker is left out (missing, never 0%)."""
    per_stage: dict[int, list[tuple[int, float, str]]] = {}
    for pid, now in after.items():
        stage = stage_of.get(pid)
        if stage is None:
            continue
        util = process_utilization(before.get(pid), now, elapsed_s=elapsed_s)
        if util is None:
            continue
        per_stage.setdefault(stage, []).append((pid, util, now.state))
    return tuple(
        StageCpu(stage=stage, util_pct=round(max(u for _, u, _ in rows), 1),
                 pids=tuple(sorted(p for p, _, _ in rows)), states=tuple(s for _, _, s in sorted(rows)))
        for stage, rows in sorted(per_stage.items())
    )


def to_gpu_readings(stages: Sequence[StageCpu], topology: Topology | None) -> tuple[GpuReading, ...]:
    """One reading per stage, at the first index the detector's topology gives the
    stage (stage ``r`` is index ``r`` without one): the detector reads the indices of
    a stage that are there, so one figure per stage is the stage's figure."""
    return tuple(
        GpuReading(index=topology.stages[s.stage][0] if topology is not None and s.stage < len(topology.stages)
                   else s.stage, util_pct=s.util_pct, pids=s.pids, uuid=f"stage-cpu/{s.stage}")
        for s in stages
    )


class StageCpuSource:
    """``async read() -> GpuSample``: stage activity from the CPU time of the
    target's ``VLLM::Worker`` processes. ``root_pid`` is asked at each read (a
    restart replaces the root); ``descendants(root) -> pids`` walks the tree
    (soak.proc's shared reader in a run)."""

    def __init__(self, *, clock, root_pid: Callable[[], int | None],
                 descendants: Callable[[int], frozenset[int]],
                 topology: Topology | None = None,
                 read: Callable[[Sequence[int]], Mapping[int, ProcCpu]] = read_cpu,
                 deadline_s: float = 2.0, why: str = "", rewalk_s: float = 5.0) -> None:
        self._clock = clock
        self._root_pid = root_pid
        self._descendants = descendants
        self._topology = topology
        self._read = read
        self._deadline_s = deadline_s
        self._before: tuple[float, Mapping[int, ProcCpu]] | None = None
        self._stage_of: dict[int, int] = {}
        self._why = why  # how it came to be chosen (auto without NVML), said in its failed readings
        # The tree walk (every process on the box) is what a loaded box makes slow:
        # 20-540 ms against 2-9 ms for reading two workers (load 13 on 2 cores), and
        # with a walk per reading the source missed its deadline 57 times in ten
        # minutes of a real soak, leaving gaps of up to 15 s. Known workers are read
        # alone; the tree is walked again for a new root, a stage without a worker
        # (start-up, a worker gone) or every ``rewalk_s``.
        self._rewalk_s = rewalk_s
        self._walked: tuple[int, float] | None = None  # (root, monotonic time) of the last walk
        # One read at a time: a read past its deadline still runs in its thread, and
        # reads queued behind it would only slow it further.
        self._pending: asyncio.Future | None = None

    def workers(self) -> dict[int, int]:
        """The target's workers now: PID -> stage (a bare ``Worker`` is not placed yet)."""
        root = self._root_pid()
        if root is None:
            return {}
        pids = set(self._descendants(root)) | {root}
        cpu = self._read(sorted(pids))
        return {pid: stage for pid, p in cpu.items() if (stage := worker_stage(p.cmdline)) is not None}

    def _must_walk(self, root: int, now: float) -> bool:
        if self._walked is None or self._walked[0] != root or now - self._walked[1] >= self._rewalk_s:
            return True
        placed = set(self._stage_of.values())
        wanted = len(self._topology.stages) if self._topology is not None else 1
        return len(placed) < wanted or not placed

    def read_blocking(self, now: float | None = None) -> tuple[StageCpu, ...]:
        """One reading, the interval since the previous one's."""
        at, after, stages = self._measure(now)
        self._before = (at, after)
        return stages

    def _measure(self, now: float | None = None) -> tuple[float, Mapping[int, ProcCpu], tuple[StageCpu, ...]]:
        """/proc now, and the stages' activity since the last reading delivered, which
        this one becomes only once it is delivered: a read past its deadline is dropped,
        and the next one spans its interval too (a stage asleep in it reads asleep
        across the gap, not for the half second after a late read finished)."""
        root = self._root_pid()
        if root is None:
            raise RuntimeError("the target has no process to read")
        if self._must_walk(root, self._clock.monotonic()):
            pids = set(self._descendants(root)) | {root}
            self._walked = (root, self._clock.monotonic())
        else:
            pids = set(self._stage_of)
        # The interval ends when /proc is read, not when the read was asked for (a
        # starved thread may wait for the interpreter first).
        now = self._clock.monotonic() if now is None else now
        after = self._read(sorted(pids))
        for pid, p in after.items():
            stage = worker_stage(p.cmdline)
            if stage is not None:
                self._stage_of[pid] = stage
            elif pid in self._stage_of and p.cmdline:
                del self._stage_of[pid]  # a reused PID that is no worker now
        self._stage_of = {pid: s for pid, s in self._stage_of.items() if pid in after}
        before = self._before
        if before is None:
            return now, after, ()
        return now, after, stage_readings(before[1], after, elapsed_s=now - before[0], stage_of=self._stage_of)

    async def open(self) -> None:
        """GpuUnavailable when the target shows no ``VLLM::Worker`` process: nothing to read.
        Before a launched or attached server has a root process its titles cannot be
        checked: the source opens, and each reading says why while no worker shows."""
        from soak.errors import GpuUnavailable

        if self._root_pid() is None:
            return
        try:
            found = await asyncio.wait_for(asyncio.to_thread(self.workers), self._deadline_s + 3.0)
        except Exception as exc:
            raise GpuUnavailable(f"stage CPU: cannot read the target's processes: {exc}") from exc
        if not found:
            raise GpuUnavailable("stage CPU: the target has no VLLM::Worker process")

    async def read(self) -> GpuSample:
        ts = self._clock.now()
        if self._pending is not None and not self._pending.done():
            return GpuSample(ts=ts, source=GpuSource.STAGE_CPU, gpus=(),
                             error="stage CPU: the previous /proc read has not finished")
        task = asyncio.ensure_future(asyncio.to_thread(self._measure))
        # a late read's failure is its own reading's, already reported: not an unretrieved error
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self._pending = task
        try:
            at, after, stages = await asyncio.wait_for(asyncio.shield(task), self._deadline_s)
            self._before = (at, after)
        except asyncio.TimeoutError:
            return GpuSample(ts=ts, source=GpuSource.STAGE_CPU, gpus=(),
                             error=f"stage CPU: /proc did not answer in {self._deadline_s:g}s")
        except Exception as exc:
            return GpuSample(ts=ts, source=GpuSource.STAGE_CPU, gpus=(),
                             error=f"stage CPU: {type(exc).__name__}: {exc}" + (f" ({self._why})" if self._why else ""))
        if not stages:
            why = "no worker measured yet" if self._stage_of else "the target shows no VLLM::Worker process"
            return GpuSample(ts=ts, source=GpuSource.STAGE_CPU, gpus=(),
                             error=f"stage CPU: {why}" + (f" ({self._why})" if self._why else ""))
        return GpuSample(ts=ts, source=GpuSource.STAGE_CPU, gpus=to_gpu_readings(stages, self._topology))

    async def aclose(self) -> None:
        self._before = None
        self._pending = None


__all__ = ["StageCpu", "StageCpuSource", "process_utilization", "stage_readings", "to_gpu_readings", "worker_stage"]
