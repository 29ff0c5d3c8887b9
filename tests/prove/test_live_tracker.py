"""The live tracker (soak/prove/live.py): fed a run's events as they happen, it
says what sprt says of the same exposure and hangs, counts exposure as
soak.exposure does (no time between a hang's onset and the restart), and keeps
a decision once made."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.events import EventType
from soak.prove.live import ProofTracker, exposure_path
from soak.prove.sprt import ProofState, decide, plan, walk
from soak.exposure import Interval

SETTINGS = settings(max_examples=100, deadline=None)
START = 1_000.0  # the run's first label

plans = st.builds(lambda broken, ratio, alpha, beta: plan(broken_mtbf_s=broken, ratio=ratio, alpha=alpha, beta=beta),
                  st.floats(5.0, 600.0), st.floats(1.5, 50.0), st.sampled_from([0.01, 0.05, 0.1, 0.2]),
                  st.sampled_from([0.01, 0.05, 0.1, 0.2]))
# each life: (seconds at risk until its hang, seconds from onset to detection, seconds to restart)
lives = st.lists(st.tuples(st.floats(0.5, 3_000.0), st.floats(0.1, 60.0), st.floats(0.1, 120.0)), max_size=5)


def feed(tracker: ProofTracker, life_list, tail_s: float) -> tuple[float, list[float], float]:
    """The events of a run whose target hangs at the end of each life and restarts;
    (now, the hangs' cumulative exposure, total exposure)."""
    t = START
    tracker.on_event(EventType.RUN_STARTED, {"ts": t})
    tracker.on_event(EventType.DECISION, {"ts": t})  # not time at risk: ignored
    tracker.on_event(EventType.LOAD_STARTED, {"ts": t})
    marks, total = [], 0.0
    for at_risk, detect, restart in life_list:
        onset = t + at_risk
        total += at_risk
        marks.append(total)
        tracker.on_event(EventType.INCIDENT, {"ts": onset + detect, "onset_at": onset, "detected_at": onset + detect,
                                              "kind": "hang"})
        t = onset + detect + restart
        tracker.on_event(EventType.RESTART_DONE, {"ts": t})
    return t + tail_s, marks, total + tail_s


@SETTINGS
@given(plans, lives, st.floats(0.0, 5_000.0))
def test_the_tracker_says_what_sprt_says_of_the_same_path(p, life_list, tail_s) -> None:
    tracker = ProofTracker(p, horizon_s=0.0)
    now, marks, total = feed(tracker, life_list, tail_s)
    got = tracker.at(now)
    want = walk(p, hang_exposures_s=marks, exposure_s=total)
    # labels are differences of run times here: equal up to rounding, a tie on a line either way
    near = {walk(p, hang_exposures_s=[m * f for m in marks], exposure_s=total * f).state for f in (1 - 1e-9, 1 + 1e-9)}
    assert got.state is want.state or got.state in near
    assert got.hangs == want.hangs and got.exposure_s == pytest.approx(want.exposure_s, rel=1e-9, abs=1e-9)
    if got.state is ProofState.UNDECIDED:
        # nothing crossed on the way: where it stands is decide's answer at that point
        there = decide(p, exposure_s=got.exposure_s, hangs=got.hangs)
        assert there.state is ProofState.UNDECIDED and there.sentence == got.sentence
        assert got.exposure_s == pytest.approx(total) and got.hangs == len(marks)


@SETTINGS
@given(plans, st.lists(st.floats(0.0, 20_000.0), min_size=1, max_size=12))
def test_a_decision_once_made_stays(p, nows) -> None:
    tracker = ProofTracker(p, horizon_s=0.0)
    tracker.on_event(EventType.RUN_STARTED, {"ts": START})
    tracker.on_event(EventType.LOAD_STARTED, {"ts": START})
    first = None
    for now in sorted(nows):
        d = tracker.at(START + now)
        if first is not None:
            assert d == first
        elif d.state is not ProofState.UNDECIDED:
            first = d
            assert d.state is ProofState.ACCEPTED and d.exposure_s == pytest.approx(p.accept_at_s(0))


def test_the_issue_plan_live() -> None:
    # θ1 20 min, θ0 200 min, α = β = 5%: after 24 clean minutes 41 more are needed;
    # at 65.4 minutes the test accepts, and the run's later hang changes nothing.
    p = plan(broken_mtbf_s=1200.0, target_mtbf_s=12000.0)
    tracker = ProofTracker(p, horizon_s=0.0)
    tracker.on_event(EventType.RUN_STARTED, {"ts": START})
    tracker.on_event(EventType.LOAD_STARTED, {"ts": START})
    assert tracker.at(START + 24 * 60).sentence == "41 more clean minutes to accept; 2 hangs before minute 37 reject"
    assert tracker.at(START + 66 * 60).sentence == "fixed (α 5%, β 5%) after 65.4 clean minutes"
    tracker.on_event(EventType.INCIDENT, {"ts": START + 70 * 60, "onset_at": START + 69 * 60, "kind": "hang"})
    assert tracker.at(START + 71 * 60).state is ProofState.ACCEPTED


def test_time_after_a_hang_counts_only_from_the_restart_and_a_crash_is_no_hang() -> None:
    p = plan(broken_mtbf_s=1200.0, target_mtbf_s=12000.0)
    tracker = ProofTracker(p, horizon_s=0.0)
    tracker.on_event(EventType.RUN_STARTED, {"ts": START})
    tracker.on_event(EventType.LOAD_STARTED, {"ts": START})
    tracker.on_event(EventType.INCIDENT, {"ts": START + 700, "onset_at": START + 600, "kind": "crash"})
    assert tracker.at(START + 900).exposure_s == pytest.approx(600)  # waiting for a restart: not at risk
    tracker.on_event(EventType.RESTART_DONE, {"ts": START + 1000})
    d = tracker.at(START + 1300)
    assert d.exposure_s == pytest.approx(900) and d.hangs == 0
    tracker.on_event(EventType.LOAD_STOPPED, {"ts": START + 1400})
    assert tracker.at(START + 9_999).exposure_s == pytest.approx(1000)  # the load stopped: no more exposure


def test_exposure_path_lays_intervals_end_to_end() -> None:
    intervals = [Interval(0, 10.0, True, "hang"), Interval(50, 5.0, False, "crash"), Interval(70, 7.0, True, "hang")]
    assert exposure_path(intervals) == ((10.0, 22.0), 22.0)
