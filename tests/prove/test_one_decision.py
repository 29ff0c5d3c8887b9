"""One proof (issue 50): the live decision, the end's, ``soak report``'s, history's
and bisect's are the same on every recorded run, and so is its time at risk.

Each example is a run recorded to disk as the harness records one (events.jsonl
with ``ts`` and ``mono``, requests.jsonl): productive requests while the target
works, hangs whose onset is detected up to the detection horizon later and a
restart after each, a load that stops at its planned end or, with
``stop_at_decision``, at the live decision. The live tracker is fed what the run
loop feeds it, ticked like the detector; then the recorded run is judged
(``rejudge``: the end and ``soak report`` alike), read by history
(``run_record``, ``prove_build``) and by bisect (``read_segment``)."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from soak.bisect.segments import read_segment
from soak.exposure import at_risk
from soak.history.model import run_record
from soak.history.prove import prove_build
from soak.judge.entry import rejudge
from soak.prove.live import ProofTracker
from soak.prove.sprt import ProofState, plan
from soak.report.rundir import load_run
from soak.store.rundir import RunDir
from soak.store.summary import REQUEST_TYPES

START = 1_800_000_000.0
PLAN = plan(broken_mtbf_s=8.0, target_mtbf_s=80.0)  # accepts after about 26 clean seconds
OFF = {name: {"enabled": False} for name in
       ("error_rate", "no_success", "work_evidence", "work_rate", "server_work", "wrong_model")}

# each life: seconds of work before its hang (None: it works to the end), onset to
# detection as a share of the horizon, seconds to restart
lives = st.lists(st.tuples(st.one_of(st.none(), st.floats(0.5, 40.0)), st.floats(0.0, 1.0), st.floats(0.5, 5.0)),
                 min_size=1, max_size=4)


def _request(n: int, end: float) -> dict:
    return {"request_id": f"r{n:06d}", "session": "s", "turn": n, "started_at": end - 0.5, "ended_at": end,
            "started_mono": end - 0.5 - START, "ended_mono": end - START, "outcome": "ok", "ttft_s": 0.1,
            "output_tokens": 10, "prompt_tokens": 10, "http_status": 200, "warmup": False, "model": "m"}


def _truth(life_list, *, period: float, horizon: float, planned: float):
    """What happens, whether or not the run is still there to record it: the
    requests and the hang, detection and restart events, in time order."""
    happenings, t, n = [], START, 0
    for work_s, late, restart in life_list:
        until = START + planned if work_s is None else min(t + work_s, START + planned)
        at = t + period
        while at <= until:
            happenings.append((at, "request", _request(n, at)))
            n, at = n + 1, at + period
        if work_s is None or t + work_s >= START + planned:
            break
        onset = t + work_s
        detected = onset + late * horizon
        happenings.append((detected, "event", {"type": "incident_started", "ts": detected}))
        happenings.append((detected, "event", {"type": "incident", "ts": detected, "onset_at": onset,
                                               "detected_at": detected, "kind": "hang", "rule": "pp_tail_stall"}))
        t = detected + restart
        happenings.append((t, "event", {"type": "restart_done", "ts": t}))
    happenings.sort(key=lambda h: h[0])
    return happenings


def _run(tmp: Path, life_list, *, period: float, horizon: float, tick: float, planned: float, stop_at: bool):
    """The run as the loop lives it (live tracker, ticked) and as it records it."""
    tracker = ProofTracker(PLAN, horizon_s=horizon, fed_requests=True)  # as soak.run.proving.ProofSink
    head = [{"type": "run_started", "ts": START, "run_id": "p", "name": "p", "target": "simulator", "model": "m",
             "duration_s": planned},
            {"type": "criteria_config", "ts": START, "criteria": OFF},
            {"type": "prove_plan", "ts": START, "plan": PLAN.to_json(), "stop_at_decision": stop_at,
             "horizon_s": horizon},
            {"type": "load_started", "ts": START}]
    events, requests = list(head), []
    for e in head:
        tracker.on_event(e["type"], e)
    happenings = _truth(life_list, period=period, horizon=horizon, planned=planned)
    fed, now, stop = 0, START, START + planned
    while now < START + planned:
        now = min(now + tick, START + planned)
        while fed < len(happenings) and happenings[fed][0] <= now:
            _, what, item = happenings[fed]
            if what == "request":
                requests.append(item)
                tracker.on_request(item)
            else:
                events.append(item)
                tracker.on_event(item["type"], item)
            fed += 1
        if stop_at and tracker.at(now).state is not ProofState.UNDECIDED:
            stop = now
            break
    stopped = {"type": "load_stopped", "ts": stop}
    events.append(stopped)
    tracker.on_event("load_stopped", stopped)
    live = tracker.at(stop)
    hangs = sum(1 for e in events if e["type"] == "incident")
    events.append({"type": "run_ended", "ts": stop + 0.1, "verdict": "fail" if hangs else "pass", "exit_code": 0,
                   "reason": "duration", "incidents": hangs, "problem": None, "interrupted": False,
                   "harness_fault": None, "failed_live": bool(hangs)})
    tmp.mkdir(parents=True)
    with open(tmp / "events.jsonl", "w") as f:
        for e in events:
            f.write(json.dumps({**e, "mono": e["ts"] - START}) + "\n")
    with open(tmp / "requests.jsonl", "w") as f:
        for r in requests:
            f.write(json.dumps(r) + "\n")
    (tmp / "config.yaml").write_text("name: p\nbuild: candidate\n")
    return live


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(life_list=[(None, 0.0, 1.0)], period=0.5, horizon=6.0, tick=0.5, planned=29.0, stop_at=False)
@example(life_list=[(None, 0.0, 1.0)], period=0.5, horizon=6.0, tick=0.5, planned=120.0, stop_at=True)
@example(life_list=[(20.0, 0.9, 1.0), (None, 0.0, 1.0)], period=0.5, horizon=6.0, tick=0.5, planned=60.0,
         stop_at=True)
@given(life_list=lives, period=st.floats(0.2, 3.0), horizon=st.floats(0.0, 12.0), tick=st.floats(0.2, 2.0),
       planned=st.floats(5.0, 90.0), stop_at=st.booleans())
def test_the_live_the_end_the_report_history_and_bisect_decide_the_same(tmp_path_factory, life_list, period,
                                                                          horizon, tick, planned, stop_at):
    run_dir = tmp_path_factory.mktemp("runs") / "segment-000-build-0"
    live = _run(run_dir, life_list, period=period, horizon=horizon, tick=tick, planned=planned, stop_at=stop_at)

    judgement, summary = rejudge(run_dir)  # the end's judge, and soak report's
    (run_dir / "summary.json").write_text(json.dumps(summary.to_json()))
    proof = summary.proof
    assert proof is not None
    # The end never accepts what the run could not yet know clean (its last horizon).
    assert proof["decision"] == live.state.value, (proof["sentence"], live.sentence)
    assert proof["hangs"] == live.hangs
    if live.state is not ProofState.UNDECIDED:
        assert abs(proof["exposure_s"] - live.exposure_s) < 1e-6
    at_risk = summary.time_at_risk_s
    assert at_risk is not None and proof["path"]["exposure_s"] == at_risk
    again, _ = rejudge(run_dir)  # soak report on the recorded run: the same decision
    assert again.proof == judgement.proof

    data = load_run(run_dir)
    night = run_record(path=str(run_dir), summary=data.summary, events=data.events, config=data.config,
                       records=RunDir(run_dir).requests(fields=REQUEST_TYPES))
    assert abs(sum(i.length_s for i in night.intervals) - at_risk) < 1e-6
    history = prove_build(PLAN, [night], night.build)
    assert history.state.value == proof["decision"] or (
        # history walks the nights' known-clean path; an accept or a reject it reads is the end's
        proof["decision"] == "undecided" and history.state is ProofState.UNDECIDED)
    assert history.hangs == proof["hangs"]

    segment = read_segment(run_dir, build=0)
    assert abs(segment.exposure_s - at_risk) < 1e-6 and segment.hangs == summary.hangs_at_risk


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(life_list=lives, period=st.floats(0.2, 3.0), horizon=st.floats(0.0, 12.0), planned=st.floats(30.0, 90.0),
       broken=st.sampled_from(["crash", "failed request", "corruption"]), when=st.floats(0.0, 1.0))
def test_a_night_that_failed_otherwise_is_never_called_fixed(tmp_path_factory, life_list, period, horizon, planned,
                                                             broken, when):
    """Whatever its hangs and clean time: a crash, a corruption or a failed criterion
    (here the error rate, from one failed request) and the end never accepts, and
    says why; no clean time counts past the failure."""
    run_dir = tmp_path_factory.mktemp("runs") / "night"
    _run(run_dir, life_list, period=period, horizon=horizon, tick=1.0, planned=planned, stop_at=False)
    at = START + when * planned
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    if broken == "failed request":
        with open(run_dir / "requests.jsonl", "a") as f:
            f.write(json.dumps({**_request(99_999, at), "outcome": "http_error", "http_status": 500,
                                "output_tokens": 0, "ttft_s": None}) + "\n")
        for e in events:
            if e["type"] == "criteria_config":
                e["criteria"] = {**OFF, "error_rate": {"enabled": True, "max": 0.0, "min_requests": 1}}
    else:
        events.insert(-2, {"type": "incident", "ts": at, "mono": at - START, "onset_at": at, "detected_at": at,
                           "kind": broken, "rule": "server_gone" if broken == "crash" else "corruption"})
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    _, summary = rejudge(run_dir)
    assert summary.proof is not None and summary.proof["decision"] != "accepted", summary.proof["sentence"]
    assert summary.raw["at_risk"]["withheld"]
    (run_dir / "summary.json").write_text(json.dumps(summary.to_json()))
    data = load_run(run_dir)
    night = run_record(path=str(run_dir), summary=data.summary, events=data.events, config=data.config)
    assert night.withheld and prove_build(PLAN, [night], night.build).state is not ProofState.ACCEPTED
    stop = max(e["ts"] for e in events if e["type"] == "load_stopped")
    assert all(i.start + i.length_s <= max(at, START) + 1e-6 or i.hang
               for i in at_risk(events, summary).intervals if i.start < stop)
