"""Simulator settings (section ``target: {kind: simulator, ...}`` and ``soak sim`` flags)."""

from __future__ import annotations

from soak.configbase import StrictModel


class SimConfig(StrictModel):
    model: str = "deepseek-v4-flash"
    pp_size: int = 8
    time_scale: float = 1.0
    seed: int = 0
