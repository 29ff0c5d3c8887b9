"""Hang detection: a pure state machine over sample records (see docs/detection.md).

Its results (Assessment, RuleStatus, Decision) and states live in ``soak.records``.
"""

from soak.detect.config import DetectorConfig
from soak.detect.detector import Detector

__all__ = ["Detector", "DetectorConfig"]
