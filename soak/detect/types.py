"""The detector's typed results: states, rule statuses, decisions, assessments.

Everything here is immutable, and ``evidence`` mappings hold only JSON types, so
the responder writes a Decision into ``incident.json`` as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping


class DetectorState(str, Enum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    # An incident was decided (its Decision's kind says hang, crash or server gone);
    # the detector stays here until reset().
    HUNG = "hung"


class IncidentKind(str, Enum):
    HANG = "hang"
    CRASH = "crash"
    SERVER_GONE = "server_gone"


class RuleState(str, Enum):
    INACTIVE = "inactive"  # preconditions unmet: no data, idle server, switched off
    CLEAR = "clear"
    PENDING = "pending"  # the condition holds but not yet past its threshold
    FIRED = "fired"


@dataclass(frozen=True)
class Topology:
    """GPU indices of each pipeline stage, first stage first."""

    stages: tuple[tuple[int, ...], ...]

    @classmethod
    def pipeline(cls, pp_size: int, tp_size: int = 1, first_gpu: int = 0) -> "Topology":
        if pp_size < 1 or tp_size < 1:
            raise ValueError("pp_size and tp_size must be at least 1")
        return cls(
            tuple(
                tuple(range(first_gpu + stage * tp_size, first_gpu + (stage + 1) * tp_size))
                for stage in range(pp_size)
            )
        )

    @property
    def last_stage(self) -> tuple[int, ...]:
        return self.stages[-1] if self.stages else ()

    @property
    def upstream(self) -> tuple[int, ...]:
        return tuple(i for stage in self.stages[:-1] for i in stage)


@dataclass(frozen=True)
class RuleStatus:
    """One rule's verdict at one instant, with the reasons behind it."""

    rule: str
    state: RuleState
    kind: IncidentKind = IncidentKind.HANG
    # Best estimate of when progress stopped (for a pending or fired rule).
    onset_at: float | None = None
    elapsed_s: float | None = None
    threshold_s: float | None = None
    reasons: tuple[str, ...] = ()
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    rule: str
    kind: IncidentKind
    onset_at: float
    decided_at: float
    reasons: tuple[str, ...]
    # signals, since when, thresholds in force
    evidence: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "kind": self.kind.value,
            "onset_at": self.onset_at,
            "decided_at": self.decided_at,
            "reasons": list(self.reasons),
            "evidence": dict(self.evidence),
        }


@dataclass(frozen=True)
class Assessment:
    now: float
    state: DetectorState
    rules: tuple[RuleStatus, ...]
    new_incidents: tuple[Decision, ...] = ()

    def rule(self, name: str) -> RuleStatus:
        for status in self.rules:
            if status.rule == name:
                return status
        raise KeyError(name)
