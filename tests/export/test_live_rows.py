"""The live view's GPU/stage rows and detector row, on data: max and mean over
the last seconds (a busy pipeline caught between bursts never reads as eight
GPUs at 0%), which rule holds the detector in suspect and how far along it is,
the build label, and no time left once the load stopped."""

from __future__ import annotations

import io
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from soak.clock import ManualClock
from soak.events import EventType
from soak.export.live import LiveView
from soak.export.live_rows import StageWindow, levels_text, suspect_text
from soak.records import Assessment, Decision, DetectorState, IncidentKind, RuleState, RuleStatus, RunInfo
from soak.samples import GpuReading, GpuSample, GpuSource

T0 = 1000.0


def _gpus(ts: float, levels: list[float], source: GpuSource = GpuSource.SIM) -> GpuSample:
    return GpuSample(ts=ts, source=source, gpus=tuple(GpuReading(index=i, util_pct=v) for i, v in enumerate(levels)))


def test_a_pipeline_between_bursts_reads_busy_and_a_dark_gpu_reads_dark() -> None:
    window = StageWindow(5.0)
    # each stage busy in turn, as a pipeline is: the instant reading of the last sample is 0% on 7 of 8
    for step in range(16):
        window.add(_gpus(T0 + step * 0.5, [100.0 if (step % 7) == i else 0.0 for i in range(7)] + [0.0]))
    levels = window.levels(T0 + 7.5)
    assert [lv.label for lv in levels] == [f"gpu {i}" for i in range(8)]
    assert all(lv.max_pct == 100.0 for lv in levels[:7]) and levels[7].max_pct == 0.0
    assert all(0 < lv.mean_pct < 50 for lv in levels[:7]) and levels[7].mean_pct == 0.0
    assert levels_text(levels).endswith("0/0")


def test_old_samples_leave_the_window_and_the_last_reading_stays_when_nothing_is_new() -> None:
    window = StageWindow(5.0)
    window.add(_gpus(T0, [100.0, 100.0]))
    window.add(_gpus(T0 + 6.0, [0.0, 30.0]))
    assert [(lv.max_pct, lv.mean_pct) for lv in window.levels(T0 + 6.0)] == [(0.0, 0.0), (30.0, 30.0)]
    assert [lv.max_pct for lv in window.levels(T0 + 60.0)] == [0.0, 30.0]


def test_stage_cpu_rows_are_stages_not_gpus() -> None:
    window = StageWindow(5.0)
    window.add(_gpus(T0, [80.0, 2.0], GpuSource.STAGE_CPU))
    assert [lv.label for lv in window.levels(T0)] == ["stage 0 CPU", "stage 1 CPU"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.floats(0, 100), min_size=3, max_size=3), min_size=1, max_size=20))
def test_each_row_is_the_max_and_mean_of_what_the_window_saw(rows) -> None:
    window = StageWindow(5.0)
    for i, levels in enumerate(rows):
        window.add(_gpus(T0 + i * 0.2, levels))
    seen = rows[-min(len(rows), 26):]  # 0.2 s apart: the last 5 s
    for gpu, level in enumerate(window.levels(T0 + (len(rows) - 1) * 0.2)):
        values = [r[gpu] for r in seen]
        assert level.max_pct == max(values)
        assert min(values) - 1e-9 <= level.mean_pct <= max(values) + 1e-9


pending = st.builds(lambda rule, elapsed, threshold: RuleStatus(rule, RuleState.PENDING, elapsed_s=elapsed,
                                                                 threshold_s=threshold),
                    st.sampled_from(["pp_tail_stall", "stage_cpu_stall", "generation_frozen", "log_signature"]),
                    st.floats(0, 100), st.one_of(st.none(), st.floats(0.5, 300)))


@settings(max_examples=100, deadline=None)
@given(st.lists(pending, min_size=1, max_size=4, unique_by=lambda r: r.rule))
def test_suspect_always_names_a_pending_rule_and_how_far_along_it_is(rules) -> None:
    text = suspect_text(Assessment(T0, DetectorState.SUSPECT, tuple(rules)))
    assert text is not None and text.startswith("suspect: ")
    named = next(r for r in rules if r.rule in text)
    assert f"{named.elapsed_s:.1f}" in text
    if named.threshold_s:
        assert f"/{named.threshold_s:.1f} s" in text


def test_suspect_names_the_rule_furthest_along_then_says_it_is_clearing() -> None:
    rules = (RuleStatus("generation_frozen", RuleState.PENDING, elapsed_s=10.0, threshold_s=40.0),
             RuleStatus("stage_cpu_stall", RuleState.PENDING, elapsed_s=2.6, threshold_s=5.0))
    text = suspect_text(Assessment(T0, DetectorState.SUSPECT, rules))
    assert text == "suspect: stage_cpu_stall 2.6/5.0 s (+1 more)"
    clear = (RuleStatus("stage_cpu_stall", RuleState.CLEAR),)
    assert suspect_text(Assessment(T0 + 1, DetectorState.SUSPECT, clear), last=text) == \
        "suspect: clearing (was stage_cpu_stall 2.6/5.0 s (+1 more))"
    assert suspect_text(Assessment(T0 + 9, DetectorState.HEALTHY, clear), last=text) is None
    decided = Decision("pp_tail_stall", IncidentKind.HANG, T0, T0 + 4, (), {})
    assert suspect_text(Assessment(T0 + 4, DetectorState.HUNG, (), (decided,))) == "hung: pp_tail_stall"


def _info() -> RunInfo:
    return RunInfo(run_id="night-1", run_dir=Path("/tmp/x"), started_at=T0, duration_s=120.0, warmup_s=0,
                   target_kind="simulator", base_url="http://127.0.0.1:1", model="m", root_pid=None)


async def test_the_build_label_is_in_the_start_line_and_no_time_is_left_once_the_load_stopped() -> None:
    clock = ManualClock(T0)
    out = io.StringIO()
    view = LiveView(clock=clock, mode="plain", stream=out, plain_interval_s=3600)
    view.on_event(EventType.BUILD, {"ts": T0, "label": "nightly-abc", "build": "nightly-abc"})
    view.on_start(_info())
    assert out.getvalue().splitlines()[0].startswith("soak: run night-1 (build nightly-abc) against simulator")
    clock.advance(30.0)
    assert "30s elapsed, 1m30s left" in view.state.line(clock.now())
    assert "| build nightly-abc |" in view.state.line(clock.now())
    view.on_event(EventType.LOAD_STOPPED, {"ts": clock.now(), "reason": "incident 1: on_hang: stop"})
    clock.advance(15.0)
    line = view.state.line(clock.now())
    assert line.startswith("soak stopped after 30s of load |") and "left" not in line
    view.close()
    assert "left" not in out.getvalue().splitlines()[-1]


async def test_the_terminal_table_shows_max_and_mean_per_gpu_and_the_build() -> None:
    clock = ManualClock(T0)
    out = io.StringIO()
    view = LiveView(clock=clock, mode="rich", stream=out, refresh_s=3600)
    view.on_event(EventType.BUILD, {"ts": T0, "build": "vllm 0.11.0 · 1a2b3c"})
    view.on_start(_info())
    for step in range(8):
        clock.advance(0.5)
        view.on_sample(_gpus(clock.now(), [100.0 if step % 2 else 0.0, 0.0]))
    view.render()
    view.close()
    text = out.getvalue()
    assert "build vllm 0.11.0 · 1a2b3c" in text
    assert "max 100.0%  mean  50.0%" in text and "max   0.0%  mean   0.0%" in text


def _pending_sequential_status() -> Assessment:
    """The detector's own first suspect assessment on a tail that goes dark beside
    spinning upstream GPUs (the sequential pp_tail_stall, issue 37)."""
    from soak.detect import Detector, DetectorConfig
    from soak.records import Topology
    from soak.samples import ClientSample, ServerSample

    detector = Detector(DetectorConfig(), topology=Topology.pipeline(8))
    for step in range(60):
        t = T0 + step * 0.25
        stalled = t >= T0 + 5.0
        detector.observe(_gpus(t, [100.0] * 7 + [0.0 if stalled else 60.0]))
        if step % 4 == 0:
            n = min(step, 20)
            detector.observe(ServerSample(t, True, {"generation_tokens": 100.0 + n * 30, "num_requests_running": 4,
                                                    "kv_cache_usage_perc": 0.3 + n * 1e-4,
                                                    "prefix_cache_queries": 1000.0, "prompt_tokens": 10.0}))
            detector.observe(ClientSample(t, 4, 5000 + n * 300, 500 + n * 30, 0, 0.0, 4))
        assessment = detector.assess(t)
        if assessment.state is DetectorState.SUSPECT:
            return assessment
    raise AssertionError("the detector never suspected the dark tail")


def test_a_sequential_rule_is_shown_as_evidence_against_its_bound_not_as_seconds() -> None:
    assessment = _pending_sequential_status()
    status = assessment.rule("pp_tail_stall")
    text = suspect_text(assessment)
    bound = status.evidence["thresholds"]["bound"]
    assert text is not None and text.startswith(f"suspect: pp_tail_stall evidence {status.elapsed_s:.1f}/{bound:.1f} (")
    assert text.endswith("% of the bound)") and " s" not in text


def test_the_incident_line_gives_the_latency_as_the_interval_and_a_point_estimate_as_one() -> None:
    from soak.export.live_rows import incident_text
    from soak.records import IncidentRecord

    said = "hang (pp_tail_stall): detected 0.9s after onset; SIGKILL to 3 processes; GPUs free 0.40s after the kill"
    base = dict(number=2, kind=IncidentKind.HANG, rule="pp_tail_stall", onset_at=1_800_000_000.7,
                detected_at=1_800_000_001.6, killed_pids=(1, 2, 3), gpus_released=True, gpu_free_s=0.4,
                evidence="incidents/2", summary=said)
    interval = IncidentRecord(**base, onset_earliest_at=1_800_000_000.0, onset_latest_at=1_800_000_000.7)
    out = io.StringIO()
    LiveView(clock=ManualClock(T0), mode="plain", stream=out).on_incident(interval)  # the line that stays
    assert out.getvalue() == incident_text(interval) + "\n"
    assert incident_text(interval) == (
        "soak: incident 2: hang (pp_tail_stall): detected 0.9-1.6 s after the onset (onset between 08:00:00.0 "
        "and 08:00:00.7 UTC); SIGKILL to 3 processes; GPUs free 0.40s after the kill")
    assert incident_text(IncidentRecord(**base)) == (
        "soak: incident 2: hang (pp_tail_stall): detected 0.9 s after the onset (point estimate; onset at "
        "08:00:00.7 UTC); SIGKILL to 3 processes; GPUs free 0.40s after the kill")
