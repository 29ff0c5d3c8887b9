"""The response to a corruption (``response.on_corruption``): stop captures the
evidence and ends the run without cutting or killing anything; restart relaunches
a launched target; continue records it and keeps soaking. And the responder's
bundle: corruption.json, no SIGKILL."""

from __future__ import annotations

import asyncio
import json

import pytest

from soak.clock import ManualClock
from soak.detect.config import DetectorConfig
from soak.detect.detector import Detector
from soak.events import EventType
from soak.records import Decision, IncidentKind, Topology
from soak.respond.config import ResponseConfig
from soak.respond.corruption import CorruptionStep, corruption_action
from soak.respond.responder import Responder
from soak.samples import CanarySample
from tests.run.test_incidents import _cycle, _types


def _corruption() -> Decision:
    return Decision(rule="corruption", kind=IncidentKind.CORRUPTION, onset_at=10.0, decided_at=31.0,
                    reasons=("position 3: answered ' cold' where the reference has ' warm'",),
                    evidence={"onset_interval": {"earliest": 10.0, "latest": 30.0},
                              "signals": {"canary": {"canary_id": "long-0", "verdict": "corrupt", "long": True,
                                                     "position": 3, "reference_source": "file"}},
                              "canary": {"judgement": {"position": 3}, "reference": {"tokens": [{"token": "a"}]},
                                         "answer": {"tokens": [{"token": "b"}]},
                                         "server": {"running": 9.0, "waiting": 1.0, "kv_cache_usage_perc": 0.7}}})


@pytest.mark.parametrize("chosen, restarts, can_restart, step", [
    ("stop", 0, True, CorruptionStep.STOP),
    ("continue", 0, False, CorruptionStep.CONTINUE),
    ("restart", 0, True, CorruptionStep.RESTART),
    ("restart", 0, False, CorruptionStep.STOP),  # attached: the harness cannot relaunch it
    ("restart", 3, True, CorruptionStep.STOP),  # max_restarts reached
])
def test_the_action(chosen, restarts, can_restart, step):
    config = ResponseConfig(on_corruption=chosen, max_restarts=3)
    assert corruption_action(config, restarts_done=restarts, can_restart=can_restart).action is step


def test_stop_is_the_default_and_cuts_nothing():
    cycle, stop, load, client, records, said, lives, _, detector = _cycle(response={})
    assert asyncio.run(cycle.respond_all([_corruption()])) is True
    assert load.calls == ["stop: incident 1: on_corruption: stop"]  # no pause: the load drains as at the end
    assert client.cuts == [] and lives == [] and detector.resets == []
    assert said[0][1]["kind"] == "corruption" and said[0][1]["response"] == "stop"
    assert (cycle.incidents, cycle.failed) == (1, True) and len(records) == 1


def test_restart_relaunches_a_launched_target():
    cycle, stop, load, client, _, said, lives, _, detector = _cycle(response={"on_corruption": "restart"})
    assert asyncio.run(cycle.respond_all([_corruption()])) is False
    assert load.calls == ["pause", "resume"] and client.cuts
    assert lives == ["probes closed", "target restarted", "probes started"]
    assert EventType.RESTART_DONE in _types(said) and cycle.restarts == 1 and len(detector.resets) == 1


def test_continue_keeps_soaking_and_the_run_still_fails():
    cycle, stop, load, client, records, said, lives, _, detector = _cycle(response={"on_corruption": "continue"})
    assert asyncio.run(cycle.respond_all([_corruption()])) is False
    assert load.calls == [] and client.cuts == [] and lives == []
    assert stop.reason is None and cycle.failed and len(records) == 1
    # the corruption rule's memory is cleared so it judges again; the hang rules keep theirs
    assert detector.resumes and detector.resets == []


def test_continue_with_a_real_detector_judges_again():
    cycle, *_ = _cycle(response={"on_corruption": "continue"})
    t = cycle._clock.now()
    d = Detector(DetectorConfig(), topology=Topology(stages=((0,),)))
    d.observe(CanarySample(ts=t - 1.0, canary_id="s", verdict="corrupt", started_at=t - 1.5))
    [decision] = d.assess(t).new_incidents
    cycle._parts = cycle._parts.__class__(**{**cycle._parts.__dict__, "detector": d})
    asyncio.run(cycle.respond_all([decision]))
    d.observe(CanarySample(ts=t + 3.0, canary_id="s", verdict="match", started_at=t + 2.5))
    assert d.observe(CanarySample(ts=t + 5.0, canary_id="s", verdict="corrupt", started_at=t + 4.5))
    assert d.assess(t + 6.0).new_incidents  # a second incident: the detector judges again


class Target:
    base_url = "http://127.0.0.1:9"
    root_pid = None
    identity = None
    log_path = None
    flight_recorder_pipe_stem = None

    def returncode(self):
        return None


async def test_the_responder_writes_corruption_json_and_kills_nothing(tmp_path):
    config = ResponseConfig(evidence={"py_spy": False, "flight_recorder": False, "budget": 2.0}, find_root_by_port=False)
    responder = Responder(config, run_dir=tmp_path, target=Target(), gpu_source=None, clock=ManualClock(),
                          recent_samples=lambda: [])
    record = await responder.handle(_corruption(), 1)
    await responder.aclose()
    assert record.kind is IncidentKind.CORRUPTION and record.killed_pids == () and record.killed_at is None
    assert (record.onset_earliest_at, record.onset_latest_at) == (10.0, 30.0)
    assert "no SIGKILL" in record.summary
    evidence = json.loads((tmp_path / "incidents" / "1" / "corruption.json").read_text())
    assert evidence["canary_id"] == "long-0" and evidence["long"] is True and evidence["reference_source"] == "file"
    assert evidence["answer"] == {"tokens": [{"token": "b"}]} and evidence["server"]["running"] == 9.0
    assert evidence["onset"] == {"at": 10.0, "earliest": 10.0, "latest": 30.0}
    header = json.loads((tmp_path / "incidents" / "1" / "incident.json").read_text())
    assert header["status"] == "done" and header["record"]["killed_pids"] == []
