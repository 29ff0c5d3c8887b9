"""Time at risk is evidenced time on the monotonic line (soak.exposure.intervals_of,
docs/invariants.md sections 1 and 2): a server life that did no work has none; a
wall label on an event without ``mono`` never stretches a night past the
monotonic load the summary measured; an onset recorded past the night's end
lengthens nothing. And a steady working night keeps its whole span."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from soak.cli import main as soak_main
from soak.exposure import intervals_of
from soak.prove.live import ProofTracker
from soak.prove.sprt import plan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "history"
T0 = 1_800_000_000.0

# A request record that is no evidence of work (criteria.rules.generated_tokens == 0).
idle = st.fixed_dictionaries({
    "outcome": st.sampled_from(["ok", "error", "timeout", "aborted"]),
    "output_tokens": st.one_of(st.just(0), st.integers(1, 500), st.just(True), st.just(3.0)),
    "ttft_s": st.one_of(st.none(), st.floats(0.01, 5)),
}).filter(lambda r: r["outcome"] != "ok" or r["ttft_s"] is None or type(r["output_tokens"]) is not int
          or r["output_tokens"] <= 0)


def _night(load_s: float, restarts: list[tuple[float, float]]) -> list[dict]:
    """run_started, load_started, a crash (censored) and restart per entry, load_stopped."""
    ev = [{"ts": T0, "mono": 1.0, "type": "run_started"}, {"ts": T0 + 1, "mono": 2.0, "type": "load_started"}]
    t = 2.0
    for n, (run_s, down_s) in enumerate(restarts, 1):
        t += run_s
        ev.append({"ts": T0 + t - 1 + 0.5, "mono": t + 0.5, "type": "incident", "kind": "crash", "number": n,
                   "onset_at": T0 + t - 1})
        t += down_s
        ev.append({"ts": T0 + t - 1, "mono": t, "type": "restart_done", "number": n})
    t += load_s
    ev.append({"ts": T0 + t - 1, "mono": t, "type": "load_stopped"})
    return ev


@settings(max_examples=60, deadline=None)
@given(st.floats(1, 5000), st.lists(st.tuples(st.floats(0.5, 900), st.floats(0.1, 60)), max_size=3),
       st.lists(st.tuples(st.floats(0, 1), idle), max_size=30))
def test_a_night_with_no_productive_request_has_no_time_at_risk(load_s, restarts, records) -> None:
    events = _night(load_s, restarts)
    span = events[-1]["mono"] - 2.0
    reqs = [{**r, "ended_mono": 2.0 + f * span, "ended_at": T0 + 1 + f * span} for f, r in records]
    assert intervals_of(events, {}, reqs) == ()
    assert sum(i.length_s for i in intervals_of(events, {})) == pytest.approx(span - sum(d for _, d in restarts))


@settings(max_examples=60, deadline=None)
@given(st.floats(30, 5000), st.floats(0.2, 20), st.floats(0, 1))
def test_a_steady_working_night_keeps_its_whole_span(load_s, every, phase) -> None:
    events = _night(load_s, [])
    ends = [2.0 + every * (k + phase) for k in range(int(load_s / every) + 2) if every * (k + phase) <= load_s]
    reqs = [{"outcome": "ok", "ttft_s": 0.1, "output_tokens": 10, "ended_mono": m, "ended_at": T0 + m - 1}
            for m in ends if m > 2.0]
    # Steady means a cadence was shown: two answers at least (one answer alone shows
    # no wait between two, and its tail may be longer than the wait before it).
    assume(len(reqs) >= 2)
    assert [i.length_s for i in intervals_of(events, {}, reqs)] == [i.length_s for i in intervals_of(events, {})]


@settings(max_examples=60, deadline=None)
@given(st.floats(5, 3000), st.floats(0.1, 2), st.floats(60, 30000))
def test_work_that_stopped_early_ends_the_time_at_risk_there(worked_s, every, idle_s) -> None:
    """Answers with tokens for ``worked_s``, then only empty answers for far longer."""
    events = _night(worked_s + idle_s, [])
    good = [{"outcome": "ok", "ttft_s": 0.1, "output_tokens": 5, "ended_mono": 2.0 + every * k}
            for k in range(1, int(worked_s / every) + 1)]
    empty = [{"outcome": "ok", "ttft_s": None, "output_tokens": 0, "ended_mono": 2.0 + worked_s + k}
             for k in range(1, int(idle_s), 7)]
    (interval,) = intervals_of(events, {}, good + empty)
    assert interval.length_s == pytest.approx(every * int(worked_s / every))
    assert interval.length_s <= worked_s + 1e-9


def test_a_hangs_interval_stays_whole_without_work() -> None:
    events = [{"ts": T0, "mono": 0.0, "type": "run_started"}, {"ts": T0, "mono": 0.0, "type": "load_started"},
              {"ts": T0 + 50, "mono": 50.0, "type": "incident", "kind": "hang", "onset_at": T0 + 40},
              {"ts": T0 + 60, "mono": 60.0, "type": "load_stopped"}]
    (hang,) = intervals_of(events, {}, [])
    assert hang.hang and hang.length_s == pytest.approx(40)


@settings(max_examples=100, deadline=None)
@given(st.floats(1, 3600), st.lists(st.tuples(st.booleans(), st.floats(-7200, 7200)), min_size=4, max_size=4),
       st.floats(0, 7200))
def test_wall_labels_never_stretch_a_night_past_its_monotonic_load(load_s, marks, lead) -> None:
    """Any event may lack ``mono`` (run_started too) and carry any wall label; the
    night is never longer than its monotonic load (the summary's duration_s), and
    where load_started and load_stopped kept ``mono`` it is exactly that."""
    events = [{"ts": T0, "mono": 1.0, "type": "run_started"}, {"ts": T0 + lead, "mono": 1.0 + lead, "type": "build"},
              {"ts": T0 + 2, "mono": 3.0, "type": "load_started"},
              {"ts": T0 + 2 + load_s, "mono": 3.0 + load_s, "type": "load_stopped"}]
    for event, (drop, step) in zip(events, marks):
        if drop and event["type"] not in ("load_started", "load_stopped"):
            event.pop("mono")
        event["ts"] += step if event["type"] not in ("load_started", "load_stopped") else 0.0
    stretched = [dict(e) for e in events]
    stretched[-1].pop("mono")
    stretched[-1]["ts"] += abs(marks[-1][1])
    summary = {"started_at": T0, "ended_at": T0 + 3 + load_s, "duration_s": load_s, "cut_off": False}
    got = sum(i.length_s for i in intervals_of(events, summary))
    assert got == pytest.approx(load_s)
    assert sum(i.length_s for i in intervals_of(stretched, summary)) <= load_s + 1e-6


def test_run_started_without_mono_does_not_switch_the_night_to_wall_time() -> None:
    events = [{"ts": T0, "type": "run_started"}, {"ts": T0 + 0.3, "mono": 0.3, "type": "load_started"},
              {"ts": T0 + 3600, "mono": 10.3, "type": "load_stopped"}]
    (interval,) = intervals_of(events, {})
    assert interval.length_s == pytest.approx(10.0)


@settings(max_examples=60, deadline=None)
@given(st.floats(1, 3600), st.floats(0, 1), st.floats(0, 1e6))
def test_an_onset_past_the_nights_end_lengthens_nothing(load_s, detect, beyond) -> None:
    events = [{"ts": T0, "mono": 0.0, "type": "run_started"}, {"ts": T0, "mono": 0.0, "type": "load_started"},
              {"ts": T0 + detect * load_s, "mono": detect * load_s, "type": "incident", "kind": "hang",
               "onset_at": T0 + load_s + beyond, "detected_at": T0 + load_s + beyond},
              {"ts": T0 + load_s, "mono": load_s, "type": "load_stopped"}]
    assert sum(i.length_s for i in intervals_of(events, {})) <= load_s + 1e-6


def test_the_live_tracker_counts_only_evidenced_time() -> None:
    """Fed only empty answers, the live test never accepts on them."""
    p = plan(broken_mtbf_s=1.0, target_mtbf_s=3.0, alpha=0.2, beta=0.2)
    tracker = ProofTracker(p, horizon_s=0.0)
    tracker.on_event("run_started", {"ts": T0, "mono": 0.0})
    tracker.on_event("load_started", {"ts": T0, "mono": 0.0})
    for k in range(1, 100):
        tracker.on_request({"outcome": "ok", "ttft_s": None, "output_tokens": 0, "ended_mono": k * 0.1,
                            "ended_at": T0 + k * 0.1})
    assert tracker.at(T0 + 10.0).exposure_s == 0.0


def _copy_night(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    shutil.copytree(FIXTURES / "n04-fixed-clean", runs / "night")
    return runs


def test_soak_history_prove_gives_a_night_of_empty_answers_no_exposure(tmp_path, capsys) -> None:
    runs = _copy_night(tmp_path)
    path = runs / "night" / "requests.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**r, "output_tokens": 0, "ttft_s": None}) + "\n" for r in lines))
    assert soak_main(["history", str(runs), "--out", str(tmp_path / "out"), "--prove", "--broken-mtbf", "1s",
                      "--target-mtbf", "3s", "--alpha", "0.2", "--beta", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "1 runs, no exposure" in out and "no hang in" not in out
    data = json.loads((tmp_path / "out" / "history.json").read_text())
    assert data["runs"][0]["exposure_s"] == 0


def test_soak_history_reads_a_stepped_load_stopped_by_its_mono(tmp_path, capsys) -> None:
    runs = _copy_night(tmp_path)
    path = runs / "night" / "events.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()]
    start = events[0]["ts"]
    for e in events:
        if e["type"] != "run_started":
            e["mono"] = e["ts"] - start
        if e["type"] == "load_stopped":
            e["ts"] += 3590 * 10
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert soak_main(["history", str(runs), "--out", str(tmp_path / "out")]) == 0
    data = json.loads((tmp_path / "out" / "history.json").read_text())
    assert data["runs"][0]["exposure_s"] == pytest.approx(3960)
