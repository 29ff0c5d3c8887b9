"""What the live view's GPU/stage rows and detector row say, pure.

An instant sample of a busy pipeline catches each stage between its bursts
about as often as inside one: eight GPUs at 0.0% while tokens flow. The rows
show each GPU's (or stage's) max and mean over the last few seconds instead
(``StageWindow``), which a dark stage still fails and a busy one passes.
``suspect_text`` says which rule holds the detector in ``suspect`` and how far
along it is ("stage_cpu_stall 2.6/5.0 s"; a sequential rule's evidence against its
bound, in nats, not seconds: "pp_tail_stall evidence 7.2/18.1 (40% of the bound)").
``incident_text`` says an incident's detection latency as an interval.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Mapping

from soak.onset import restated
from soak.records import Assessment, DetectorState, IncidentRecord, RuleState, RuleStatus
from soak.samples import GpuReading, GpuSample, GpuSource

STAGE_WINDOW_S = 5.0


@dataclass(frozen=True)
class StageLevel:
    """One GPU (or pipeline stage, for stage CPU) over the window."""

    label: str  # "gpu 3" | "stage 1 CPU"
    max_pct: float
    mean_pct: float


def _values(reading: GpuReading) -> tuple[float, ...]:
    # NVML's 200 ms samples since the previous reading, where the source has them
    return reading.util_samples or (reading.util_pct,)


class StageWindow:
    """The GPU samples of the last ``window_s`` seconds (bounded by time and count)."""

    def __init__(self, window_s: float = STAGE_WINDOW_S, *, max_samples: int = 256) -> None:
        self.window_s = window_s
        self._samples: deque[GpuSample] = deque(maxlen=max_samples)

    def add(self, sample: GpuSample) -> None:
        if sample.error is None and sample.gpus:
            if self._samples and self._samples[-1].source is not sample.source:
                self._samples.clear()  # another source (stages vs GPUs): never mix their rows
            self._samples.append(sample)

    def levels(self, now: float) -> tuple[StageLevel, ...]:
        """Each GPU's or stage's max and mean over the window ending ``now``, in reading order."""
        recent = [s for s in self._samples if s.ts >= now - self.window_s]
        if not recent and self._samples:
            recent = [self._samples[-1]]  # nothing new in the window: the last reading, said as it is
        return levels_of(recent)


def levels_of(samples: list[GpuSample]) -> tuple[StageLevel, ...]:
    """Max and mean per GPU (by index) or per stage (by position) over ``samples``."""
    by_key: dict[int, list[float]] = {}
    stage_cpu = bool(samples) and samples[-1].source is GpuSource.STAGE_CPU
    for sample in samples:
        for position, reading in enumerate(sample.gpus):
            by_key.setdefault(position if stage_cpu else reading.index, []).extend(_values(reading))
    return tuple(StageLevel(label=f"stage {key} CPU" if stage_cpu else f"gpu {key}", max_pct=max(values),
                            mean_pct=sum(values) / len(values)) for key, values in by_key.items())


def levels_text(levels: tuple[StageLevel, ...]) -> str:
    """The plain line's compact form: max/mean per GPU or stage ("100/87 100/91")."""
    return " ".join(f"{lv.max_pct:.0f}/{lv.mean_pct:.0f}" for lv in levels) or "-"


def _sequential(status: RuleStatus) -> bool:
    """A rule decided by sequential evidence (soak.detect.seq_rule): its elapsed_s and
    threshold_s hold log-likelihood evidence and its bound, in nats, not seconds."""
    thresholds = status.evidence.get("thresholds") if isinstance(status.evidence, Mapping) else None
    return isinstance(thresholds, Mapping) and "bound" in thresholds and "arl0_hours" in thresholds


def _progress(status: RuleStatus) -> str:
    elapsed = f"{status.elapsed_s:.1f}" if status.elapsed_s is not None else "?"
    if _sequential(status):
        known = status.threshold_s and status.elapsed_s is not None
        share = f" ({_fraction(status):.0%} of the bound)" if known else ""
        bound = f"/{status.threshold_s:.1f}" if status.threshold_s else ""
        return f"{status.rule} evidence {elapsed}{bound}{share}"
    if status.threshold_s:
        return f"{status.rule} {elapsed}/{status.threshold_s:.1f} s"
    return f"{status.rule} {elapsed} s"


def _fraction(status: RuleStatus) -> float:
    if status.elapsed_s is None or not status.threshold_s:
        return 0.0
    return status.elapsed_s / status.threshold_s


def suspect_text(assessment: Assessment, *, last: str | None = None) -> str | None:
    """Why the detector is not healthy: the pending rule furthest along, with its
    progress; ``last`` is the previous text, kept (as "clearing") while the
    detector waits out its clear_after with every rule clear again."""
    if assessment.state is DetectorState.HEALTHY:
        return None
    if assessment.state is DetectorState.HUNG:
        decided = assessment.new_incidents[0].rule if assessment.new_incidents else None
        fired = [s for s in assessment.rules if s.state is RuleState.FIRED]
        rule = decided or (fired[0].rule if fired else None)
        return f"hung: {rule}" if rule else (last or "hung")
    pending = sorted((s for s in assessment.rules if s.state is RuleState.PENDING), key=_fraction, reverse=True)
    if pending:
        others = f" (+{len(pending) - 1} more)" if len(pending) > 1 else ""
        return f"suspect: {_progress(pending[0])}{others}"
    if last and last.startswith("suspect: ") and not last.startswith("suspect: clearing"):
        return f"suspect: clearing (was {last[len('suspect: '):]})"
    return last or "suspect: clearing"


def incident_text(incident: IncidentRecord) -> str:
    """The line that stays when an incident is decided: the responder's summary with its
    single figure said as the interval, "detected 0.9-1.6 s after the onset (onset
    between 21:04:05.2 and 21:04:05.9 UTC)"; a rule with no interval says "point estimate"."""
    return f"soak: incident {incident.number}: " + restated(incident.summary, incident.detection_latency,
                                                            sentence=True)


__all__ = ["STAGE_WINDOW_S", "incident_text", "StageLevel", "StageWindow", "levels_of", "levels_text", "suspect_text"]
