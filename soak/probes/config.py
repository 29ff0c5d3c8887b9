"""Probe schedules and sources."""

from __future__ import annotations

from soak.configbase import StrictModel


class ProbesConfig(StrictModel):
    pass
