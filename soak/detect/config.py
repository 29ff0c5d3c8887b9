"""Detector rules and thresholds."""

from __future__ import annotations

from soak.configbase import StrictModel


class DetectorConfig(StrictModel):
    pass
