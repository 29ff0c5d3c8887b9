"""Replay a recorded sample trace through a detector, as the live loop would.

The run loop calls ``assess(now)`` every ``interval`` seconds while samples
arrive, and at once after a sample that ``observe`` says settles a rule;
``replay`` does the same under the samples' own timestamps, so a trace of 66
simulated minutes replays in seconds. The samples come from
``soak.store.rundir.read_samples`` (a run directory or one samples file).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from soak.detect.detector import Detector
from soak.records import Decision, DetectorState
from soak.samples import Sample


@dataclass
class ReplayResult:
    decisions: list[Decision] = field(default_factory=list)
    assessments: int = 0
    states: dict[DetectorState, int] = field(default_factory=dict)
    first_ts: float | None = None
    last_ts: float | None = None

    @property
    def duration_s(self) -> float:
        if self.first_ts is None or self.last_ts is None:
            return 0.0
        return self.last_ts - self.first_ts


def replay(
    samples: Iterable[Sample],
    detector: Detector,
    *,
    interval: float | None = None,
    reset_after_incident: bool = False,
) -> ReplayResult:
    """Feed ``samples`` (in time order) and assess every ``interval`` seconds of their time."""
    step = interval if interval is not None else detector.config.interval
    result = ReplayResult()
    next_tick: float | None = None

    def tick(now: float) -> None:
        assessment = detector.assess(now)
        result.assessments += 1
        result.states[assessment.state] = result.states.get(assessment.state, 0) + 1
        result.decisions.extend(assessment.new_incidents)
        if assessment.new_incidents and reset_after_incident:
            detector.reset(now)

    for sample in samples:
        if result.first_ts is None:
            result.first_ts = sample.ts
            next_tick = sample.ts + step
        assert next_tick is not None
        while next_tick <= sample.ts:
            tick(next_tick)
            next_tick += step
        if detector.observe(sample):  # the live loop judges a settling sample at once
            tick(sample.ts)
            next_tick = sample.ts + step
        result.last_ts = sample.ts
    if next_tick is not None and result.last_ts is not None:
        tick(max(next_tick, result.last_ts))
    return result
