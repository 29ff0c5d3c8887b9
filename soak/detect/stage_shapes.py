"""The shapes of a stuck pipeline through the stage-CPU source (no GPUs).

On vLLM's CPU build a rank blocked in gloo's receive sleeps; it does not spin as
NCCL does on GPUs. Measured on the real server (docs/real-vllm.md): a skipped or
late send leaves every stage asleep while the engine waits for the last stage's
output; a deaf last stage spins at about one core while the stage before it sleeps
waiting for the next RPC; a SIGSTOPped last stage reads 0% (state T) beside a
sleeping stage 0 (which may finish a micro-batch first, at 30-50% for seconds).
Two shapes cover them:

- ``ASLEEP``: the last stage at or under ``asleep_pct`` and no stage upstream at
  or over ``spin_pct``: every stage asleep, or the stages before the tail winding
  down. Names the last stage: the engine waits for its output. (An upstream stage
  spinning beside an idle tail is the GPU seed's shape, pp_tail_stall's.)
- ``SPIN``: one stage after the first at or over ``spin_pct`` and no other stage
  there: the one spinning stage. Names it. (The first stage spinning beside an idle
  tail is, again, pp_tail_stall's.) The others need not read asleep: on a loaded box
  a deaf last stage's neighbour, asleep waiting for the next RPC, read 52-56% for
  three readings in a row (its wake-ups booked with their run-queue wait), which
  ended the run when the others had to be asleep, and the decision came from the log
  rule at 11 s, naming no stage.

A run of readings in one shape is kept only while requests are in flight at each
reading: stages asleep through an idle gap are no evidence, and a request that
arrives after one starts a new run. Pure: every time comes from a reading's ``ts``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Mapping, Sequence

from soak.records import Topology


class StageShape(str, Enum):
    ASLEEP = "asleep"
    SPIN = "spin"


@dataclass(frozen=True)
class ShapeReading:
    """One reading's shape and the stage an incident in it names."""

    shape: StageShape
    stage: int


@dataclass
class ShapeRun:
    """Consecutive readings in one shape, naming one stage, with requests in flight."""

    shape: StageShape
    stage: int
    since: float
    last: float
    points: int
    levels: tuple[float, ...]  # the latest reading, per stage, first stage first
    in_flight: int
    blips: int = 0  # readings that broke the shape for one reading only
    blip_pending: bool = False  # the latest reading was one
    # That reading's own shape and time: if the next reading is in that shape too, the
    # new shape began at the blip, not after it.
    blip_reading: ShapeReading | None = None
    blip_ts: float = 0.0
    blip_levels: tuple[float, ...] = ()


def stage_levels(levels: Mapping[int, float], topology: Topology) -> tuple[float, ...] | None:
    """Each stage's percent (the busiest of its indices present), first stage first;
    None when a stage has no reading (missing is never 0%)."""
    out = []
    for indices in topology.stages:
        present = [levels[i] for i in indices if i in levels]
        if not present:
            return None
        out.append(max(present))
    return tuple(out)


def classify(stages: Sequence[float], *, asleep_pct: float, spin_pct: float) -> ShapeReading | None:
    """The stuck shape ``stages`` (percent of a core, first stage first) is in, or None."""
    if len(stages) < 2:
        return None
    asleep = [v <= asleep_pct for v in stages]
    if asleep[-1] and all(v < spin_pct for v in stages[:-1]):
        return ShapeReading(StageShape.ASLEEP, len(stages) - 1)
    spinning = [i for i, v in enumerate(stages) if v >= spin_pct]
    if len(spinning) == 1 and spinning[0] > 0:
        return ShapeReading(StageShape.SPIN, spinning[0])
    return None


def fold(run: ShapeRun | None, reading: ShapeReading | None, *, ts: float, levels: tuple[float, ...],
         in_flight: int) -> ShapeRun | None:
    """The run after one reading at ``ts``: extended while the same shape names the same
    stage with requests in flight, begun anew by another shape, ended otherwise.

    One reading out of shape is a blip, not an end, on a loaded box: the kernel books a
    thread's run-queue wait when it next runs, so a sleeping rank's periodic wake-ups
    read 20-70% for one reading, and a spinner that waited out a whole interval reads
    0% there and 100% after (real CPU build and rig, load 17-19). Either shape, the
    same rule: one reading out of shape keeps the run, two in a row end it (a real
    deaf last stage's sleeping neighbour read 32-51% once every few seconds). A run
    is extended only by a reading in its own shape: a spinning run whose spinner
    reads asleep twice is no longer a spin, whatever the others read."""
    if in_flight <= 0:
        return None
    if run is not None and ts <= run.last:
        return run  # a reading out of order adds nothing
    if run is not None:
        if reading is not None and reading.shape is run.shape and reading.stage == run.stage:
            run.last, run.points, run.levels, run.in_flight, run.blip_pending = ts, run.points + 1, levels, in_flight, False
            return run
        if not run.blip_pending:
            run.blips, run.blip_pending, run.in_flight = run.blips + 1, True, in_flight
            run.blip_reading, run.blip_ts, run.blip_levels = reading, ts, levels
            return run
        if reading is not None and reading == run.blip_reading:
            return ShapeRun(reading.shape, reading.stage, run.blip_ts, ts, 2, levels, in_flight)
    return None if reading is None else ShapeRun(reading.shape, reading.stage, ts, ts, 1, levels, in_flight)


__all__ = ["ShapeReading", "ShapeRun", "StageShape", "classify", "fold", "stage_levels"]
