"""No evidence, no pass (issue 32): the work_evidence criterion as a property.

Generated runs (request outcomes, token counts, content or none, when each
ended, the load's span, the criterion's window, floors and bounds) are judged by
``soak.criteria.judge`` and by a brute-force reading of the invariant written
here from its statement; the two must agree both ways:

- pass => every full window after load start had the floor of finished requests
  with generated tokens, the first came within the start-up allowance, and no
  gap between them (nor the tail to the load's end) reached the bound;
- a run whose server did that work is never failed by this criterion.

Times are multiples of 1/4 s on an origin of 1000 s, so the oracle's window
arithmetic and the tally's are exact.
"""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soak.criteria import CriteriaConfig, CriterionState, RequestTally, judge
from soak.criteria.rules import LoadSpan, generated_tokens, record_time

ORIGIN = 1000.0
QUARTER = st.integers(min_value=0, max_value=4 * 120).map(lambda q: q / 4)
OUTCOMES = ("ok", "ok", "ok", "http_status", "timeout_stall", "reset", "aborted")


@st.composite
def records(draw, end: float):
    """One request: outcome, tokens, whether content reached the client, when it ended."""
    outcome = draw(st.sampled_from(OUTCOMES))
    at = draw(st.integers(min_value=0, max_value=int(end * 4))) / 4
    tokens = draw(st.sampled_from((0, 0, 1, 3, 20)))
    content = draw(st.booleans()) if tokens else draw(st.booleans())
    return {"outcome": outcome, "ended_at": ORIGIN + at, "output_tokens": tokens,
            "ttft_s": 0.25 if content else None, "cut_by": "drain" if outcome == "aborted" else None}


@st.composite
def runs(draw):
    # A healthy backbone: a productive request every `every` s from `first` on,
    # each with `tokens`, `per_window` of them a window; the floors and bounds are
    # drawn around it so runs land on both sides of every limit, and on it.
    every = draw(st.integers(min_value=1, max_value=4 * 10)) / 4
    per_window = draw(st.integers(min_value=1, max_value=6))
    first = draw(st.integers(min_value=0, max_value=4 * 10)) / 4
    window = every * per_window
    section = {"window": window,
               "min_requests": draw(st.sampled_from((0, 1, per_window - 1, per_window, per_window + 1))),
               "min_tokens": draw(st.sampled_from((0, 1, 5, 30)))}
    end = draw(QUARTER)
    shape = draw(st.sampled_from(("mixed", "zero_tokens", "all_cut", "nothing", "work_then_nothing",
                                  "steady", "steady", "steady")))
    if draw(st.booleans()):
        section["max_gap"] = draw(st.sampled_from((every, every + 0.25, max(0.25, every - 0.25))))
    elif draw(st.booleans()):
        section["max_gap"] = draw(st.integers(min_value=1, max_value=4 * 60)) / 4
    if draw(st.booleans()):
        section["startup"] = min(window, draw(st.sampled_from((first, first + 0.25, first + 5))) or 0.25)
    if shape == "nothing":
        rows = []
    elif shape == "zero_tokens":
        rows = [{**r, "outcome": "ok", "output_tokens": 0} for r in draw(st.lists(records(end), max_size=30))]
    elif shape == "all_cut":
        rows = [{**r, "outcome": "aborted", "cut_by": "drain"} for r in draw(st.lists(records(end), max_size=30))]
    elif shape == "work_then_nothing":
        stop = draw(st.integers(min_value=0, max_value=int(end * 4))) / 4
        rows = [{"outcome": "ok", "ended_at": ORIGIN + first + k * every, "output_tokens": 5, "ttft_s": 0.1,
                 "cut_by": None} for k in range(int(max(0.0, stop - first) / every) + 1) if first + k * every <= stop]
    elif shape == "steady":
        tokens = draw(st.sampled_from((1, 2, 5, 6, 30)))
        rows = [{"outcome": "ok", "ended_at": ORIGIN + first + k * every, "output_tokens": tokens, "ttft_s": 0.1,
                 "cut_by": None} for k in range(int(max(0.0, end - first) / every) + 1) if first + k * every <= end]
        rows += draw(st.lists(records(end), max_size=5))  # noise: failures, zero-token oks, cut streams
    else:
        rows = draw(st.lists(records(end), max_size=40))
    return CriteriaConfig.model_validate({"work_evidence": section}), end, rows


def oracle(cfg: CriteriaConfig, end: float, rows: list[dict]) -> bool:
    """The invariant, read literally from the records (final, load closed at ``end``)."""
    w = cfg.work_evidence
    work = sorted((r["ended_at"] - ORIGIN, r["output_tokens"]) for r in rows
                  if r["outcome"] == "ok" and r["output_tokens"] > 0 and r["ttft_s"] is not None)
    if not work:
        return False
    times = [t for t, _ in work]
    if times[0] >= w.startup_s:
        return False
    if any(b - a >= w.gap_s for a, b in zip(times, times[1:])) or end - times[-1] >= w.gap_s:
        return False
    for k in range(math.floor(end / w.window)):
        inside = [n for t, n in work if max(0, math.floor(t / w.window)) == k]
        if len(inside) < w.min_requests or sum(inside) < w.min_tokens:
            return False
    return True


def verdict(cfg: CriteriaConfig, tally: RequestTally, *, final: bool) -> CriterionState:
    return {r.name: r for r in judge(cfg, tally, final=final).results}["work_evidence"].state


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(), st.randoms(use_true_random=False))
def test_work_evidence_agrees_with_the_invariant_both_ways(run, rng: random.Random) -> None:
    cfg, end, rows = run
    shuffled = list(rows)
    rng.shuffle(shuffled)  # stored order is not end order: the tally sorts
    tally = RequestTally.of(cfg, shuffled, span=LoadSpan(ORIGIN, ORIGIN + end))
    state = verdict(cfg, tally, final=True)
    assert state in (CriterionState.PASS, CriterionState.FAIL)
    assert (state is CriterionState.PASS) == oracle(cfg, end, rows), (state, end, rows)


@st.composite
def steady_runs(draw):
    """A healthy server's rhythm with the floors drawn on and around what it does:
    `per_window` productive requests of `tokens` each in every window."""
    every = draw(st.integers(min_value=1, max_value=4 * 10)) / 4
    per_window = draw(st.integers(min_value=1, max_value=6))
    tokens = draw(st.sampled_from((1, 2, 5, 30)))
    first = draw(st.integers(min_value=0, max_value=int(every * 4) - 1)) / 4
    window = every * per_window
    end = window * draw(st.integers(min_value=1, max_value=5)) + draw(st.sampled_from((0.0, every / 2)))
    section = {"window": window,
               "min_requests": draw(st.sampled_from((per_window - 1, per_window, per_window + 1))),
               "min_tokens": draw(st.sampled_from((per_window * tokens - 1, per_window * tokens,
                                                   per_window * tokens + 1)))}
    rows = [{"outcome": "ok", "ended_at": ORIGIN + first + k * every, "output_tokens": tokens, "ttft_s": 0.1,
             "cut_by": None} for k in range(int((end - first) / every) + 1) if first + k * every <= end]
    if draw(st.booleans()):  # a lost request somewhere: its window is one short
        del rows[draw(st.integers(min_value=0, max_value=len(rows) - 1))]
    return CriteriaConfig.model_validate({"work_evidence": section}), end, rows


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steady_runs())
def test_the_window_floor_holds_exactly_at_its_edges(run) -> None:
    cfg, end, rows = run
    tally = RequestTally.of(cfg, rows, span=LoadSpan(ORIGIN, ORIGIN + end))
    assert (verdict(cfg, tally, final=True) is CriterionState.PASS) == oracle(cfg, end, rows), (end, rows)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_the_live_judgement_never_fails_a_run_the_end_passes_and_its_fail_holds(run) -> None:
    """Live, the loop folds records as they end and judges on every tick: a live
    fail ends the soak early, so it must be one the end confirms, and a run that
    did its work is never stopped."""
    cfg, end, rows = run
    live = RequestTally.for_config(cfg)
    live.open_load(ORIGIN)
    ordered = sorted(rows, key=lambda r: r["ended_at"])
    ticks = sorted({ORIGIN + q / 4 for q in range(0, int(end * 4) + 1, 3)} | {r["ended_at"] for r in rows})
    failed_live = False
    i = 0
    for now in ticks:
        while i < len(ordered) and ordered[i]["ended_at"] <= now:
            live.add(ordered[i], at=ordered[i]["ended_at"])
            i += 1
        live.watch(now)
        if verdict(cfg, live, final=False) is CriterionState.FAIL:
            failed_live = True
            break
    live_end = RequestTally.of(cfg, rows, span=LoadSpan(ORIGIN, ORIGIN + end))
    final = verdict(cfg, live_end, final=True)
    if failed_live:
        assert final is CriterionState.FAIL
    if oracle(cfg, end, rows):
        assert not failed_live


@pytest.mark.parametrize("rows, expected", [
    ([], "no request finished with generated tokens in 60.0s of load (none finished)"),
    ([{"outcome": "ok", "ended_at": ORIGIN + t, "output_tokens": 0, "ttft_s": None} for t in range(50)],
     "no request finished with generated tokens in 60.0s of load (50 finished ok with no generated tokens)"),
    ([{"outcome": "aborted", "cut_by": "drain", "ended_at": ORIGIN + 60, "output_tokens": 90, "ttft_s": 1.0}] * 4,
     "no request finished with generated tokens in 60.0s of load (4 cut by the harness still in flight)"),
    # Usage that claims tokens with no content ever streamed is not work either.
    ([{"outcome": "ok", "ended_at": ORIGIN + t, "output_tokens": 12, "ttft_s": None} for t in range(50)],
     "no request finished with generated tokens in 60.0s of load (50 finished ok with no generated tokens)"),
])
def test_a_load_that_did_no_work_fails_however_short_the_default_window(rows, expected) -> None:
    """The listed servers, in records: the 10-minute default allowance never hides a
    load that ended with no work (a 60 s run is far shorter than the window)."""
    cfg = CriteriaConfig()
    decision = judge(cfg, RequestTally.of(cfg, rows, span=LoadSpan(ORIGIN, ORIGIN + 60)), final=True)
    assert decision.failed and decision.failed[-1].name == "work_evidence"
    assert decision.failed[-1].reasons[0] == expected


def test_work_then_nothing_fails_at_the_gap_bound_and_names_it() -> None:
    cfg = CriteriaConfig.model_validate({"work_evidence": {"window": "10m", "max_gap": "2m"}})
    rows = [{"outcome": "ok", "ended_at": ORIGIN + t, "output_tokens": 8, "ttft_s": 0.2} for t in range(0, 60, 5)]
    tally = RequestTally.of(cfg, rows, span=LoadSpan(ORIGIN, ORIGIN + 400))
    result = judge(cfg, tally, final=True).failed[0]
    assert result.name == "work_evidence" and result.value == pytest.approx(345.0)
    assert result.reasons[0] == ("no request finished with generated tokens for 345.0s (+55.0s to +400.0s of the "
                                 "load; at most 120s allowed)")
    # Live, the stall ends the soak once the gap reaches the bound, not at the end.
    live = RequestTally.for_config(cfg)
    live.open_load(ORIGIN)
    for row in rows:
        live.add(row, at=row["ended_at"])
    live.watch(ORIGIN + 55 + 119.75)
    assert judge(cfg, live, final=False).passed
    live.watch(ORIGIN + 55 + 120)
    decision = judge(cfg, live, final=False)
    assert not decision.passed and decision.stop


def test_a_short_window_names_the_first_window_below_the_floor() -> None:
    cfg = CriteriaConfig.model_validate({"work_evidence": {"window": "1m", "min_tokens": 100, "max_gap": "5m"}})
    rows = [{"outcome": "ok", "ended_at": ORIGIN + t, "output_tokens": 10 if t < 120 else 1, "ttft_s": 0.1}
            for t in range(0, 300, 5)]
    tally = RequestTally.of(cfg, rows, span=LoadSpan(ORIGIN, ORIGIN + 300))
    (result,) = judge(cfg, tally, final=True).failed
    assert result.reasons[0] == ("3 of 5 window(s) of 60s below the floor of 1 request(s) and 100 token(s): the "
                                 "first, +120.0s to +180.0s, had 12 request(s) with 12 generated token(s)")


def test_a_run_cut_off_is_judged_on_the_time_it_has() -> None:
    """No load_stopped (the harness was killed): the start-up allowance still applies,
    since the record ends before the load did."""
    cfg = CriteriaConfig()
    cut = RequestTally.of(cfg, [], span=LoadSpan(ORIGIN, None))
    assert verdict(cfg, cut, final=True) is CriterionState.PASS
    late = RequestTally.of(cfg, [{"outcome": "http_status", "ended_at": ORIGIN + 700}], span=LoadSpan(ORIGIN, None))
    assert verdict(cfg, late, final=True) is CriterionState.FAIL


def test_a_load_the_harness_cut_short_owes_only_the_time_it_had(tmp_path) -> None:
    """Ctrl-C or the harness's own fault 3 s in, nothing finished yet: not the
    server's failure (the allowance applies); the same load run to its end is."""
    from soak.judge import summarize
    from soak.store.summary import load_span

    cfg = CriteriaConfig()
    cut = RequestTally.of(cfg, [], span=LoadSpan(ORIGIN, ORIGIN + 3, cut_short=True))
    assert verdict(cfg, cut, final=True) is CriterionState.PASS
    whole = RequestTally.of(cfg, [], span=LoadSpan(ORIGIN, ORIGIN + 3))
    assert verdict(cfg, whole, final=True) is CriterionState.FAIL
    run = tmp_path / "run"
    run.mkdir()
    for code, expected in ((130, "aborted"), (4, "aborted"), (0, "fail")):
        events = [{"ts": ORIGIN - 1, "type": "run_started", "run_id": "x"},
                  {"ts": ORIGIN, "type": "load_started"}, {"ts": ORIGIN + 3, "type": "load_stopped"},
                  {"ts": ORIGIN + 4, "type": "run_ended", "verdict": "aborted" if code else "pass",
                   "exit_code": code}]
        (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        assert load_span(run).cut_short is (code != 0)
        assert summarize(run)["verdict"] == expected


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 400), st.sampled_from((0, 7))), min_size=1, max_size=30),
       st.sampled_from((-3600.0, 0.0, 3600.0)), st.integers(0, 30))
def test_record_time_reads_the_monotonic_clock_when_the_run_has_one(ends, step, at) -> None:
    """A wall-clock step in the middle of a run changes nothing when the records
    carry ``ended_mono``: the span and every end are read on the monotonic clock."""
    wall0, mono0 = 1_800_000_000.0, 5.0
    started = {"type": "load_started", "ts": wall0, "mono": mono0}
    stopped = {"type": "load_stopped", "ts": wall0 + 500 + step, "mono": mono0 + 500}
    span = LoadSpan.of_events(started, stopped)
    assert (span.started, span.ended) == (mono0, mono0 + 500)
    rows = [{"outcome": "ok", "output_tokens": n, "ttft_s": 0.1, "ended_mono": mono0 + t,
             "ended_at": wall0 + t + (step if i >= at else 0.0)} for i, (t, n) in enumerate(ends)]
    stepped = RequestTally.of(CriteriaConfig(), rows, span=span)
    steady = RequestTally.of(CriteriaConfig(), [{**r, "ended_at": r["ended_mono"] - mono0 + wall0} for r in rows],
                             span=span)
    assert judge(CriteriaConfig(), stepped, final=True) == judge(CriteriaConfig(), steady, final=True)
    assert [record_time(r, offset=span.offset) for r in rows] == [r["ended_mono"] for r in rows]
    # An old run (no mono anywhere) reads the wall clock, as it always did.
    old = LoadSpan.of_events({"ts": wall0}, {"ts": wall0 + 500})
    assert record_time({"ended_at": wall0 + 3.0}, offset=old.offset) == wall0 + 3.0


def test_generated_tokens_is_content_on_a_finished_request_only() -> None:
    assert generated_tokens({"outcome": "ok", "output_tokens": 5, "ttft_s": 0.1}) == 5
    assert generated_tokens({"outcome": "ok", "output_tokens": 5, "ttft_s": None}) == 0  # usage, no content
    assert generated_tokens({"outcome": "aborted", "output_tokens": 5, "ttft_s": 0.1}) == 0  # still streaming
    assert generated_tokens({"outcome": "ok", "output_tokens": True, "ttft_s": 0.1}) == 0
    assert generated_tokens({"outcome": "ok", "output_tokens": "5", "ttft_s": 0.1}) == 0


def test_defaults_are_one_request_and_one_token_every_ten_minutes() -> None:
    w = CriteriaConfig().work_evidence
    assert (w.enabled, w.window, w.min_requests, w.min_tokens, w.gap_s, w.startup_s) == (
        True, 600.0, 1, 1, 600.0, 600.0)
    assert json.loads(CriteriaConfig().model_dump_json())["work_evidence"]["max_gap"] is None


def oracle_with_restarts(cfg: CriteriaConfig, end: float, rows: list[dict],
                         restarts: list[tuple[float, float]]) -> bool:
    """The invariant over server lives: each life (from the load's start, then
    from each restart's relaunch, to the next incident's pause or the load's end)
    owes its own start-up, gaps and full windows; the time between a pause and
    the relaunch is not owed. A load with no work at all fails."""
    w = cfg.work_evidence
    work = sorted((r["ended_at"] - ORIGIN, r["output_tokens"]) for r in rows
                  if r["outcome"] == "ok" and r["output_tokens"] > 0 and r["ttft_s"] is not None)
    if not work:
        return False
    starts = [0.0, *(back for _, back in restarts)]
    stops = [*(down for down, _ in restarts), end]
    for i, (start, stop) in enumerate(zip(starts, stops)):
        last_life = i == len(starts) - 1
        # A record ending exactly at a relaunch belongs to the new life (restarts fold first).
        mine = [(t, n) for t, n in work if start <= t < stop or (last_life and t == stop)]
        times = [t for t, _ in mine]
        if not times:
            if last_life and stop - start >= w.startup_s:
                return False
        else:
            if times[0] - start >= w.startup_s:
                return False
            if any(b - a >= w.gap_s for a, b in zip(times, times[1:])):
                return False
            if last_life and stop - times[-1] >= w.gap_s:
                return False
        for k in range(math.floor((stop - start) / w.window)):
            inside = [n for t, n in mine if max(0, math.floor((t - start) / w.window)) == k]
            if len(inside) < w.min_requests or sum(inside) < w.min_tokens:
                return False
    return True


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(), st.lists(st.integers(min_value=1, max_value=4 * 120), max_size=6, unique=True))
def test_restarts_start_a_new_life_and_live_agrees_with_the_end(run, quarters) -> None:
    """on_hang: restart: the time a server was down and relaunching is not owed
    work, each life gets its start-up allowance; the live tally (restart() as
    restart_done happens) and the stored one (the span's restarts) agree."""
    cfg, end, rows = run
    marks = sorted(q / 4 for q in quarters if q / 4 < end)
    restarts = list(zip(marks[0::2], marks[1::2]))  # (paused, relaunched) pairs
    # Nothing finishes while the target is down: the incident cut what was in flight.
    rows = [r for r in rows if not any(down <= r["ended_at"] - ORIGIN < back for down, back in restarts)]
    span = LoadSpan(ORIGIN, ORIGIN + end, restarts=tuple((ORIGIN + d, ORIGIN + b) for d, b in restarts))
    stored = verdict(cfg, RequestTally.of(cfg, rows, span=span), final=True)
    assert (stored is CriterionState.PASS) == oracle_with_restarts(cfg, end, rows, restarts), (end, restarts, rows)
    live = RequestTally.for_config(cfg)
    live.open_load(ORIGIN)
    pending = [(ORIGIN + d, ORIGIN + b) for d, b in restarts]
    for row in sorted(rows, key=lambda r: r["ended_at"]):
        while pending and pending[0][1] <= row["ended_at"]:
            live.restart(*pending.pop(0))
        live.add(row, at=row["ended_at"])
    for down, back in pending:
        live.restart(down, back)
    live.close_load(ORIGIN + end)
    assert verdict(cfg, live, final=True) is stored


def test_a_long_restart_is_not_a_gap_in_the_work() -> None:
    """Work, a hang at +100 s decided at +200 s, a relaunch until +700 s, work
    again: with the restart known the night's work evidence holds; read without
    it, the hang and the relaunch are a gap."""
    cfg = CriteriaConfig.model_validate({"work_evidence": {"window": "5m"}})
    rows = [{"outcome": "ok", "ended_at": ORIGIN + t, "output_tokens": 4, "ttft_s": 0.1}
            for t in [*range(0, 100, 5), *range(730, 1200, 5)]]
    restart = ((ORIGIN + 200, ORIGIN + 700),)
    with_restart = RequestTally.of(cfg, rows, span=LoadSpan(ORIGIN, ORIGIN + 1200, restarts=restart))
    assert verdict(cfg, with_restart, final=True) is CriterionState.PASS
    without = RequestTally.of(cfg, rows, span=LoadSpan(ORIGIN, ORIGIN + 1200))
    assert verdict(cfg, without, final=True) is CriterionState.FAIL
    # A relaunched server that never works again still fails once its allowance runs out.
    dead = RequestTally.of(cfg, rows[:20], span=LoadSpan(ORIGIN, ORIGIN + 1200, restarts=restart))
    result = judge(cfg, dead, final=True).failed[-1]
    assert result.reasons[0].startswith("no request finished with generated tokens in the first 500.0s of load "
                                        "after the restart, past the start-up allowance of 300s")


def test_summarize_reads_the_restarts_from_the_events(tmp_path) -> None:
    from soak.judge import summarize
    from soak.store.summary import load_span

    run = tmp_path / "run"
    run.mkdir()
    events = [{"ts": ORIGIN - 1, "type": "run_started", "run_id": "x"},
              {"ts": ORIGIN, "type": "load_started"},
              {"ts": ORIGIN + 200, "type": "incident_started", "number": 1},
              {"ts": ORIGIN + 700, "type": "restart_done", "number": 1},
              {"ts": ORIGIN + 1200, "type": "load_stopped"},
              {"ts": ORIGIN + 1201, "type": "run_ended", "verdict": "fail", "exit_code": 1},
              {"ts": ORIGIN + 1, "type": "criteria_config", "criteria": {"work_evidence": {"window": 300}}}]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    rows = [{"outcome": "ok", "ended_at": ORIGIN + t, "output_tokens": 4, "ttft_s": 0.1}
            for t in [*range(0, 100, 5), *range(730, 1200, 5)]]
    (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load_span(run).restarts == ((ORIGIN + 200, ORIGIN + 700),)
    work = next(r for r in summarize(run)["criteria"]["results"] if r["name"] == "work_evidence")
    assert work["state"] == "pass" and work["evidence"]["restarts"] == 1
