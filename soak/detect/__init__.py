"""Hang detection: a pure state machine over sample records (see docs/detection.md)."""

from soak.detect.config import DetectorConfig
from soak.detect.detector import Detector
from soak.detect.types import (
    Assessment,
    Decision,
    DetectorState,
    IncidentKind,
    RuleState,
    RuleStatus,
    Topology,
)

__all__ = [
    "Assessment",
    "Decision",
    "Detector",
    "DetectorConfig",
    "DetectorState",
    "IncidentKind",
    "RuleState",
    "RuleStatus",
    "Topology",
]
