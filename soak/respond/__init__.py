"""The response to an incident: evidence bundle, SIGKILL of the target's tree,
a bounded wait for the GPUs to be free, and the stop/restart policy.

The names below load on first use: the guardian (``soak.run.guardian``) runs in
every launched soak and needs only ``soak.respond.tree``; importing the
responder and its config models would triple its start-up CPU.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {
    "EvidenceConfig": "soak.respond.config",
    "ResponseConfig": "soak.respond.config",
    "FlightRecorderPaths": "soak.respond.flight",
    "default_flight_recorder_paths": "soak.respond.flight",
    "flight_recorder_env": "soak.respond.flight",
    "ownership_env": "soak.respond.flight",
    "Action": "soak.respond.policy",
    "NextAction": "soak.respond.policy",
    "next_action": "soak.respond.policy",
    "Responder": "soak.respond.responder",
}

__all__ = sorted(_HOMES)

if TYPE_CHECKING:
    from soak.respond.config import EvidenceConfig, ResponseConfig
    from soak.respond.flight import FlightRecorderPaths, default_flight_recorder_paths, flight_recorder_env, ownership_env
    from soak.respond.policy import Action, NextAction, next_action
    from soak.respond.responder import Responder


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'soak.respond' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
