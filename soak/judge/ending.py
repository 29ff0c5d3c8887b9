"""What a run knew at its end that no file held yet, as the judge reads it.

The run loop builds an ``Ending`` from its own state (``Ending.live``); ``soak
report`` rebuilds it from the ``run_ended`` event the run recorded
(``Ending.recorded``), so both judge the same facts. A run with no ``run_ended``
(its harness was killed) was cut off (``Ending.cut_off``).

``run_ended`` carries the Ending's fields (``problem``, ``interrupted``,
``harness_fault``, ``failed_live``, besides ``reason`` and ``load_cut_short``);
a run recorded before they existed is read from its exit code: 2 and 3 a
problem, 4 a harness fault, 130 an interrupt, and a ``fail`` verdict with exit 1
or 130 a failure the run saw live.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping

from soak.judge.ladder import Problem
from soak.store.summary import recorded_cut_short

_PROBLEM_EXITS = {3: Problem.ENVIRONMENT, 2: Problem.USAGE}


class EndingSource(str, Enum):
    LIVE = "live"  # the run loop, at its end: the stop reason is composed by the judge
    RECORDED = "recorded"  # run_ended as written: its reason is final
    CUT_OFF = "cut_off"  # no run_ended: no exit code, the verdict from the record alone


@dataclass(frozen=True)
class Ending:
    source: EndingSource
    problem: Problem | None = None
    interrupted: bool = False
    harness_fault: str | None = None  # "while <where>: <Type>: <message>"
    failed_live: bool = False  # an incident the run responded to, or a response that failed
    stop_reason: str | None = None
    load_cut_short: bool = False
    incidents_seen: int = 0  # the incidents the run loop counted live
    restarts: int = 0
    threshold_aborted: str | None = None  # the abort_on_fail threshold that stopped the load

    @classmethod
    def live(cls, **facts: Any) -> Ending:
        return cls(EndingSource.LIVE, **facts)

    @classmethod
    def cut_off(cls) -> Ending:
        return cls(EndingSource.CUT_OFF)

    @classmethod
    def recorded(cls, run_ended: Mapping[str, Any] | None) -> Ending:
        """The Ending a recorded ``run_ended`` says (typed fields: soak.store.summary.EVENT_TYPES)."""
        if run_ended is None:
            return cls.cut_off()
        exit_code = run_ended.get("exit_code")
        if "problem" in run_ended or "interrupted" in run_ended:
            problem = _problem(run_ended.get("problem"))
            interrupted = run_ended.get("interrupted") is True
            fault = run_ended.get("harness_fault")
            failed = run_ended.get("failed_live") is True
        else:  # written before these fields: the exit code says them
            problem = _PROBLEM_EXITS.get(exit_code) if isinstance(exit_code, int) else None
            interrupted = exit_code == 130
            fault = "(exit 4)" if exit_code == 4 else None
            failed = run_ended.get("verdict") == "fail" and exit_code in (1, 130)
        seen, restarts = run_ended.get("incidents"), run_ended.get("restarts")
        return cls(EndingSource.RECORDED, problem=problem, interrupted=interrupted, harness_fault=fault,
                   failed_live=failed, stop_reason=run_ended.get("reason"),
                   load_cut_short=recorded_cut_short(run_ended),
                   incidents_seen=seen if type(seen) is int else 0, restarts=restarts if type(restarts) is int else 0)

    def run_ended_fields(self) -> dict[str, Any]:
        """The Ending's own fields of ``run_ended`` (the documented addition)."""
        return {"problem": self.problem.value if self.problem is not None else None,
                "interrupted": self.interrupted, "harness_fault": self.harness_fault,
                "failed_live": self.failed_live}


def _problem(value: Any) -> Problem | None:
    try:
        return Problem(value) if value is not None else None
    except ValueError:
        return None


__all__ = ["Ending", "EndingSource"]
