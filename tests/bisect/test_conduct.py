"""The bisect loop over an executor (soak/bisect/conduct.py), with a fake
executor of simulated builds: one slot or several, finishing out of order,
resumed from finished segments, stopped by the budget or the segment bound."""

from __future__ import annotations

import heapq
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.bisect.conduct import conduct, segment_dir
from soak.bisect.executor import Build, SegmentResult
from soak.bisect.posterior import BisectState, model, posterior

MIN = 60.0
ROOT = Path("/bisect")


class FakeExecutor:
    """Simulated builds: exponential times to hang, a segment stopped at its first
    hang, on a simulated clock. With several in flight, each finishes when its time
    runs out, so they finish out of order (a hang before a clean segment submitted
    earlier) and every one finishes (a queue that let the newest go first starved the
    oldest for ever, and which build it starved hung on float noise in the gains)."""

    def __init__(self, mtbf_s: list[float], *, slots: int = 1, seed: int = 0) -> None:
        self.slots = slots
        self._rng = random.Random(seed)
        self._mtbf = mtbf_s
        self._now = 0.0
        self._queue: list[tuple[float, int, SegmentResult]] = []  # (finishes at, submitted as, result)
        self.submitted: list[tuple[int, Path]] = []

    async def submit(self, build: Build, *, segment_s: float, run_dir: Path) -> None:
        self.submitted.append((build.index, run_dir))
        t = self._rng.expovariate(1 / self._mtbf[build.index])
        hung = t < segment_s
        heapq.heappush(self._queue, (self._now + min(t, segment_s), len(self.submitted), SegmentResult(
            build.index, run_dir, min(t, segment_s), int(hung), "hang" if hung else "time")))

    async def next_done(self) -> SegmentResult:
        self._now, _, result = heapq.heappop(self._queue)
        return result

    async def aclose(self) -> None:
        self._queue.clear()


def builds(n: int) -> list[Build]:
    return [Build(i, f"build-{i}") for i in range(n)]


def mtbfs(n: int, first_bad: int) -> list[float]:
    return [5 * MIN if j >= first_bad else 6000 * MIN for j in range(n)]


async def test_one_slot_finds_the_first_bad_build() -> None:
    fake = FakeExecutor(mtbfs(6, 4), seed=1)
    steps = []
    out = await conduct(builds(6), fake, model=model(builds=6), segment_s=30 * MIN, root=ROOT,
                        on_step=lambda s, r: steps.append((s.state, len(r))))
    assert out.stopped_by == "found" and out.step.posterior.best == 4
    assert steps[-1] == (BisectState.FOUND, len(out.results)) and len(steps) == len(out.results) + 1
    dirs = [d for _, d in fake.submitted]
    assert dirs[0] == segment_dir(ROOT, 0, Build(fake.submitted[0][0], "")) and len(set(dirs)) == len(dirs)


async def test_several_slots_spread_over_builds_and_still_find_it() -> None:
    fake = FakeExecutor(mtbfs(8, 2), slots=3, seed=2)
    out = await conduct(builds(8), fake, model=model(builds=8), segment_s=30 * MIN, root=ROOT)
    assert out.stopped_by == "found" and out.step.posterior.best == 2
    assert len({b for b, _ in fake.submitted[:3]}) == 3  # the first three segments soak three builds


async def test_a_killed_bisect_resumes_from_its_segments() -> None:
    m = model(builds=6)
    first = await conduct(builds(6), FakeExecutor(mtbfs(6, 3), seed=3), model=m, segment_s=30 * MIN, root=ROOT,
                          max_segments=3)
    assert first.stopped_by == "segment bound" and len(first.results) == 3
    seen = []
    fake = FakeExecutor(mtbfs(6, 3), seed=4)
    again = await conduct(builds(6), fake, model=m, segment_s=30 * MIN, root=ROOT, done=first.results,
                          on_step=lambda s, r: seen.append(s.posterior))
    # the resumed loop starts where the first stood, and numbers its run directories on
    assert seen[0] == posterior([r.segment for r in first.results], model=m)
    assert fake.submitted[0][1].name.startswith("segment-003-")
    assert again.stopped_by == "found" and again.step.posterior.best == 3
    assert again.results[:3] == first.results


async def test_the_budget_ends_it() -> None:
    fake = FakeExecutor([6000 * MIN] * 6, seed=5)  # nothing hangs: no answer soon
    out = await conduct(builds(6), fake, model=model(builds=6), segment_s=30 * MIN, root=ROOT, budget_s=3600.0)
    assert out.stopped_by == "out_of_budget" and len(out.results) == 2
    assert out.step.reasons[0].startswith("budget of 1.0 h spent below 95%")


async def test_the_builds_must_be_the_models() -> None:
    with pytest.raises(ValueError, match="the model's"):
        await conduct(builds(5), FakeExecutor([1.0] * 5), model=model(builds=6), segment_s=60.0, root=ROOT)


@settings(max_examples=60, deadline=None)
@given(st.sets(st.integers(0, 40), min_size=1, max_size=8), st.sets(st.integers(0, 60), max_size=4))
def test_a_new_segment_never_takes_a_used_number(done_numbers: set[int], set_aside: set[int]) -> None:
    import asyncio
    import tempfile

    from soak.bisect.segments import next_number, parse_segment_dir

    builds = [Build(i, f"b{i}") for i in range(4)]
    done = [SegmentResult(n % 4, ROOT / f"segment-{n:03d}-build-{n % 4}", 300.0, 0, "time")
            for n in sorted(done_numbers)]
    with tempfile.TemporaryDirectory() as tmp:  # what a resume finds on disk: set-aside ones too
        for n in set_aside:
            (Path(tmp) / f"segment-{n:03d}-build-0.unreadable").mkdir()
        first = next_number(Path(tmp))
    fake = FakeExecutor([3600.0, 3600.0, 60.0, 60.0])
    asyncio.run(conduct(builds, fake, model=model(builds=4), segment_s=300, root=ROOT, done=done,
                        max_segments=len(done) + 3, first_number=first))
    used = done_numbers | set_aside
    new = [parse_segment_dir(run_dir)[0] for _, run_dir in fake.submitted]
    assert new and not set(new) & used and len(set(new)) == len(new)
