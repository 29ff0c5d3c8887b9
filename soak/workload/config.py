"""Workload files, tagged by ``kind``."""

from __future__ import annotations

from soak.configbase import StrictModel


class WorkloadConfig(StrictModel):
    kind: str = "synthetic_agentic"
