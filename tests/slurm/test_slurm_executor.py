"""The Slurm executor against a real single-node Slurm: each segment is a batch
job running a real ``soak run`` against the simulator; what Slurm does to the
job (cancel, time limit) is recorded as a cut segment, never a hang or a loss."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from soak.bisect.executor import Build
from soak.bisect.slurm import SlurmExecutor, SlurmOptions, parse_job_state, time_limit

pytestmark = pytest.mark.xdist_group("slurm")

DEMO = Path(__file__).resolve().parents[2] / "workloads" / "demo.yaml"


def soak_run_argv(build: Build, segment_s: float, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "soak", "run", str(DEMO), "--out", str(run_dir), "--duration", f"{segment_s:g}s"]


def executor(cluster, **options) -> SlurmExecutor:
    lines: list[str] = []
    ex = SlurmExecutor(soak_run_argv, options=SlurmOptions(poll_s=0.5, **options), env=cluster.env,
                       on_event=lines.append)
    ex.lines = lines  # type: ignore[attr-defined]
    return ex


def jobs_listed(cluster) -> list[str]:
    return [line for line in cluster.run("squeue", "-h", "-o", "%i %j %T").stdout.splitlines() if line.strip()]


def test_time_limit_is_whole_minutes_rounded_up():
    assert time_limit(30, 0) == "1"
    assert time_limit(60, 0) == "1"
    assert time_limit(61, 0) == "2"
    assert time_limit(3960, 600) == "76"


def test_job_state_is_read_from_scontrol_one_line():
    line = "JobId=7 JobName=soak-bisect UserId=root(0) JobState=TIMEOUT Reason=TimeLimit Dependency=(null)"
    assert parse_job_state(line) == "TIMEOUT"
    assert parse_job_state("JobId=7 Reason=None") is None


def test_two_segments_run_at_once_and_both_come_back(slurm_cluster, tmp_path):
    async def main():
        ex = executor(slurm_cluster, slots=2)
        try:
            started = time.monotonic()
            await ex.submit(Build(0, "a"), segment_s=8, run_dir=tmp_path / "segment-000-build-0")
            await ex.submit(Build(1, "b"), segment_s=8, run_dir=tmp_path / "segment-001-build-1")
            await asyncio.sleep(3)
            running = [line for line in jobs_listed(slurm_cluster) if line.endswith("RUNNING")]
            first = await ex.next_done()
            second = await ex.next_done()
            return running, {first.build, second.build}, (first, second), time.monotonic() - started
        finally:
            await ex.aclose()

    running, builds, results, wall = asyncio.run(main())
    assert len(running) == 2, running  # both at once on a 2-CPU node
    assert builds == {0, 1}
    for result in results:
        assert result.ended_by == "end of load", result
        assert result.hangs == 0
        assert 4 <= result.exposure_s <= 12
    assert wall < 2 * 8 + 30  # not one after the other plus start-up
    assert jobs_listed(slurm_cluster) == []


def test_a_cancelled_segment_is_cut_with_its_exposure_so_far(slurm_cluster, tmp_path):
    run_dir = tmp_path / "segment-000-build-0"

    async def main():
        ex = executor(slurm_cluster, slots=1)
        try:
            await ex.submit(Build(0, "a"), segment_s=120, run_dir=run_dir)
            job = ex.in_flight[0]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not _has_requests(run_dir):
                await asyncio.sleep(0.5)
            await asyncio.sleep(4)
            assert slurm_cluster.run("scancel", job).returncode == 0  # an operator, from outside
            return await ex.next_done()
        finally:
            await ex.aclose()

    result = asyncio.run(main())
    assert result.ended_by == "cut: cancelled"
    assert result.hangs == 0
    assert result.exposure_s > 2  # counted up to the last record, not lost


def test_aclose_cancels_queued_and_running_segments_and_leaves_nothing(slurm_cluster, tmp_path):
    async def main():
        ex = executor(slurm_cluster, slots=3, cpus_per_segment=2)  # one runs, two wait for the CPUs
        for n in range(3):
            await ex.submit(Build(n, f"b{n}"), segment_s=300, run_dir=tmp_path / f"segment-00{n}-build-{n}")
        await asyncio.sleep(2)
        states = [line.split()[-1] for line in jobs_listed(slurm_cluster)]
        await ex.aclose()
        await ex.aclose()  # idempotent
        return states

    states = asyncio.run(main())
    assert sorted(states) == ["PENDING", "PENDING", "RUNNING"]
    assert jobs_listed(slurm_cluster) == []


def test_a_segment_past_its_time_limit_is_cut_not_a_hang(slurm_cluster, tmp_path):
    # No overhead: the limit is the minute Slurm rounds a 20 s segment up to, and
    # the segment asks for five. Slurm's granularity makes this the slow test (about 75 s).
    def long_run(build: Build, segment_s: float, run_dir: Path) -> list[str]:
        return soak_run_argv(build, 300, run_dir)

    async def main():
        ex = SlurmExecutor(long_run, options=SlurmOptions(slots=1, overhead_s=0, poll_s=1), env=slurm_cluster.env)
        try:
            await ex.submit(Build(0, "a"), segment_s=20, run_dir=tmp_path / "segment-000-build-0")
            return await asyncio.wait_for(ex.next_done(), 240)
        finally:
            await ex.aclose()

    result = asyncio.run(main())
    assert result.ended_by == "cut: timeout"
    assert result.hangs == 0
    assert result.exposure_s > 30


def _has_requests(run_dir: Path) -> bool:
    path = run_dir / "requests.jsonl"
    return path.exists() and path.stat().st_size > 0
