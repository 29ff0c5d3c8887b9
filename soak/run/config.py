"""Targets: the simulator (default), a server the harness launches, or one it attaches to."""

from __future__ import annotations

from typing import Literal

from soak.configbase import StrictModel
from soak.sim.config import SimConfig


class SimulatorTarget(StrictModel):
    kind: Literal["simulator"] = "simulator"
    sim: SimConfig = SimConfig()


TargetConfig = SimulatorTarget
