"""After an incident: stop the soak, or restart the target and go on (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from soak.respond.config import ResponseConfig


class Action(str, Enum):
    STOP = "stop"
    RESTART = "restart"


@dataclass(frozen=True)
class NextAction:
    action: Action
    reason: str


def next_action(config: ResponseConfig, *, restarts_done: int, can_restart: bool = True) -> NextAction:
    """What the run loop does after an incident has been handled.

    ``on_hang: stop`` (the default) ends the soak: verdict fail, exit 1.
    ``on_hang: restart`` relaunches through ``target.restart()`` while fewer than
    ``max_restarts`` restarts have been made and the target can be restarted
    (an attached server cannot be relaunched by the harness).
    """
    if config.on_hang == "stop":
        return NextAction(Action.STOP, "on_hang: stop")
    if not can_restart:
        return NextAction(Action.STOP, "on_hang: restart, but the target cannot be restarted by the harness")
    if restarts_done >= config.max_restarts:
        return NextAction(Action.STOP, f"on_hang: restart, max_restarts ({config.max_restarts}) reached")
    return NextAction(Action.RESTART, f"on_hang: restart ({restarts_done + 1} of {config.max_restarts})")
