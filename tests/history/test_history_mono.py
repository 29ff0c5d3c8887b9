"""History pools exposure on the monotonic clock: generated nights with hangs,
restarts and wall-clock steps anywhere; each time-to-hang interval is the
monotonic time from the start of load (or a restart) to the hang's onset, and
the night's exposure their sum, whatever the wall labels say."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.clock import ManualClock
from soak.history.model import intervals_of

step = st.one_of(st.just(0.0), st.floats(min_value=-7200, max_value=7200))
segment = st.tuples(st.floats(min_value=0.5, max_value=3000), st.floats(min_value=0.1, max_value=60),
                    st.floats(min_value=1, max_value=120), step, step)


@settings(max_examples=100, deadline=None)
@given(st.lists(segment, min_size=0, max_size=5), st.floats(min_value=0.5, max_value=3000), step)
def test_exposure_is_monotonic_time_at_risk(hangs, tail, last_step) -> None:
    """Each hang: ``at_risk`` s of load, then the onset, detected ``lag`` s later,
    the restart ``recover`` s after that; the wall clock steps inside both spans."""
    clock = ManualClock(1_800_000_000.0)
    events: list[dict] = []

    def event(type_: str, **fields) -> None:
        events.append({"ts": clock.now(), "mono": clock.monotonic(), "type": type_, **fields})

    event("run_started")
    event("load_started")
    expected = []
    for number, (at_risk, lag, recover, step_a, step_b) in enumerate(hangs, 1):
        clock.advance(at_risk)
        clock.step_wall(step_a)  # before the onset: the onset's label and its event's ts moved together
        onset = clock.now()
        clock.advance(lag)
        event("incident", number=number, kind="hang", onset_at=onset, detected_at=clock.now())
        clock.advance(recover)
        clock.step_wall(step_b)
        event("restart_done", number=number)
        expected.append((at_risk, True))
    clock.advance(tail)
    clock.step_wall(last_step)
    event("load_stopped")
    summary = {"started_at": events[0]["ts"], "ended_at": clock.now(), "cut_off": False}
    got = intervals_of(events, summary)
    expected.append((tail, False))
    assert [(pytest.approx(i.length_s, abs=1e-6), i.hang) for i in got] == expected
    assert sum(i.length_s for i in got) == pytest.approx(sum(t for t, _ in expected), abs=1e-5)


def test_a_run_with_no_events_counts_the_summarys_loaded_seconds() -> None:
    """Never ended_at - started_at (which holds the start-up, and once held a wall step)."""
    summary = {"started_at": 1000.0, "ended_at": 1000.0 + 3625.0, "duration_s": 25.0, "cut_off": False}
    (interval,) = intervals_of([], summary)
    assert interval.length_s == 25.0 and not interval.hang
