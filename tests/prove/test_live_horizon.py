"""A live accept waits out the detection horizon (soak/prove/live.py): a hang is
recorded only once the detector decides it, so an accept reached while a hang is
under way but undetected must not stand, or a run that stops at the decision
calls a broken build fixed and never records the hang."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from soak.config import RunConfig
from soak.exposure import intervals_of
from soak.prove.live import ProofTracker, proof_of
from soak.prove.sprt import ProofState, plan
from soak.run.proving import detection_horizon_s

SETTINGS = settings(max_examples=100, deadline=None)
START = 1_000.0
ISSUE = plan(broken_mtbf_s=1200.0, target_mtbf_s=12000.0)  # accepts after 65.4 clean minutes

plans = st.builds(lambda broken, ratio, alpha, beta, cap: plan(broken_mtbf_s=broken, ratio=ratio, alpha=alpha,
                                                               beta=beta, max_exposure_s=cap),
                  st.floats(5.0, 600.0), st.floats(1.5, 50.0), st.sampled_from([0.01, 0.05, 0.2]),
                  st.sampled_from([0.01, 0.05, 0.2]), st.one_of(st.none(), st.floats(50.0, 5_000.0)))
# each life: (time at risk until its hang as a fraction of the clean accept time, so that hangs fall
# about the accept line; onset to detection as a fraction of the horizon; seconds to restart)
lives = st.lists(st.tuples(st.floats(0.001, 1.5), st.floats(0.0, 1.0), st.floats(0.1, 120.0)), max_size=5)


def _events(p, life_list, horizon_s: float) -> list[dict]:
    """A run whose target hangs at the end of each life and restarts, every hang
    detected within the horizon; incidents carry their onset."""
    t = START
    out = [{"type": "run_started", "ts": t}, {"type": "load_started", "ts": t}]
    for at_risk, late, restart in life_list:
        onset = t + at_risk * p.accept_at_s(0)
        detected = onset + late * horizon_s
        out.append({"type": "incident", "ts": detected, "onset_at": onset, "detected_at": detected, "kind": "hang"})
        t = detected + restart
        out.append({"type": "restart_done", "ts": t})
    return out


def _judged(p, events: list[dict], at: float) -> tuple[ProofState, int]:
    d = proof_of(p, intervals_of([*events, {"type": "load_stopped", "ts": at}], {}))[0]
    return d.state, d.hangs


@SETTINGS
@example(ISSUE, [(0.985, 0.5, 30.0)], 301.5, 10.0)  # the reviewer's: begun a minute before the line, found after
@given(plans, lives, st.floats(1.0, 600.0), st.floats(0.5, 30.0))
def test_a_live_decision_is_what_the_judge_and_the_truth_say_when_the_run_stops_there(p, life_list, horizon_s,
                                                                                        tick_s) -> None:
    """Ticked like the run loop, stopping at the first final decision: the judge's
    walk over what was recorded by then, and the walk over every hang that had
    begun by then (recorded or not), say the same thing."""
    events = _events(p, life_list, horizon_s)
    tracker = ProofTracker(p, horizon_s=horizon_s)
    fed, now = 0, START
    end = max(e["ts"] for e in events) + 2 * horizon_s + 20_000.0
    while now < end:
        now += tick_s
        while fed < len(events) and events[fed]["ts"] <= now:
            tracker.on_event(events[fed]["type"], events[fed])
            fed += 1
        live = tracker.at(now)
        if live.state is not ProofState.UNDECIDED:
            break
    else:
        return  # never decided within the run: nothing to disagree with
    recorded = events[:fed]
    begun = [e for e in events if e["type"] != "incident" or e["onset_at"] <= now]
    begun = [e for e in begun if e["ts"] <= now or e["type"] == "incident"]
    assert _judged(p, recorded, now) == (live.state, live.hangs)
    assert _judged(p, begun, now) == (live.state, live.hangs)


def test_an_accept_during_an_undetected_hang_waits_for_the_detector() -> None:
    """The reviewer's case: the issue's plan, a hang begun at minute 64 and detected
    at 66.5; at 65.5 minutes the accept line (65.4) is behind, yet the run says
    not yet, and once the hang is in it is where the judge puts it."""
    tracker = ProofTracker(ISSUE, horizon_s=301.5)
    for e in ({"type": "run_started", "ts": START}, {"type": "load_started", "ts": START}):
        tracker.on_event(e["type"], e)
    waiting = tracker.at(START + 65.5 * 60)
    assert waiting.state is ProofState.UNDECIDED
    assert waiting.sentence == ("5.0 more clean minutes to accept: the line was reached at minute 65.4, "
                                "and a hang that began before it can take 5.0 minutes to be detected")
    hang = {"type": "incident", "ts": START + 66.5 * 60, "onset_at": START + 64 * 60,
            "detected_at": START + 66.5 * 60, "kind": "hang"}
    tracker.on_event("incident", hang)
    after = tracker.at(START + 67 * 60)
    assert after.state is ProofState.UNDECIDED and after.hangs == 1
    clean = ProofTracker(ISSUE, horizon_s=301.5)
    for e in ({"type": "run_started", "ts": START}, {"type": "load_started", "ts": START}):
        clean.on_event(e["type"], e)
    assert clean.at(START + 70 * 60).state is ProofState.UNDECIDED
    final = clean.at(START + 70.5 * 60)  # 65.4 min + 5.0 min of horizon: final, at the accept line
    assert final.state is ProofState.ACCEPTED and final.sentence == "fixed (α 5%, β 5%) after 65.4 clean minutes"


def test_a_reject_is_final_at_the_recorded_hang() -> None:
    p = plan(broken_mtbf_s=600.0, ratio=100)  # one hang within a few minutes rejects
    tracker = ProofTracker(p, horizon_s=600.0)
    for e in ({"type": "run_started", "ts": START}, {"type": "load_started", "ts": START},
              {"type": "incident", "ts": START + 70, "onset_at": START + 60, "detected_at": START + 70,
               "kind": "hang"}):
        tracker.on_event(e["type"], e)
    assert tracker.at(START + 70).state is ProofState.REJECTED


def test_the_horizon_is_the_slowest_hang_rule_plus_a_sample() -> None:
    """Defaults: generation_frozen's start-up grace, client_stall's ceiling and the
    log rule's execute-model timeout are 300 s; the slowest probe of the hang rules
    (metrics) 1 s, a detector tick 0.5 s. Switched off, a rule no longer counts."""
    config = RunConfig()
    assert detection_horizon_s(config.detector, config.probes) == 301.5
    quick = RunConfig.model_validate({"detector": {
        "generation_frozen": {"enabled": False}, "client_stall": {"floor": "10s", "ceiling": "20s"},
        "log_signature": {"execute_model_timeout": "30s"}}})
    assert detection_horizon_s(quick.detector, quick.probes) == 31.5


def test_the_wait_for_a_final_accept_counts_down_from_the_start_of_the_run():
    # The accept line at 13.9 s with a 301.5-s horizon: 3 minutes in, 135.4 s are left, not 13.9.
    p = plan(broken_mtbf_s=1.3, target_mtbf_s=13.0)
    accept = p.accept_at_s(0)
    tracker = ProofTracker(p, horizon_s=301.5)
    tracker.on_event("load_started", {"type": "load_started", "ts": 1000.0, "mono": 0.0})
    for elapsed in (60.0, 180.0, 300.0):
        d = tracker.at(1000.0 + elapsed)
        assert d.state is ProofState.UNDECIDED
        assert abs(d.needed.clean_s - (accept + 301.5 - elapsed)) < 0.6, (elapsed, d.needed)
        assert f"{d.needed.clean_s:.0f}" != f"{accept:.0f}"
    assert tracker.at(1000.0 + accept + 302.5).state is ProofState.ACCEPTED
