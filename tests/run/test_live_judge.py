"""The criteria judged live: a criterion newly at risk or failed is said once; a
failed one (stop_on_breach) stops the load with its reason; an at-risk one does
not (the rate can recover)."""

from __future__ import annotations

from soak.clock import ManualClock
from soak.criteria import CriteriaConfig, RequestTally
from soak.events import EventType
from soak.run.live_judge import LiveJudge
from soak.run.stopping import LoadStop


class Load:
    def __init__(self) -> None:
        self.stopped: list[str] = []

    def stop(self, reason: str) -> None:
        self.stopped.append(reason)

    @property
    def stopping(self) -> bool:
        return bool(self.stopped)

    def pause(self) -> None: ...

    def resume(self) -> None: ...


def _judge(records, **config):
    cfg = CriteriaConfig.model_validate(config)
    stop, load, said = LoadStop(), Load(), []
    stop.load = load
    judge = LiveJudge(cfg, tally=RequestTally.of(cfg, records), stop=stop, clock=ManualClock(),
                      emit=lambda t, **f: said.append((t, f)))
    return judge, stop, load, said


def rec(ended: float, outcome: str = "ok") -> dict:
    return {"outcome": outcome, "ended_at": ended}


def test_an_error_rate_at_risk_is_said_once_and_does_not_stop_the_load():
    records = [rec(i) for i in range(90)] + [rec(100 + i, "http_status") for i in range(10)]
    judge, stop, load, said = _judge(records)
    judge.criteria()
    judge.criteria()
    assert [(t, f["criterion"]) for t, f in said] == [(EventType.CRITERION_AT_RISK, "error_rate")]
    assert load.stopped == [] and stop.reason is None


def test_no_success_through_its_window_fails_and_stops_the_load_with_its_reason():
    records = [rec(t, "timeout_stall") for t in range(0, 200, 5)]
    judge, stop, load, said = _judge(records, error_rate={"enabled": False})
    judge.criteria()
    judge.criteria()
    assert [(t, f["criterion"]) for t, f in said] == [(EventType.CRITERION_FAIL, "no_success")]
    assert len(load.stopped) == 1 and load.stopped[0].startswith("criterion no_success: ")
    assert stop.reason == load.stopped[0]


def test_a_failure_with_stop_on_breach_off_is_said_but_the_load_goes_on():
    records = [rec(t, "timeout_stall") for t in range(0, 200, 5)]
    judge, stop, load, said = _judge(records, error_rate={"enabled": False}, stop_on_breach=False)
    judge.criteria()
    assert [t for t, _ in said] == [EventType.CRITERION_FAIL] and load.stopped == []
