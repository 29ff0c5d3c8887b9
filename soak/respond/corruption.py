"""A corruption's response (pure): what ``response.on_corruption`` asks for, the
``incidents/N/corruption.json`` it leaves, and its one-line summary.

A corrupting server still answers, so nothing is SIGKILLed: the evidence is
captured while it runs, then ``stop`` ends the run and the server is stopped as
at the end of a run (launched: its normal stop; attached: left running);
``restart`` relaunches a launched target (its normal stop, then a start);
``continue`` records the incident and keeps soaking.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping

from soak.records import Decision
from soak.respond.config import ResponseConfig

NO_KILL_NOTE = "no SIGKILL: a corrupting server still answers; it is stopped as at the end of a run"


class CorruptionStep(str, Enum):
    STOP = "stop"
    RESTART = "restart"
    CONTINUE = "continue"


@dataclass(frozen=True)
class CorruptionAction:
    action: CorruptionStep
    reason: str


def corruption_action(config: ResponseConfig, *, restarts_done: int, can_restart: bool) -> CorruptionAction:
    """What the run does after a corruption's evidence is captured."""
    chosen = config.on_corruption
    if chosen == "continue":
        return CorruptionAction(CorruptionStep.CONTINUE, "on_corruption: continue")
    if chosen == "stop":
        return CorruptionAction(CorruptionStep.STOP, "on_corruption: stop")
    if not can_restart:
        return CorruptionAction(CorruptionStep.STOP,
                                "on_corruption: restart, but the target cannot be restarted by the harness")
    if restarts_done >= config.max_restarts:
        return CorruptionAction(CorruptionStep.STOP,
                                f"on_corruption: restart, max_restarts ({config.max_restarts}) reached")
    return CorruptionAction(CorruptionStep.RESTART,
                            f"on_corruption: restart ({restarts_done + 1} of {config.max_restarts})")


def corruption_file(decision: Decision) -> dict[str, Any]:
    """``corruption.json``: the canary, its reference and answer, the judgement, the
    server's state at that moment and the onset interval (from the rule's evidence)."""
    evidence: Mapping[str, Any] = decision.evidence or {}
    canary = (evidence.get("signals") or {}).get("canary") or {}
    detail = evidence.get("canary") or {}
    return {
        "canary_id": canary.get("canary_id"),
        "verdict": canary.get("verdict"),
        "long": canary.get("long"),
        "prompt_tokens": canary.get("prompt_tokens"),
        "reference_source": canary.get("reference_source"),
        "crosstalk_with": canary.get("crosstalk_with"),
        "reference": detail.get("reference"),
        "answer": detail.get("answer"),
        "judgement": detail.get("judgement"),
        "server": detail.get("server"),
        "load": detail.get("load"),
        "onset": {"at": decision.onset_at, **dict(evidence.get("onset_interval") or {})},
        "detected_at": decision.decided_at,
        "reasons": list(decision.reasons),
    }


def corruption_summary(decision: Decision, latency: str) -> str:
    canary = ((decision.evidence or {}).get("signals") or {}).get("canary") or {}
    what = "crosstalk" if canary.get("verdict") == "crosstalk" else "an unexplained divergence"
    position = canary.get("position")
    at = f" at token {position}" if isinstance(position, int) else ""
    return (f"corruption ({decision.rule}): canary {canary.get('canary_id', '?')} gave {what}{at}; {latency}; "
            "no SIGKILL (the server still answers)")
