"""Load generation: closed-loop sessions or open-loop arrivals, and timeouts."""

from __future__ import annotations

from soak.configbase import StrictModel


class LoadConfig(StrictModel):
    mode: str = "closed"
