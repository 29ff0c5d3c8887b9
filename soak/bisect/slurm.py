"""The Slurm executor: each soak segment is a batch job (issue 38).

It plugs in at ``soak.bisect.executor.Executor``: ``conduct`` asks it to soak a
build and waits for whichever segment ends next, so segments of several builds
run at once as far as the cluster allows and the posterior picks the next build
as results arrive. Slurm is the scheduler; this module only talks to its
commands (``sbatch``, ``scontrol``, ``scancel``), each call bounded in time.

A segment's evidence is its run directory, read back as history reads it
(``segments.read_segment``): the job writes it on a path every node can read (a
shared filesystem; docs/running.md, "cluster"). Slurm's own end state decides
only one thing: a job the cluster ended (cancelled, time limit, node failure,
preemption) is a cut segment, its time at risk counted up to its last record,
never a hang and never lost. A job that ended before writing anything is a cut
segment of no exposure, recorded all the same.
"""

from __future__ import annotations

import asyncio
import math
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from soak.bisect.executor import Build, SegmentResult
from soak.errors import ConfigError, SchedulerError

# Slurm's job states that end a job (squeue/scontrol's JobState). COMPLETED and
# FAILED are the segment's own ending (soak run exits 1 on a hang: FAILED); the
# rest are the cluster's doing.
CLUSTER_ENDED = frozenset({"CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
                           "OUT_OF_MEMORY", "REVOKED", "SPECIAL_EXIT"})
ENDED = CLUSTER_ENDED | {"COMPLETED", "FAILED"}

# What soak run needs beyond the segment itself: start the server (a real PP8
# vLLM takes minutes), drain, write the report.
DEFAULT_OVERHEAD_S = 600.0


class SlurmError(SchedulerError):
    """A Slurm command failed or answered nothing we can read; the message quotes it (exit 3)."""


@dataclass(frozen=True, kw_only=True)
class SlurmOptions:
    slots: int = 2  # segments in flight at once; the cluster may run fewer
    cpus_per_segment: int = 1
    gpus_per_segment: int = 0  # --gres=gpu:N when > 0
    partition: str | None = None
    overhead_s: float = DEFAULT_OVERHEAD_S  # added to the segment for the time limit
    job_name: str = "soak-bisect"
    comment: str = ""  # identifies the bisect or night in squeue (--comment)
    poll_s: float = 1.0
    command_timeout_s: float = 30.0
    # A job Slurm keeps PENDING this long (no node will ever fit it: ReqNodeNotAvail,
    # a partition down) ends the bisect rather than wait forever.
    pending_limit_s: float = 6 * 3600.0
    # scontrol failing for this long (the controller down, not one blip) ends it too.
    unreachable_limit_s: float = 600.0


def time_limit(segment_s: float, overhead_s: float) -> str:
    """sbatch's --time for a segment: whole minutes (Slurm's granularity), rounded up."""
    return str(max(1, math.ceil((segment_s + overhead_s) / 60.0)))


def parse_job_state(scontrol_line: str) -> str | None:
    """JobState from one ``scontrol show job -o`` line; None when absent."""
    return _field(scontrol_line, "JobState")


def has_ended(state: str | None) -> bool:
    """A job Slurm no longer knows (None) or in an end state ("CANCELLED+" included)."""
    return state is None or state.split("+")[0] in ENDED


def parse_exit_code(scontrol_line: str) -> int | None:
    """The batch script's exit status from ``ExitCode=STATUS:SIGNAL``; None when absent."""
    value = _field(scontrol_line, "ExitCode")
    head = (value or "").partition(":")[0]
    return int(head) if head.isdigit() else None


def _field(line: str, name: str) -> str | None:
    for token in line.split():
        key, _, value = token.partition("=")
        if key == name:
            return value or None
    return None


UNKNOWN = "\0unknown"  # _show's answer when scontrol failed without saying the job is gone

SegmentCommand = Callable[[Build, float, Path], Sequence[str]]


@dataclass
class SlurmExecutor:
    """``segment_command(build, segment_s, run_dir)`` gives the argv of the
    segment's ``soak run`` (the local executor's, so both run the same thing);
    ``env`` is what the Slurm commands see (SLURM_CONF for a test cluster)."""

    segment_command: SegmentCommand
    options: SlurmOptions = field(default_factory=SlurmOptions)
    env: Mapping[str, str] | None = None
    # A build's own environment (soak bisect's env:): sbatch exports its caller's
    # environment to the job, so the values travel there, never into a file of ours.
    build_env: Callable[[Build], Mapping[str, str]] | None = None
    log_dir: Path | None = None  # where each job's stdout goes; default beside its run directory
    # The job ids in flight, one a line, rewritten on every change: a bisect killed
    # with SIGKILL cannot scancel, so its resume does (``cancel_leftover_jobs``)
    # before reading the segments back.
    jobs_file: Path | None = None
    on_event: Callable[[str], None] | None = None  # one line per submit/end/cancel, for the bisect's log
    _jobs: dict[str, tuple[Build, Path]] = field(default_factory=dict)
    _since: dict[str, float] = field(default_factory=dict)  # job -> when it was submitted (loop time)
    _unreachable_since: float | None = None
    _closed: bool = False

    @property
    def slots(self) -> int:
        return self.options.slots

    @property
    def in_flight(self) -> tuple[str, ...]:
        return tuple(self._jobs)

    async def submit(self, build: Build, *, segment_s: float, run_dir: Path) -> None:
        if self._closed:
            raise SlurmError("the executor is closed")
        argv = list(self.segment_command(build, segment_s, run_dir))
        opts = self.options
        sbatch = ["sbatch", "--parsable", f"--job-name={opts.job_name}",
                  f"--comment={opts.comment or run_dir.parent.name} build {build.label}",
                  f"--time={time_limit(segment_s, opts.overhead_s)}", f"--cpus-per-task={opts.cpus_per_segment}",
                  f"--output={self._log(run_dir)}", f"--chdir={Path.cwd()}",
                  # Slurm requeues a job after a node failure or preemption by default; this
                  # executor has then recorded it as cut, so a rerun would write the same run
                  # directory untracked. Never requeued: the posterior asks for another segment.
                  "--no-requeue"]
        if opts.gpus_per_segment > 0:
            sbatch.append(f"--gres=gpu:{opts.gpus_per_segment}")
        if opts.partition:
            sbatch.append(f"--partition={opts.partition}")
        sbatch += ["--wrap", "exec " + shlex.join(argv)]
        env = dict(self.env) if self.env is not None else None
        if self.build_env is not None:
            env = {**(env if env is not None else os.environ), **self.build_env(build)}
        out = await self._command(sbatch, env=env)
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch answered {out.strip()[:200]!r}, not a job id")
        self._jobs[job_id] = (build, run_dir)
        self._since[job_id] = asyncio.get_running_loop().time()
        self._remember()
        self._say(f"job {job_id}: build {build.label} -> {run_dir.name}")

    async def next_done(self) -> SegmentResult:
        if not self._jobs:
            raise SlurmError("no segment in flight")
        loop = asyncio.get_running_loop()
        while True:
            for job_id in list(self._jobs):
                line = await self._show(job_id)
                if line is UNKNOWN:
                    continue  # scontrol did not answer: the job is still ours, ask again
                state = parse_job_state(line) if line is not None else None
                if has_ended(state):
                    return self._finish(job_id, state, parse_exit_code(line or ""))
                if state == "PENDING" and loop.time() - self._since[job_id] > self.options.pending_limit_s:
                    raise SlurmError(f"job {job_id} has been pending for over {self.options.pending_limit_s:.0f} s "
                                     f"(squeue -j {job_id} says why); no node takes the segment")
            await asyncio.sleep(self.options.poll_s)

    async def aclose(self) -> None:
        """scancel every job still in flight (queued or running) and wait until
        Slurm no longer lists them: nothing is left queued. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if not self._jobs:
            return
        ids = list(self._jobs)
        try:
            await self._command(["scancel", *ids])
        except SlurmError as exc:
            self._say(f"scancel: {exc}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60.0
        while ids and loop.time() < deadline:
            ids = [j for j in ids if not await self._ended(j)]
            if ids:
                await asyncio.sleep(self.options.poll_s)
        gone = [j for j in self._jobs if j not in ids]
        self._say("cancelled " + " ".join(gone) + (f"; still listed: {' '.join(ids)}" if ids else ""))
        # What Slurm still lists stays written down, so a resume cancels it then.
        self._jobs = {j: v for j, v in self._jobs.items() if j in ids}
        self._remember()

    def _remember(self) -> None:
        if self.jobs_file is not None:
            from soak.fsio import write_atomic

            write_atomic(self.jobs_file, "".join(f"{job}\n" for job in self._jobs))

    def _finish(self, job_id: str, state: str | None, exit_code: int | None) -> SegmentResult:
        build, run_dir = self._jobs.pop(job_id)
        self._since.pop(job_id, None)
        self._remember()
        base = (state or "GONE").split("+")[0]
        # Past MinJobAge scontrol forgets a job: it ended, and its summary.json says whether by itself.
        cut = base in CLUSTER_ENDED or (state is None and not (run_dir / "summary.json").is_file())
        if not cut and (exit_code in (2, 3, 4) or not run_dir.is_dir()):
            # The job ran and ended by itself without a segment (a refused config, no
            # python on the node: exit 127): soaking it again would fail again.
            from soak.bisect.local import SegmentFailed

            why = {2: "its config was refused", 3: "the target never became ready or the node lacks something",
                   4: "the harness failed"}.get(exit_code, "it wrote no run directory")
            raise SegmentFailed(f"segment {run_dir.name} (build {build.label}, job {job_id}): soak run exited "
                                f"{exit_code}, {why} (see {self._log(run_dir)})", exit_code=3 if exit_code == 3 else 4)
        try:
            result = _read(run_dir, build.index)
        except ConfigError:
            result = SegmentResult(build=build.index, run_dir=run_dir, exposure_s=0.0, hangs=0, ended_by="nothing ran")
        if cut:
            result = SegmentResult(build=result.build, run_dir=run_dir, exposure_s=result.exposure_s,
                                   hangs=result.hangs, ended_by=f"cut: {base.lower()}")
        self._say(f"job {job_id}: {base}, {result.exposure_s:.0f} s at risk, {result.hangs} hang(s), {result.ended_by}")
        return result

    def _log(self, run_dir: Path) -> Path:
        return (self.log_dir / f"{run_dir.name}.log") if self.log_dir is not None else run_dir.with_name(
            run_dir.name + ".slurm.out")

    async def _ended(self, job_id: str) -> bool:
        line = await self._show(job_id)
        if line is UNKNOWN:
            return False
        return has_ended(parse_job_state(line) if line is not None else None)

    async def _show(self, job_id: str) -> str | None:
        """scontrol's line for the job; None when Slurm no longer knows it (it
        ended past MinJobAge); UNKNOWN when scontrol failed otherwise (the
        controller busy or down): the job may well be running."""
        loop = asyncio.get_running_loop()
        try:
            line = await self._command(["scontrol", "show", "job", "-o", job_id])
        except SlurmError as exc:
            if "Invalid job id" in str(exc):
                return None
            now = loop.time()
            self._unreachable_since = self._unreachable_since or now
            if now - self._unreachable_since > self.options.unreachable_limit_s:
                raise SlurmError(f"scontrol has failed for {now - self._unreachable_since:.0f} s: {exc}") from exc
            return UNKNOWN
        self._unreachable_since = None
        return line

    async def _command(self, argv: list[str], *, env: Mapping[str, str] | None = None) -> str:
        if env is None and self.env is not None:
            env = self.env
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=dict(env) if env is not None else None)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.options.command_timeout_s)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise SlurmError(f"{argv[0]} did not answer in {self.options.command_timeout_s:.0f} s") from None
        if proc.returncode != 0:
            raise SlurmError(f"{argv[0]} exited {proc.returncode}: {err.decode(errors='replace').strip()[:300]}")
        return out.decode(errors="replace")

    def _say(self, line: str) -> None:
        if self.on_event is not None:
            self.on_event(line)


def _read(run_dir: Path, build: int) -> SegmentResult:
    from soak.bisect.segments import read_segment

    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: no run directory")
    return read_segment(run_dir, build=build)


def bisect_job_name(out: Path) -> str:
    """The job name of one bisect's segments: its folder's digest, so squeue tells
    bisects apart and a resume's scancel can only ever match this bisect's jobs."""
    import hashlib

    return "soak-bisect-" + hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:10]


def cancel_leftover_jobs(jobs_file: Path, *, job_name: str, env: Mapping[str, str] | None = None,
                         wait_s: float = 60.0) -> list[str]:
    """Before a resume: scancel the jobs a killed bisect left in flight and wait
    until Slurm ends them, so their run directories are complete when read back.
    Only ids it wrote down AND only jobs of its own name: a reset cluster's reused
    ids or a copied folder cancel nothing of anyone else's (scancel's --name
    filter restricts the ids given). Returns the ids asked to cancel."""
    import subprocess
    import time

    try:
        ids = [line.strip() for line in jobs_file.read_text(encoding="utf-8").splitlines() if line.strip().isdigit()]
    except OSError:
        return []
    run_env = dict(env) if env is not None else None
    try:
        if ids:
            subprocess.run(["scancel", f"--name={job_name}", *ids], env=run_env, capture_output=True, timeout=30,
                           check=False)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                listed = subprocess.run(["squeue", "-h", f"--name={job_name}", "-j", ",".join(ids), "-o", "%i"],
                                        env=run_env, capture_output=True, text=True, timeout=30, check=False).stdout.split()
                if not listed:
                    break
                time.sleep(0.5)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"cancelling the killed bisect's jobs {' '.join(ids)}: {exc}") from exc
    jobs_file.unlink(missing_ok=True)
    return ids
