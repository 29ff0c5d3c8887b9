"""The live view: the rich status and the plain line carry what the operator needs."""

from __future__ import annotations

import io
from pathlib import Path

from soak.clock import ManualClock
from soak.records import Assessment, DetectorState, RuleState, RuleStatus
from soak.export.live import LiveView
from soak.records import RunInfo
from soak.samples import GpuReading, GpuSample, GpuSource, RequestRecord, ServerSample


def feed(view: LiveView, clock: ManualClock) -> None:
    view.on_sample(ServerSample(ts=clock.now(), ok=True, values={"prefix_cache_hits": 0, "prefix_cache_queries": 0}))
    for i in range(20):
        clock.advance(0.5)
        view.on_request(RequestRecord(request_id=f"r{i}", session="s", turn=i, started_at=clock.now() - 1,
                                      ended_at=clock.now(), outcome="ok" if i % 10 else "timeout_stall",
                                      prompt_tokens=200_000 + i, output_tokens=50, ttft_s=0.2 + i / 100))
    view.on_sample(ServerSample(ts=clock.now(), ok=True, values={"prefix_cache_hits": 940, "prefix_cache_queries": 1000}))
    view.on_sample(GpuSample(ts=clock.now(), source=GpuSource.SIM,
                             gpus=tuple(GpuReading(index=i, util_pct=100.0 if i < 7 else 0.0) for i in range(8))))
    view.on_assessment(Assessment(clock.now(), DetectorState.SUSPECT, (
        RuleStatus("generation_frozen", RuleState.CLEAR, elapsed_s=0.4, threshold_s=20.0),
        RuleStatus("stage_cpu_stall", RuleState.PENDING, elapsed_s=2.6, threshold_s=5.0))))


def info(clock: ManualClock) -> RunInfo:
    return RunInfo(run_id="r1", run_dir=Path("/tmp/x"), started_at=clock.now(), duration_s=3960, warmup_s=0,
                   target_kind="simulator", base_url="http://127.0.0.1:1", model="m", root_pid=None)


async def test_plain_line_for_nightly_logs() -> None:
    clock = ManualClock(1000.0)
    out = io.StringIO()
    view = LiveView(clock=clock, mode="auto", stream=out, plain_interval_s=3600)
    assert view.mode == "plain"  # a StringIO is not a terminal
    view.on_start(info(clock))
    feed(view, clock)
    view.render()
    view.close()
    line = out.getvalue().splitlines()[-1]
    for words in ("10s elapsed", "1h5m50s left", "ok 18 failed 2", "ttft p50", "context 200.0K", "prefix hit 94.0%",
                  "gpu% max/mean 100/100 100/100 100/100 100/100 100/100 100/100 100/100 0/0",
                  "detector suspect: stage_cpu_stall 2.6/5.0 s"):
        assert words in line, (words, line)
    assert "tok/s" in line


async def test_rich_status_on_a_terminal() -> None:
    clock = ManualClock(1000.0)
    out = io.StringIO()
    view = LiveView(clock=clock, mode="rich", stream=out, refresh_s=3600)
    view.on_start(info(clock))
    feed(view, clock)
    view.render()
    view.close()
    text = out.getvalue()
    for words in ("requests", "18 ok", "2 failed", "tokens/s", "TTFT", "prefix hit", "94.0%", "gpu 7", "detector",
                  "suspect: stage_cpu_stall 2.6/5.0 s", "max 100.0%  mean 100.0%"):
        assert words in text, words
    assert "█" in text  # utilization bars


async def test_requests_the_harness_cut_are_not_shown_as_failed() -> None:
    clock = ManualClock(1000.0)
    view = LiveView(clock=clock, mode="plain", stream=io.StringIO(), plain_interval_s=3600)
    view.on_start(info(clock))
    for i, (outcome, cut_by) in enumerate([("ok", None), ("http_status", None), ("aborted", "incident"),
                                           ("aborted", "drain")]):
        view.on_request(RequestRecord(request_id=f"r{i}", session="s", turn=i, started_at=clock.now(),
                                      ended_at=clock.now(), outcome=outcome, cut_by=cut_by))
    assert "requests ok 1 failed 1 cut 2 |" in view.state.line(clock.now())


from hypothesis import given, settings, strategies as st  # noqa: E402

from soak.records import IncidentKind, IncidentRecord  # noqa: E402


@settings(max_examples=100, deadline=None)
@given(said=st.text(max_size=60))
def test_lines_that_quote_the_server_reach_the_terminal_without_control_characters(said) -> None:
    """An incident's summary and a warning quote the server (worker titles, errors, log
    lines): whatever it said, the plain view prints no escape or control character."""
    import asyncio

    clock = ManualClock(1000.0)
    out = io.StringIO()

    async def show() -> None:
        view = LiveView(clock=clock, mode="plain", stream=out, plain_interval_s=3600)
        view.on_start(info(clock))
        view.on_incident(IncidentRecord(number=1, kind=IncidentKind.HANG, rule="stage_cpu_stall", onset_at=999.0,
                                        detected_at=1000.0, killed_pids=(), gpus_released=None, gpu_free_s=None,
                                        evidence="incidents/1", summary=f"hang: {said}"))
        view.on_event("warning", {"ts": 1000.0, "message": said})
        view.close()

    asyncio.run(show())
    assert "hang: " in out.getvalue()
    for line in out.getvalue().split("\n"):
        assert line.isprintable(), repr(line)


def test_a_stale_gpu_source_warns_except_while_the_harness_relaunches_the_server() -> None:
    import asyncio

    from soak.events import EventType

    clock = ManualClock(1000.0)
    out = io.StringIO()

    async def show() -> None:
        view = LiveView(clock=clock, mode="plain", stream=out, plain_interval_s=3600)
        view.on_start(info(clock))
        view.on_event(EventType.RESTART_STARTED, {"ts": 1000.0})
        view.on_event(EventType.GPU_SOURCE_STALE, {"ts": 1001.0, "message": "stage CPU: no worker measured yet"})
        view.on_event(EventType.RESTART_DONE, {"ts": 1040.0})
        view.on_event(EventType.GPU_SOURCE_STALE, {"ts": 1050.0, "message": "stale GPU readings: 9.0s old"})
        view.close()

    asyncio.run(show())
    warnings = [line for line in out.getvalue().splitlines() if line.startswith("soak: warning:")]
    assert warnings == ["soak: warning: stale GPU readings: 9.0s old"]
