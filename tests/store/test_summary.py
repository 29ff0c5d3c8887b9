"""summarize() from recorded files only: counts, token totals, the server's hit
ratio as delta(hits)/delta(queries) through a counter reset, cut-off runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from soak.clock import ManualClock
from soak.samples import RequestRecord, ServerSample
from soak.store.store import RunStore
from soak.judge import summarize


def record(i: int, *, outcome: str = "ok", warmup: bool = False, prompt: int = 1000, out: int = 10,
           ttft: float = 0.5, start: float = 1000.0) -> RequestRecord:
    return RequestRecord(
        request_id=f"r{i}", session="s", turn=i, started_at=start + i, ended_at=start + i + 1.0, outcome=outcome,
        prompt_tokens=prompt, output_tokens=out, ttft_s=ttft if outcome == "ok" else None,
        e2e_s=1.0 if outcome == "ok" else None, warmup=warmup, cached_tokens=prompt // 2,
    )


def server(ts: float, hits: float, queries: float, prompt: float = 0.0) -> ServerSample:
    return ServerSample(ts=ts, ok=True, values={"prefix_cache_hits": hits, "prefix_cache_queries": queries,
                                                "prompt_tokens": prompt, "generation_tokens": 0.0})


@pytest.fixture
def make_store(tmp_path):
    stores: list[RunStore] = []

    def make() -> RunStore:
        store = RunStore(tmp_path / f"run{len(stores)}", clock=ManualClock(1000.0))
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


def test_counts_tokens_latency_and_hit_ratio(make_store) -> None:
    store = make_store()
    store.event("run_started", ts=1000.0, run_id="x", warmup_s=2.0, duration_s=20.0)
    store.event("load_started", ts=1000.0)
    store.on_sample(server(1000.0, hits=100, queries=1000))  # counters from before the run
    for i in range(10):
        store.on_request(record(i, warmup=i < 2, ttft=0.1 * (i + 1)))
    store.on_request(record(10, outcome="timeout_stall", out=3))
    store.on_sample(server(1005.0, hits=500, queries=1500))
    store.on_sample(server(1010.0, hits=1000, queries=2000))
    store.event("load_stopped", ts=1020.0)
    store.event("run_ended", ts=1021.0, verdict="pass", reason="duration", exit_code=0)
    # 1 failure in 11 is 9%: past the default 5%, within this run's own 10%.
    store.write_config({"criteria": {"error_rate": {"max": 0.1}}})
    summary = summarize(store.run_dir)
    assert summary["verdict"] == "pass" and summary["cut_off"] is False
    assert summary["requests"] == {"ok": 10, "failed": 1, "warmup": 2, "by_outcome": {"ok": 10, "timeout_stall": 1},
                                   "cut_by_drain": 0, "cut_by_incident": 0, "cut_by_interrupt": 0}
    assert summary["criteria"]["passed"] is True
    assert summary["tokens"] == {"prompt": 11000, "generated": 103, "cached": 5500}
    # (1000 - 100) / (2000 - 1000), not hits / prompt tokens
    assert summary["prefix_cache_hit_ratio"] == pytest.approx(0.9)
    assert summary["duration_s"] == 20.0
    # warm-up excluded: ttft of requests 2..9 are 0.3..1.0
    assert summary["latency"]["ttft_s"]["max"] == pytest.approx(1.0)
    assert summary["latency"]["ttft_s"]["p50"] == pytest.approx(0.65)
    assert summary["throughput"]["generated_tokens_per_s"] == pytest.approx((80 + 3) / 18.0)


def test_hit_ratio_sums_increases_across_a_server_restart(make_store) -> None:
    store = make_store()
    store.on_sample(server(1.0, hits=0, queries=0))
    store.on_sample(server(2.0, hits=900, queries=1000))
    store.on_sample(ServerSample(ts=2.5, ok=False, error="refused"))
    store.on_sample(server(3.0, hits=50, queries=100))  # restarted: counts from zero again
    store.on_sample(server(4.0, hits=150, queries=400))
    summary = summarize(store.run_dir)
    assert summary["prefix_cache_hit_ratio"] == pytest.approx((900 + 50 + 100) / (1000 + 100 + 300))


def test_no_server_counters_means_null_ratio(make_store) -> None:
    store = make_store()
    store.on_request(record(0))
    assert summarize(store.run_dir)["prefix_cache_hit_ratio"] is None


def test_a_cut_off_run_with_a_torn_last_line(make_store) -> None:
    store = make_store()
    store.event("run_started", ts=1000.0, run_id="x", warmup_s=0.0)
    store.event("load_started", ts=1000.0)
    for i in range(5):
        store.on_request(record(i))
    store.close()
    with open(store.run_dir / "requests.jsonl", "a", encoding="utf-8") as f:
        f.write('{"request_id": "r5", "outco')  # SIGKILL mid-write
    summary = summarize(store.run_dir)
    assert summary["cut_off"] is True and summary["verdict"] == "aborted"
    assert summary["requests"]["ok"] == 5
    assert summary["records"]["torn_lines"] == 1
    assert summary["ended_at"] == 1005.0 and summary["duration_s"] == 5.0


def test_a_cut_off_run_with_an_incident_fails(make_store) -> None:
    store = make_store()
    store.event("run_started", ts=1000.0, run_id="x")
    store.event("incident", ts=1003.0, number=1, kind="hang", rule="pp_tail_stall", onset_at=1001.0, detected_at=1003.0,
                killed_pids=[11, 12], gpus_released=True, evidence="incidents/1")
    summary = summarize(store.run_dir)
    assert summary["verdict"] == "fail" and summary["cut_off"] is True
    assert summary["incidents"][0]["killed_pids"] == [11, 12]
    assert summary["incidents"][0]["evidence"] == "incidents/1"


def test_store_writes_flushed_lines_and_strict_json(make_store) -> None:
    store = make_store()
    store.on_request(record(0, ttft=float("nan")))
    # Read while the store is still open: every line is already on disk.
    line = (store.run_dir / "requests.jsonl").read_text().splitlines()[0]
    assert json.loads(line)["ttft_s"] is None
    assert "NaN" not in line


def test_assessments_become_events_only_on_change(make_store) -> None:
    from soak.records import Assessment, DetectorState

    store = make_store()
    for t in range(10):
        store.on_assessment(Assessment(float(t), DetectorState.HEALTHY, ()))
    store.on_assessment(Assessment(10.0, DetectorState.SUSPECT, ()))
    store.on_assessment(Assessment(11.0, DetectorState.SUSPECT, ()))
    store.close()
    lines = [json.loads(x) for x in (Path(store.run_dir) / "events.jsonl").read_text().splitlines()]
    assert [e["state"] for e in lines if e["type"] == "detector_state"] == ["healthy", "suspect"]


def test_one_pass_over_requests_feeds_the_report_and_the_judge_under_the_recorded_criteria(make_store) -> None:
    """rejudge reads requests.jsonl once: a reader's ``on_request`` (the report's
    columns) sees every record in file order, and the criteria are the run's own
    (the criteria_config event), not the defaults."""
    from soak.judge import rejudge

    store = make_store()
    store.event("run_started", ts=1000.0, run_id="x", warmup_s=0.0, duration_s=20.0)
    store.event("criteria_config", criteria={"error_rate": {"max": 0.5}})
    for i in range(8):
        store.on_request(record(i, outcome="ok" if i % 4 else "http_status", ttft=0.1 * (i + 1)))
    store.event("run_ended", ts=1030.0, verdict="pass", reason="duration", exit_code=0)
    store.close()
    seen: list[str] = []
    stats: dict[str, int] = {}
    judgement, summary = rejudge(store.run_dir, on_request=lambda r: seen.append(r["request_id"]), request_stats=stats)
    assert seen == [f"r{i}" for i in range(8)]  # every record, in file order
    assert stats == {}  # nothing unreadable
    # 2 of 8 failed: 25%, within the run's 50% (the default 5% would fail it)
    assert judgement.criteria.passed and judgement.exit_code == 0 and summary.verdict is not None
    assert summary.requests.ok == 6 and summary.raw["latency"]["ttft_s"]["max"] == pytest.approx(0.8)
    assert summary.raw["criteria"]["results"][0]["threshold"] == 0.5


def test_counters_that_go_backwards_are_noted_and_not_complete(make_store) -> None:
    """Before: a dip was read as a restart silently and server_metrics said complete."""
    store = make_store()
    store.event("run_started", ts=1000.0, run_id="x")
    store.event("load_started", ts=1000.0)
    for ts, hits, queries in ((1000.0, 0, 0), (1001.0, 90, 100), (1002.0, 80, 95), (1003.0, 170, 195)):
        store.on_sample(server(ts, hits=hits, queries=queries, prompt=queries))
    store.event("load_stopped", ts=1003.0)
    store.event("run_ended", ts=1003.0, verdict="pass", reason="duration", exit_code=0)
    summary = summarize(store.run_dir)
    metrics = summary["server_metrics"]
    assert metrics["counter_resets"] == {"prefix_cache_hits": 1, "prefix_cache_queries": 1, "prompt_tokens": 1,
                                         "generation_tokens": 0}
    assert metrics["complete"] is False and "went backwards with 0 restart(s)" in metrics["note"]
    # Prometheus increase(): 100, then 95 counted from zero, then 100
    assert summary["server_tokens"]["prompt"] == 295.0


def test_resets_the_restarts_explain_keep_the_figures_complete(make_store) -> None:
    store = make_store()
    store.event("run_started", ts=1000.0, run_id="x")
    store.event("load_started", ts=1000.0)
    store.on_sample(server(1000.0, hits=0, queries=0))
    store.on_sample(server(1001.0, hits=90, queries=100))
    store.event("restart_done", ts=1001.5, number=1)
    store.on_sample(server(1002.0, hits=5, queries=10))
    store.event("load_stopped", ts=1002.0)
    store.event("run_ended", ts=1002.0, verdict="fail", reason="incident", exit_code=1)
    metrics = summarize(store.run_dir)["server_metrics"]
    assert metrics["counter_resets"]["prefix_cache_queries"] == 1
    assert metrics["complete"] is True and metrics["note"] is None


def test_wall_clock_steps_are_listed(make_store) -> None:
    store = make_store()
    store.event("run_started", ts=1000.0, run_id="x")
    store.event("wall_clock_step", ts=1001.0, step_s=3600.0, wall_before=1001.0, wall_after=4601.0)
    clock = summarize(store.run_dir)["clock"]
    assert clock["basis"] == "monotonic" and [s["step_s"] for s in clock["wall_steps"]] == [3600.0]


def test_refused_requests_bring_no_prompt_tokens(make_store) -> None:
    """Before: 417,460 client prompt tokens against the server's 2,860, the planned
    prompts of refused requests counted."""
    store = make_store()
    store.on_request(record(0))
    store.on_request(RequestRecord(request_id="r1", session=None, turn=None, started_at=1.0, ended_at=1.1,
                                   outcome="http_status", http_status=503, prompt_tokens=4000))
    store.on_request(RequestRecord(request_id="r2", session=None, turn=None, started_at=1.0, ended_at=1.1,
                                   outcome="refused", prompt_tokens=4000))
    store.on_request(RequestRecord(request_id="r3", session=None, turn=None, started_at=1.0, ended_at=1.1,
                                   outcome="reset", http_status=200, prompt_tokens=700))
    assert summarize(store.run_dir)["tokens"]["prompt"] == 1000 + 700
