"""What happens on a hang: evidence, kill, restart policy."""

from __future__ import annotations

from typing import Literal

from soak.configbase import StrictModel


class ResponseConfig(StrictModel):
    on_hang: Literal["stop", "restart"] = "stop"
    max_restarts: int = 3
