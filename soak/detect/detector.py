"""The detector: samples in, an Assessment out. Pure: no clock reads, no I/O.

States and their hysteresis::

    HEALTHY --(a rule pending)--> SUSPECT --(every rule clear for clear_after)--> HEALTHY
    HEALTHY | SUSPECT --(a rule fired: one Decision)--> HUNG --(reset(now))--> HEALTHY

HUNG is sticky: one incident is decided once, and the detector waits for the
responder to restart the target (``reset``) before it judges again.
"""

from __future__ import annotations

from soak.detect.config import DetectorConfig
from soak.detect.rules import RULES
from soak.detect.signals import SignalTracker
from soak.records import (
    Assessment,
    Decision,
    DetectorState,
    RuleState,
    RuleStatus,
    Topology,
)
from soak.samples import Sample


class Detector:
    def __init__(self, config: DetectorConfig, *, topology: Topology) -> None:
        self.config = config
        self.topology = topology
        self._signals = SignalTracker(config, topology)
        self._state = DetectorState.HEALTHY
        self._last_unclear: float | None = None
        self._decision: Decision | None = None

    @property
    def state(self) -> DetectorState:
        return self._state

    @property
    def decision(self) -> Decision | None:
        """The incident decided since the last reset, if any."""
        return self._decision

    def observe(self, sample: Sample) -> bool:
        """Fold ``sample`` in. True when an ``assess`` now would decide what the
        next scheduled one would: the sample fires a rule without waiting (a
        fatal log line, the server process gone) and nothing is decided yet."""
        return self._signals.observe(sample) and self._decision is None

    def reset(self, now: float) -> None:
        """After a restart: forget the old server (samples older than ``now`` are
        ignored), keep the healthy gaps learned so far."""
        self._signals.reset(now)
        self._state = DetectorState.HEALTHY
        self._last_unclear = None
        self._decision = None

    def resume_after_corruption(self, now: float) -> None:
        """on_corruption: continue: the corruption rule forgets canaries before now
        (it fires again after a good canary); the other rules keep their evidence."""
        self._signals.forget_canaries(now)
        self._state = DetectorState.HEALTHY
        self._last_unclear = None
        self._decision = None

    def assess(self, now: float) -> Assessment:
        statuses = tuple(rule(self._signals, self.config, now) for _, rule in RULES)
        if self._decision is not None:
            return Assessment(now, DetectorState.HUNG, statuses)
        fired = [s for s in statuses if s.state is RuleState.FIRED]
        if fired:
            self._decision = _decide(fired, now)
            self._state = DetectorState.HUNG
            return Assessment(now, self._state, statuses, (self._decision,))
        if any(s.state is RuleState.PENDING for s in statuses):
            self._state = DetectorState.SUSPECT
            self._last_unclear = now
        elif self._state is DetectorState.SUSPECT:
            if self._last_unclear is None or now - self._last_unclear >= self.config.clear_after:
                self._state = DetectorState.HEALTHY
        return Assessment(now, self._state, statuses)


def _decide(fired: list[RuleStatus], now: float) -> Decision:
    first = fired[0]
    onset = first.onset_at if first.onset_at is not None else now
    evidence = dict(first.evidence)
    evidence["elapsed_s"] = first.elapsed_s
    evidence["threshold_s"] = first.threshold_s
    if len(fired) > 1:
        evidence["also_fired"] = [s.rule for s in fired[1:]]
    return Decision(
        rule=first.rule,
        kind=first.kind,
        onset_at=min(onset, now),
        decided_at=now,
        reasons=first.reasons,
        evidence=evidence,
    )
