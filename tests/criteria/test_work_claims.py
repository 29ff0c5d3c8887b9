"""Every work claim cross-checked (issue 49, deliverable 2): the work rate, the
server's own counters against the client's work, the model, usage. Properties
over generated request records and server deltas, and the adversarial round's
four servers built as run directories and judged as ``soak report`` judges them."""

from __future__ import annotations

import itertools
import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from soak.criteria import CriteriaConfig, CriterionState, RequestTally, judge
from soak.criteria.claims import ServerWork
from soak.criteria.rules import LoadSpan
from soak.judge import Ending, judge as judge_run, read_recorded, summary_json

CLAIMS = ("work_rate", "server_work", "wrong_model")
T0 = 1_800_000_000.0
_dirs = itertools.count()


def rec(ended: float, tokens: int, *, model: str | None = "fake-model", usage: int | None = None,
        e2e: float = 0.5, degenerate: str | None = None, warmup: bool = False) -> dict[str, Any]:
    return {"outcome": "ok", "started_at": ended - e2e, "ended_at": ended, "ttft_s": 0.05, "e2e_s": e2e,
            "output_tokens": tokens, "usage_output_tokens": tokens if usage is None else usage,
            "model": model, "degenerate": degenerate, "warmup": warmup, "tpot_s": 0.01, "http_status": 200}


def tally_of(records: list[dict[str, Any]], *, end: float, stopped: float | None = None,
             expected: frozenset[str] | None = frozenset({"fake-model"}), server: float | None = None,
             **config: Any) -> tuple[CriteriaConfig, RequestTally]:
    cfg = CriteriaConfig.model_validate(config)
    tally = RequestTally.of(cfg, records, span=LoadSpan(0.0, end, stopped_sending=stopped))
    tally.claims.expected = expected
    if server is not None:
        tally.claims.server = ServerWork(seen=True, generated=server,
                                         client_within=tally.claims.client_within(None, None),
                                         client_all=tally.claims.client_all)
    return cfg, tally


def states(cfg: CriteriaConfig, tally: RequestTally) -> dict[str, CriterionState]:
    return {r.name: r.state for r in judge(cfg, tally, final=True).results}


def result(cfg: CriteriaConfig, tally: RequestTally, name: str):
    return next(r for r in judge(cfg, tally, final=True).results if r.name == name)


@st.composite
def healthy(draw) -> tuple[list[dict[str, Any]], float, float]:
    """A steady load with jitter, varied answer lengths, a drain at the end."""
    dt = draw(st.floats(0.02, 1.0))
    n = draw(st.integers(60, 600))
    low = draw(st.integers(20, 200))
    rng = draw(st.randoms(use_true_random=False))  # the per-request jitter: one draw, not hundreds
    records, t = [], 0.0
    for _ in range(n):
        t += dt * rng.uniform(0.5, 1.5)
        records.append(rec(t, rng.randint(low, 2 * low), e2e=min(t, dt * 4)))
    stopped = t
    # The drain: a few stragglers finish, then nothing; never owed the rate.
    for i in range(draw(st.integers(0, 3))):
        records.append(rec(stopped + (i + 1) * draw(st.floats(0.1, 20.0)), low))
    end = stopped + draw(st.floats(0.0, 60.0)) + 20.0
    return records, stopped, end


@settings(max_examples=60, deadline=None)
@given(healthy(), st.floats(0.5, 3.0))
def test_a_run_whose_server_did_the_work_at_a_steady_rate_is_never_failed_by_the_claims(run, cover) -> None:
    """(a) The server's counters cover at least the floor of the client's work, the
    rate never collapses, the model matches: none of the claims' criteria fails."""
    records, stopped, end = run
    client = sum(r["output_tokens"] for r in records)
    cfg, tally = tally_of(records, end=end, stopped=stopped, server=client * cover)
    got = states(cfg, tally)
    assert all(got[name] is not CriterionState.FAIL for name in CLAIMS), got
    assert got["wrong_model"] is CriterionState.PASS


@settings(max_examples=60, deadline=None)
@given(healthy(), st.floats(0.0, 0.49))
def test_a_server_that_counted_a_small_fraction_of_the_clients_work_fails_naming_both(run, share) -> None:
    """(b) The client's generated tokens exceed the server's past the bound: fail, both figures said."""
    records, stopped, end = run
    client = sum(r["output_tokens"] for r in records)
    server = float(int(client * share))
    cfg, tally = tally_of(records, end=end, stopped=stopped, server=server)
    got = result(cfg, tally, "server_work")
    assert got.state is CriterionState.FAIL
    assert f"rose by {server:.0f}" in got.reasons[0] and f"received {client} generated tokens" in got.reasons[0]


@settings(max_examples=60, deadline=None)
@given(st.integers(20, 60), st.integers(20, 200), st.integers(2, 6), st.integers(3, 12), st.data())
def test_any_collapse_below_the_floor_after_a_healthy_start_fails(per_window, tokens, healthy_windows, lows,
                                                                  data) -> None:
    """(c) A healthy start, then one short answer per window or less: the work rate fails with its reason."""
    window = 10.0
    records, t = [], 0.0
    while t < healthy_windows * window:
        t += window / per_window
        records.append(rec(t, data.draw(st.integers(tokens, 2 * tokens))))
    for _ in range(lows):
        t += window * data.draw(st.floats(1.05, 3.0))
        records.append(rec(t, data.draw(st.integers(1, tokens))))
    cfg, tally = tally_of(records, end=t + 3 * window, work_rate={"window": window})
    got = result(cfg, tally, "work_rate")
    assert got.state is CriterionState.FAIL, got.reasons
    assert got.reasons[0].startswith("work rate fell to ") and "of the run's healthy rate at +" in got.reasons[0]
    assert got.value is not None and got.value < 0.1


@settings(max_examples=30, deadline=None)
@given(st.integers(20, 60), st.integers(2, 8), st.floats(5.0, 40.0))
def test_silence_is_the_hang_detectors_not_a_collapse(per_window, healthy_windows, silent_s) -> None:
    """A server that stops answering (a hang) is no collapse of the rate: the
    incident stays a hang, and a rate that comes back passes."""
    records = [rec(i * 10.0 / per_window, 100) for i in range(1, healthy_windows * per_window)]
    t = records[-1]["ended_at"] + silent_s
    records += [rec(t + i * 10.0 / per_window, 100) for i in range(1, 3 * per_window)]
    cfg, tally = tally_of(records, end=records[-1]["ended_at"] + 1, work_rate={"window": 10.0})
    assert result(cfg, tally, "work_rate").state is CriterionState.PASS


@settings(max_examples=30, deadline=None)
@given(healthy(), st.integers(0, 2**31))
def test_the_live_judgement_and_the_ends_are_one(run, seed) -> None:
    """Fed one record at a time and judged as the live loop does, the work rate ends where the batch judged it."""
    import random

    records, stopped, end = run
    cfg = CriteriaConfig()
    live = RequestTally.for_config(cfg)
    live.open_load(0.0)
    rng = random.Random(seed)
    for r in sorted(records, key=lambda r: r["ended_at"]):
        if r["ended_at"] > stopped:
            live.stop_sending(stopped)
        live.add(r, at=r["ended_at"])
        if rng.random() < 0.2:
            live.watch(r["ended_at"])
            judge(cfg, live, final=False)
    live.stop_sending(stopped)
    live.close_load(end)
    _, batch = tally_of(records, end=end, stopped=stopped)
    a, b = result(cfg, live, "work_rate"), result(cfg, batch, "work_rate")
    assert (a.state, a.value, a.evidence) == (b.state, b.value, b.evidence)


# -- run directories: the figures never read a claim; the adversarial round's servers ----

def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def run_dir(root: Path, records: list[dict[str, Any]], *, server_generated: float | None, served: str = "fake-model",
            duration: float | None = None) -> Path:
    run = root / f"run{next(_dirs)}"
    run.mkdir()
    (run / "config.yaml").write_text("{}")
    end = duration if duration is not None else max(r["ended_at"] for r in records) + 1.0
    _write(run / "events.jsonl", [
        {"ts": T0, "mono": 0.0, "type": "run_started", "run_id": run.name, "model": served, "duration_s": end,
         "warmup_s": 0.0},
        {"ts": T0, "mono": 0.0, "type": "target_ready", "models": [served]},
        {"ts": T0 + 0.5, "mono": 0.5, "type": "load_started"},
        {"ts": T0 + end + 0.5, "mono": end + 0.5, "type": "load_stopped", "drain_s": 0.5}])
    rows = []
    for i, r in enumerate(records):
        rows.append({**r, "request_id": f"r{i}", "started_at": T0 + 0.5 + r["started_at"],
                     "ended_at": T0 + 0.5 + r["ended_at"], "started_mono": 0.5 + r["started_at"],
                     "ended_mono": 0.5 + r["ended_at"], "prompt_tokens": 100})
    _write(run / "requests.jsonl", rows)
    if server_generated is not None:  # just before the first request and just after the drain
        _write(run / "samples.jsonl", [
            {"ts": T0 + at, "mono": at, "kind": "server", "ok": True,
             "values": {"prompt_tokens": 100.0 * len(records) * k, "generation_tokens": server_generated * k}}
            for k, at in ((0, 0.0), (1, end + 0.6))])
    return run


def judged(run: Path) -> tuple[Any, dict[str, Any]]:
    recorded = read_recorded(run)
    judgement = judge_run(recorded, Ending.live(stop_reason="duration"))
    return judgement, summary_json(recorded, judgement)


def criterion(summary: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in summary["criteria"]["results"] if r["name"] == name)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(0, 900)), min_size=5, max_size=40))
def test_totals_throughput_and_tpot_never_depend_on_usage_claims(answers) -> None:
    """(d) Vary the claims, keep what was streamed: every figure stays the same."""
    with tempfile.TemporaryDirectory() as tmp:
        base = [rec(1.0 + i, tokens) for i, (tokens, _) in enumerate(answers)]
        lying = [{**r, "usage_output_tokens": claim} for r, (_, claim) in zip(base, answers)]
        summaries = [judged(run_dir(Path(tmp), rows, server_generated=None))[1] for rows in (base, lying)]
    keys = ("tokens", "throughput", "latency", "requests", "error_rate", "duration_s")
    assert [{k: s[k] for k in keys} for s in summaries][0] == [{k: s[k] for k in keys} for s in summaries][1]
    assert summaries[0]["tokens"]["generated"] == sum(t for t, _ in answers)
    disagreeing = sum(abs(c - t) > max(2, 0.1 * t) for t, c in answers)
    assert summaries[1]["claims"]["usage_disagreements"] == disagreeing


def steady(n: int, *, every: float = 0.05, tokens: int = 100, **kw: Any) -> list[dict[str, Any]]:
    return [rec((i + 1) * every, tokens, **kw) for i in range(n)]


def test_usage_claiming_twice_the_tokens_streamed_is_noted_and_never_a_figure(tmp_path: Path) -> None:
    records = steady(400, tokens=19, usage=38)  # 7,600 streamed, 15,200 claimed; the counters agree with the stream
    judgement, summary = judged(run_dir(tmp_path, records, server_generated=7600))
    assert judgement.verdict.value == "pass"
    assert summary["tokens"]["generated"] == 7600
    claims = summary["claims"]
    assert claims["usage_disagreements"] == 400 and claims["claimed_above_count"] == 400
    assert "claimed 15200, counted 7600" in claims["note"]
    assert claims["server"]["note"] == "usage claimed 15200 generated tokens, the server's own counters 7600"


def test_every_answer_the_same_cached_bytes_fails_on_the_servers_own_counters(tmp_path: Path) -> None:
    records = steady(1600, every=0.02, tokens=16)  # 25,600 tokens received, the server counted 64
    judgement, summary = judged(run_dir(tmp_path, records, server_generated=64))
    assert judgement.verdict.value == "fail"
    got = criterion(summary, "server_work")
    assert got["state"] == "fail"
    assert "rose by 64 while the client received 25600 generated tokens" in got["reasons"][0]
    assert any("server counted 0.2%" in r for r in summary["verdict_reasons"])


def test_every_chunk_from_another_model_fails_naming_it(tmp_path: Path) -> None:
    records = steady(200, model="other-model\x1b[31m")
    judgement, summary = judged(run_dir(tmp_path, records, server_generated=20000))
    got = criterion(summary, "wrong_model")
    assert judgement.verdict.value == "fail" and got["state"] == "fail"
    assert got["reasons"][0] == ("200 of 200 answers came from another model than the one served (fake-model): "
                                 "the first of them named 'other-model?[31m'")


def test_a_300x_collapse_after_a_healthy_start_fails_with_its_reason(tmp_path: Path) -> None:
    records = steady(400, every=0.025)  # healthy for 10 s: 40 requests a second
    records += [rec(10.0 + 12.0 * (i + 1), 100) for i in range(3)]  # then one request per 12 s
    judgement, summary = judged(run_dir(tmp_path, records, server_generated=40300, duration=50.0))
    got = criterion(summary, "work_rate")
    assert judgement.verdict.value == "fail" and got["state"] == "fail", got
    assert got["reasons"][0].startswith("work rate fell to 0.25% of the run's healthy rate at +20s")


def test_a_healthy_run_passes_every_claim_and_without_metrics_says_not_checked(tmp_path: Path) -> None:
    records = steady(800, every=0.05, degenerate=None)
    judgement, summary = judged(run_dir(tmp_path, records, server_generated=80000))
    assert judgement.verdict.value == "pass"
    assert {n: criterion(summary, n)["state"] for n in CLAIMS} == {n: "pass" for n in CLAIMS}
    judgement, summary = judged(run_dir(tmp_path, records, server_generated=None))
    got = criterion(summary, "server_work")
    assert got["state"] == "inactive" and got["reasons"][0].startswith("not checked: the server exported no")
    assert summary["claims"]["server"]["checked"] is False


def test_the_degenerate_share_is_reported_per_window(tmp_path: Path) -> None:
    records = steady(400, every=0.5)
    records = [{**r, "degenerate": "repetition"} if 120 <= r["ended_at"] < 180 and i % 2 else r
               for i, r in enumerate(records)]
    judgement, summary = judged(run_dir(tmp_path, records, server_generated=30000))
    degenerate = summary["claims"]["degenerate"]
    assert judgement.verdict.value == "pass"  # a signal, not a verdict
    assert degenerate["degenerate"] == 60 and degenerate["kinds"] == {"repetition": 60}
    assert [w["from_s"] for w in degenerate["windows"]] == [120.0] and degenerate["max_window_share"] == 0.5


def test_a_server_counting_far_more_than_the_client_received_is_noted_not_failed(tmp_path: Path) -> None:
    records = steady(400)
    judgement, summary = judged(run_dir(tmp_path, records, server_generated=400_000))
    assert judgement.verdict.value == "pass"
    assert "more than 2x the 40000 the client received" in summary["claims"]["server"]["note"]
    assert any("more than 2x" in w for w in summary["warnings"])


def test_metrics_that_stop_answering_compare_only_the_span_they_cover(tmp_path: Path) -> None:
    """An honest server whose /metrics went stale halfway: the client's work inside
    the covered span is what its counters must hold, so it passes."""
    records = steady(800, every=0.05)  # 40 s, 100 tokens each
    run = run_dir(tmp_path, records, server_generated=None)
    _write(run / "samples.jsonl", [
        {"ts": T0, "mono": 0.0, "kind": "server", "ok": True, "values": {"generation_tokens": 0.0}},
        {"ts": T0 + 20.5, "mono": 20.5, "kind": "server", "ok": True, "values": {"generation_tokens": 40_000.0}},
        *({"ts": T0 + t, "mono": float(t), "kind": "server", "ok": False, "error": "timeout"} for t in (25, 30, 41))])
    judgement, summary = judged(run)
    got = criterion(summary, "server_work")
    assert got["state"] == "pass" and got["evidence"]["client_within"] == 40_000, got  # ended by +20.5 s
    assert summary["claims"]["server"]["covered"] is False


def test_a_restart_starts_a_new_life_whose_down_time_is_not_owed() -> None:
    """Healthy, a hang (silence), the incident's pause and a new life that is
    slower to start: no collapse; the new life's windows start at its first work."""
    records = [rec(i * 0.1, 100) for i in range(1, 300)]  # 30 s healthy
    records += [rec(60.0 + i * 0.1, 100) for i in range(1, 300)]  # the new life from +60 s
    cfg = CriteriaConfig()
    span = LoadSpan(0.0, 95.0, restarts=((40.0, 55.0),))
    tally = RequestTally.of(cfg, records, span=span)
    got = result(cfg, tally, "work_rate")
    assert got.state is CriterionState.PASS, got.reasons


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.just("fake-model"), st.text(max_size=300), st.none()), min_size=1, max_size=80))
def test_any_answer_from_another_model_fails_and_its_name_is_said_printable_and_clipped(names) -> None:
    records = [rec(1.0 + i, 10, model=name) for i, name in enumerate(names)]
    cfg, tally = tally_of(records, end=len(names) + 2.0)
    got = result(cfg, tally, "wrong_model")
    wrong = [n for n in names if n and n != "fake-model"]
    if not any(n for n in names):
        assert got.state is CriterionState.INACTIVE and got.reasons[0].startswith("not checked")
    elif wrong:
        assert got.state is CriterionState.FAIL
        assert got.reasons[0].startswith(f"{len(wrong)} of {sum(1 for n in names if n)} answers came from another")
        first = got.evidence["first_wrong"]
        assert first.isprintable() and len(first) <= 83
    else:
        assert got.state is CriterionState.PASS
    # No served model recorded: not checked, never a silent pass.
    cfg, tally = tally_of(records, end=len(names) + 2.0, expected=None)
    assert result(cfg, tally, "wrong_model").state is CriterionState.INACTIVE


@settings(max_examples=30, deadline=None)
@given(st.floats(0.9, 1.0), st.integers(20, 200), st.integers(20, 80))
def test_a_load_that_slows_as_its_contexts_grow_is_measured_against_its_recent_self(decay, windows, per_window) -> None:
    """Each window at least 90% of the one before, down to a small fraction of the start: no collapse.
    The healthy rate is the median of the latest 30 healthy windows, 15 windows behind: a decline
    slower than 0.1 ** (1 / 15) = 0.86 per window never falls below its floor."""
    records, rate, t = [], float(per_window), 0.0
    for w in range(windows):
        n = max(1, round(rate))
        records += [rec(w * 10.0 + (i + 0.5) * 10.0 / n, 100) for i in range(n)]
        rate *= decay
    cfg, tally = tally_of(records, end=windows * 10.0 + 1, work_rate={"window": 10.0})
    assert result(cfg, tally, "work_rate").state is CriterionState.PASS
