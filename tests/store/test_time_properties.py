"""Time is monotonic (CONTRACTS.md): generated runs whose wall clock steps any
way, any number of times. Durations, rates and exposure equal the monotonic
deltas; ``ended_at >= started_at``; every step beyond the tolerance is reported
once, with its size; history pools the same exposure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soak.clock import WALL_STEP_TOLERANCE_S, ManualClock, RunClock, WallStepWatch, raw_wall, wall_step
from soak.history.model import intervals_of
from soak.samples import RequestRecord
from soak.store.store import RunStore
from soak.judge import summarize
from soak.judge.figures import run_span

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# (monotonic seconds that pass, wall step right after): steps are 0 or past the tolerance
steps = st.one_of(st.just(0.0), st.floats(min_value=WALL_STEP_TOLERANCE_S + 0.5, max_value=7200.0),
                  st.floats(min_value=-7200.0, max_value=-(WALL_STEP_TOLERANCE_S + 0.5)))
timeline = st.lists(st.tuples(st.floats(min_value=0.0, max_value=600.0), steps), min_size=1, max_size=25)


@SETTINGS
@given(timeline)
def test_each_step_is_reported_once_with_its_size(ops) -> None:
    clock = ManualClock(1_800_000_000.0)
    watch = WallStepWatch()
    assert watch.observe(clock.now(), clock.monotonic()) is None
    seen = []
    for advance, step in ops:
        clock.advance(advance)
        clock.step_wall(step)
        found = watch.observe(clock.now(), clock.monotonic())
        if found is not None:
            seen.append(found.step_s)
    assert seen == pytest.approx([s for _, s in ops if s != 0.0])


@SETTINGS
@given(st.floats(min_value=-1e6, max_value=1e6), st.floats(min_value=0.0, max_value=1e5),
       st.floats(min_value=-0.99 * WALL_STEP_TOLERANCE_S, max_value=0.99 * WALL_STEP_TOLERANCE_S))
def test_agreeing_clocks_are_no_step(wall0, elapsed, jitter) -> None:
    # 1% short of the tolerance: at its edge the float sums decide either way.
    assert wall_step((wall0, 5.0), (wall0 + elapsed + jitter, 5.0 + elapsed)) is None


@SETTINGS
@given(timeline)
def test_run_clock_labels_move_only_with_the_monotonic_clock(ops) -> None:
    base = ManualClock(1_800_000_000.0)
    clock = RunClock(base)
    start = clock.now()
    for advance, step in ops:
        before = clock.now()
        base.advance(advance)
        base.step_wall(step)
        assert clock.now() - before == pytest.approx(advance, abs=1e-5)
        assert raw_wall(clock) == base.now()
    assert clock.now() - start == pytest.approx(clock.elapsed(), abs=1e-5)


def _write(path: Path, lines: list[dict]) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")


def _recorded_run(run_dir: Path, ops, *, warmup_s: float = 0.0, cut_off: bool = False) -> tuple[float, float]:
    """A run directory as a writer with a stepping wall clock leaves it: ``ts``
    the raw wall clock, ``mono`` the monotonic. Returns (loaded seconds, whole run)."""
    clock = ManualClock(1_800_000_000.0)
    events: list[dict] = []
    requests: list[dict] = []

    def event(kind: str, **fields) -> None:
        events.append({"ts": clock.now(), "type": kind, "mono": clock.monotonic(), **fields})

    event("run_started", run_id="p", warmup_s=warmup_s, duration_s=60.0)
    clock.advance(1.0)
    event("load_started")
    load_from = clock.monotonic()
    for i, (advance, step) in enumerate(ops):
        started_wall, started_mono = clock.now(), clock.monotonic()
        clock.advance(advance)
        requests.append(RequestRecord(
            request_id=f"r{i}", session=None, turn=None, started_at=started_wall, ended_at=started_wall + advance,
            outcome="ok", prompt_tokens=10, output_tokens=5, ttft_s=advance / 2, started_mono=started_mono,
            ended_mono=clock.monotonic()).to_json())
        clock.step_wall(step)
        if step:
            event("wall_clock_step", step_s=step)
    load_to = clock.monotonic()
    if not cut_off:
        event("load_stopped")
        clock.advance(0.5)
        event("run_ended", verdict="pass", reason="duration", exit_code=0)
    run_dir.mkdir(parents=True, exist_ok=True)
    _write(run_dir / "events.jsonl", events)
    _write(run_dir / "requests.jsonl", requests)
    return load_to - load_from, clock.monotonic()


@SETTINGS
@given(timeline, st.booleans())
def test_summary_and_history_measure_on_the_monotonic_clock(tmp_path_factory, ops, cut_off) -> None:
    run_dir = tmp_path_factory.mktemp("run")
    loaded, whole = _recorded_run(run_dir, ops, cut_off=cut_off)
    summary = summarize(run_dir)
    assert summary["duration_s"] == pytest.approx(loaded, abs=1e-6)
    assert summary["ended_at"] >= summary["started_at"]
    assert summary["ended_at"] - summary["started_at"] == pytest.approx(whole, abs=1e-6)
    generated = 5 * len(ops)
    tps = summary["throughput"]["generated_tokens_per_s"]
    assert tps == (pytest.approx(generated / loaded) if loaded > 0 else None)
    assert [s["step_s"] for s in summary["clock"]["wall_steps"]] == [s for _, s in ops if s][:20]
    assert summary["clock"]["basis"] == "monotonic"
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    exposure = sum(i.length_s for i in intervals_of(events, summary))
    assert exposure == pytest.approx(loaded, abs=1e-6)


@SETTINGS
@given(st.lists(st.tuples(st.floats(min_value=0.0, max_value=100.0), steps), min_size=1, max_size=8))
def test_the_run_store_writes_mono_that_ignores_wall_steps(tmp_path_factory, ops) -> None:
    """The store's own clock: events with and without a given ts, samples, all on the monotonic line."""
    base = ManualClock(1_800_000_000.0)
    clock = RunClock(base)
    store = RunStore(tmp_path_factory.mktemp("run"), clock=clock)
    store.event("run_started", run_id="s")
    for advance, step in ops:
        base.advance(advance)
        base.step_wall(step)
        store.event("tick", expect=clock.elapsed())
        store.event("given", ts=clock.now(), expect=clock.elapsed())
    store.close()
    for line in (store.run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if "expect" in event:
            assert event["mono"] == pytest.approx(event["expect"], abs=1e-5)


def test_a_run_recorded_before_mono_is_read_from_ts(tmp_path) -> None:
    _write(tmp_path / "events.jsonl", [{"ts": 100.0, "type": "run_started"}, {"ts": 101.0, "type": "load_started"},
                                       {"ts": 121.0, "type": "load_stopped"},
                                       {"ts": 122.0, "type": "run_ended", "verdict": "pass"}])
    summary = summarize(tmp_path)
    assert summary["duration_s"] == 20.0 and summary["ended_at"] == 122.0
    assert summary["clock"]["basis"] == "wall"


@SETTINGS
@given(st.floats(min_value=0, max_value=1e4), st.floats(min_value=-1e4, max_value=1e4),
       st.floats(min_value=0, max_value=1e4))
def test_run_span_labels_are_the_start_plus_monotonic_time(elapsed, wall_offset, later) -> None:
    """Whatever the labels say, lengths and the end label come from mono."""
    span = run_span(started=(1000.0, 0.0), first_request=(None, None), load_started=(1000.0 + wall_offset, 1.0),
                    load_stopped=(5.0, 1.0 + elapsed), ended=(-7.0, 1.0 + elapsed + later),
                    last_request_end=(None, None), last=(None, None), cut_off=False)
    assert span.duration_s == pytest.approx(elapsed)
    assert span.ended_at == pytest.approx(1000.0 + 1.0 + elapsed + later)
