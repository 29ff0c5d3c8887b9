"""The bisect loop over an executor: the pure core names a build, the executor
soaks it, the finished segment joins the evidence, until the posterior names
the first bad build, the budget is spent, or the segment bound is reached.

No clock and no I/O of its own: the executor runs segments and writes their run
directories, the caller reads results back to resume (``done``) and writes
bisect.json from ``on_step``. The caller closes the executor (which cancels
segments still in flight once the answer is in).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from soak.bisect.executor import Build, Executor, SegmentResult
from soak.bisect.posterior import BisectState, Model, Step, step


@dataclass(frozen=True)
class Outcome:
    step: Step  # the last: found, out of budget, or searching when the segment bound stopped it
    results: tuple[SegmentResult, ...]  # every finished segment, in the order they finished
    stopped_by: str  # "found", "out_of_budget", "segment bound"


def segment_dir(root: Path, number: int, build: Build) -> Path:
    """One run directory per segment, numbered in submission order."""
    return root / f"segment-{number:03d}-build-{build.index}"


def _number(run_dir: Path) -> int | None:
    from soak.bisect.segments import parse_segment_dir

    parsed = parse_segment_dir(run_dir)
    return parsed[0] if parsed else None


def _pick(now: Step, in_flight: dict[int, int]) -> int:
    """The build of largest expected gain not already being soaked (with one slot
    that is the core's choice; with several, the next ones down its ranking, so
    slots spread over builds rather than repeat the best one blind)."""
    assert now.choice is not None
    gains = now.choice.gain_bits
    # gains equal to 12 digits are a tie, as in posterior.choose: float noise ranks nothing
    ranked = sorted(range(len(gains)), key=lambda j: (-round(gains[j], 12), j != now.choice.build, j))
    for j in ranked:
        if not in_flight.get(j):
            return j
    return now.choice.build  # every build in flight: the best one again


async def conduct(builds: Sequence[Build], executor: Executor, *, model: Model, segment_s: float, root: Path,
                  threshold: float = 0.95, budget_s: float | None = None, done: Sequence[SegmentResult] = (),
                  on_step: Callable[[Step, tuple[SegmentResult, ...]], None] | None = None,
                  max_segments: int = 500, first_number: int = 0) -> Outcome:
    """Run the bisection to its end. ``done``: segments already finished (a
    resumed bisect reads them from its run directories). ``max_segments`` bounds
    the loop whatever the evidence (segments submitted, ``done`` included).
    New segments are numbered from past the highest of ``done`` and
    ``first_number`` (``segments.next_number``: set-aside directories count), never
    ``len(done)``: after a gap that would name a directory that exists (``soak run``
    refuses it) and draw a segment's seeds again."""
    if len(builds) != model.builds or any(b.index != i for i, b in enumerate(builds)):
        raise ValueError("the builds must be the model's, indexed in order")
    results = list(done)
    in_flight: dict[int, int] = {}
    submitted = len(results)
    number = max([first_number, *(n + 1 for r in results if (n := _number(r.run_dir)) is not None)])
    while True:
        now = step([r.segment for r in results], model=model, segment_s=segment_s, threshold=threshold,
                   budget_s=budget_s)
        if on_step is not None:
            on_step(now, tuple(results))
        if now.state is not BisectState.SEARCHING:
            return Outcome(now, tuple(results), now.state.value)
        pending = sum(in_flight.values())
        while pending < executor.slots and submitted < max_segments and (
                budget_s is None or now.spent_s + (pending + 1) * segment_s <= budget_s or pending == 0):
            pick = _pick(now, in_flight)
            await executor.submit(builds[pick], segment_s=segment_s, run_dir=segment_dir(root, number, builds[pick]))
            submitted += 1
            number += 1
            pending += 1
            in_flight[pick] = in_flight.get(pick, 0) + 1
        if pending == 0:
            return Outcome(now, tuple(results), "segment bound")
        finished = await executor.next_done()
        in_flight[finished.build] = in_flight.get(finished.build, 1) - 1
        results.append(finished)
