"""The incident cycle: a decision pauses the load, cuts what is in flight, gets
its response, then stops the load or restarts the target and resumes on the new
life, each step said in events.jsonl as before."""

from __future__ import annotations

import asyncio

import pytest

from soak.clock import ManualClock
from soak.errors import TargetNotReady
from soak.events import EventType
from soak.records import Decision, IncidentKind, IncidentRecord
from soak.respond.config import ResponseConfig
from soak.respond.policy import Action, NextAction
from soak.run.incidents import CycleParts, IncidentCycle, TargetLives, after_response
from soak.run.stopping import LoadStop
from soak.samples import CutCause


@pytest.mark.parametrize("policy, interrupted, stopping, after", [
    (Action.RESTART, False, False, Action.RESTART),
    (Action.RESTART, True, False, Action.STOP),  # Ctrl-C outranks the policy
    (Action.RESTART, False, True, Action.STOP),  # the load is ending anyway (a criterion, the duration)
    (Action.STOP, False, False, Action.STOP),
    (Action.STOP, True, True, Action.STOP),
])
def test_after_a_response(policy, interrupted, stopping, after):
    assert after_response(NextAction(policy, "why"), interrupted=interrupted, stopping=stopping) is after


class FakeLoad:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.stopping = False

    def stop(self, reason: str) -> None:
        self.calls.append(f"stop: {reason}")
        self.stopping = True

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")


class FakeClient:
    def __init__(self) -> None:
        self.cuts: list[tuple[str, CutCause]] = []

    def abort_in_flight(self, reason: str, *, cut_by: CutCause) -> int:
        self.cuts.append((reason, cut_by))
        return 2


class FakeResponder:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    async def handle(self, decision: Decision, number: int) -> IncidentRecord:
        if self.fail:
            raise RuntimeError("evidence disk gone")
        return IncidentRecord(number=number, kind=decision.kind, rule=decision.rule, onset_at=0.0, detected_at=1.0,
                              killed_pids=(), gpus_released=True, gpu_free_s=0.1, evidence="incidents/1",
                              summary="hang")


class FakeTally:
    def __init__(self) -> None:
        self.restarts: list[tuple[float, float]] = []

    def restart(self, paused: float, at: float) -> None:
        self.restarts.append((paused, at))


class FakeDetector:
    def __init__(self) -> None:
        self.resets: list[float] = []
        self.resumes: list[float] = []

    def reset(self, now: float) -> None:
        self.resets.append(now)

    def resume_after_corruption(self, now: float) -> None:
        self.resumes.append(now)


def _decision() -> Decision:
    return Decision(rule="pp_tail_stall", kind=IncidentKind.HANG, onset_at=0.0, decided_at=1.0, reasons=(),
                    evidence={})


def _cycle(*, response: dict, can_restart: bool = True, relaunch=None, fail_response: bool = False,
           interrupted: bool = False):
    load, client, tally, detector = FakeLoad(), FakeClient(), FakeTally(), FakeDetector()
    records: list[IncidentRecord] = []
    said: list[tuple[EventType, dict]] = []
    lives_log: list[str] = []
    stop = LoadStop()
    stop.load = load
    stop.interrupted = interrupted

    async def end() -> None:
        lives_log.append("probes closed")

    async def restarted() -> None:
        lives_log.append("target restarted")

    def begin() -> int:
        lives_log.append("probes started")
        return 4242

    parts = CycleParts(load=load, client=client, responder=FakeResponder(fail_response), detector=detector,
                       tally=tally, on_incident=records.append,
                       lives=TargetLives(end=end, relaunch=relaunch or restarted, begin=begin))
    cycle = IncidentCycle(parts, response=ResponseConfig(**response), can_restart=can_restart, stop=stop,
                          clock=ManualClock(), emit=lambda t, **f: said.append((t, f)))
    return cycle, stop, load, client, records, said, lives_log, tally, detector


def _types(said):
    return [t for t, _ in said]


def test_on_hang_stop_ends_the_load_after_the_response():
    cycle, stop, load, client, records, said, lives, _, _ = _cycle(response={"on_hang": "stop"})
    assert asyncio.run(cycle.respond_all([_decision()])) is True
    assert load.calls == ["pause", "stop: incident 1: on_hang: stop"]
    assert client.cuts == [("incident 1", CutCause.INCIDENT)]
    assert _types(said) == [EventType.INCIDENT_STARTED]
    assert said[0][1] == {"number": 1, "rule": "pp_tail_stall", "kind": "hang", "aborted_requests": 2}
    assert [r.number for r in records] == [1] and lives == []
    assert (cycle.incidents, cycle.restarts, cycle.failed) == (1, 0, True)
    assert stop.reason == "incident 1: on_hang: stop"


def test_on_hang_restart_relaunches_and_resumes_on_the_new_life():
    cycle, stop, load, _, _, said, lives, tally, detector = _cycle(response={"on_hang": "restart", "max_restarts": 1})
    assert asyncio.run(cycle.respond_all([_decision()])) is False
    assert load.calls == ["pause", "resume"]
    assert lives == ["probes closed", "target restarted", "probes started"]
    assert _types(said) == [EventType.INCIDENT_STARTED, EventType.RESTART_STARTED, EventType.RESTART_DONE]
    assert said[2][1] == {"number": 1, "restarts": 1, "root_pid": 4242}
    assert len(tally.restarts) == 1 and len(detector.resets) == 1
    # The second hang finds max_restarts reached: the load stops.
    assert asyncio.run(cycle.respond_all([_decision()])) is True
    assert stop.reason == "incident 2: on_hang: restart, max_restarts (1) reached"
    assert (cycle.incidents, cycle.restarts) == (2, 1)


def test_an_attached_target_is_never_restarted():
    cycle, stop, _, _, _, said, lives, _, _ = _cycle(response={"on_hang": "restart"}, can_restart=False)
    asyncio.run(cycle.respond_all([_decision()]))
    assert lives == [] and EventType.RESTART_STARTED not in _types(said)
    assert "cannot be restarted" in stop.reason


def test_a_failed_relaunch_stops_the_load_and_says_why():
    async def refuses() -> None:
        raise TargetNotReady("port never opened")

    cycle, stop, load, _, _, said, _, tally, _ = _cycle(response={"on_hang": "restart"}, relaunch=refuses)
    assert asyncio.run(cycle.respond_all([_decision()])) is True
    assert _types(said)[-1] is EventType.RESTART_FAILED and said[-1][1]["error"] == "port never opened"
    assert stop.reason == "incident 1: restart failed: port never opened"
    assert "resume" not in load.calls and tally.restarts == [] and cycle.restarts == 0


def test_ctrl_c_during_a_relaunch_cancels_it_at_once():
    async def scenario(cycle: IncidentCycle, stop: LoadStop, started: asyncio.Event) -> None:
        task = asyncio.ensure_future(cycle.respond_all([_decision()]))
        await started.wait()
        stop.interrupted, stop.reason = True, "interrupted (SIGINT)"
        cycle.cancel_restart()
        await asyncio.wait_for(task, 5)

    started = asyncio.Event()

    async def slow() -> None:
        started.set()
        await asyncio.sleep(600)

    cycle, stop, load, _, _, said, _, _, _ = _cycle(response={"on_hang": "restart"}, relaunch=slow)
    asyncio.run(scenario(cycle, stop, started))
    assert _types(said)[-1] is EventType.RESTART_CANCELLED
    assert said[-1][1] == {"number": 1, "reason": "interrupted (SIGINT)"}
    assert "resume" not in load.calls and cycle.idle.is_set()


def test_a_response_that_raises_fails_the_run_and_stops_the_load():
    cycle, stop, _, _, records, said, _, _, _ = _cycle(response={"on_hang": "restart"}, fail_response=True)
    assert asyncio.run(cycle.respond_all([_decision(), _decision()])) is True  # the second is never handled
    assert _types(said) == [EventType.INCIDENT_STARTED, EventType.INCIDENT_ERROR]
    assert said[1][1]["error"] == "RuntimeError: evidence disk gone"
    assert records == [] and cycle.failed and cycle.incidents == 1 and cycle.idle.is_set()
    assert stop.reason == "incident handling failed: evidence disk gone"
