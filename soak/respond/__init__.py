"""The response to an incident: evidence bundle, SIGKILL of the target's tree,
a bounded wait for the GPUs to be free, and the stop/restart policy."""

from soak.respond.config import EvidenceConfig, ResponseConfig
from soak.respond.flight import (
    FlightRecorderPaths,
    default_flight_recorder_paths,
    flight_recorder_env,
    ownership_env,
)
from soak.respond.policy import Action, NextAction, next_action
from soak.respond.responder import Responder

__all__ = [
    "Action",
    "EvidenceConfig",
    "FlightRecorderPaths",
    "NextAction",
    "Responder",
    "ResponseConfig",
    "default_flight_recorder_paths",
    "flight_recorder_env",
    "ownership_env",
    "next_action",
]
