"""The detector's rules and states on hand-built sample sequences (no I/O, no clock)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from soak.config import load_run_config
from soak.detect import Detector, DetectorConfig
from soak.records import DetectorState, IncidentKind, RuleState, Topology
from soak.detect.config import PpTailStallConfig
from soak.errors import ConfigError
from soak.probes.logwatch import parse_log_line
from soak.samples import (
    ClientSample,
    GpuReading,
    GpuSample,
    GpuSource,
    HealthSample,
    LogSample,
    ProcessSample,
    ServerSample,
)

T0 = 1_800_000_000.0
PP8 = Topology.pipeline(8)


def gpus(t, tail, upstream=100.0, samples=None):
    readings = tuple(
        GpuReading(i, tail if i == 7 else upstream, util_samples=tuple(samples[i]) if samples else ())
        for i in range(8)
    )
    return GpuSample(T0 + t, GpuSource.SIM, readings)


def server(t, gen, running=4, kv=0.5, queries=1000.0):
    return ServerSample(
        T0 + t, True,
        {"generation_tokens": gen, "num_requests_running": running, "kv_cache_usage_perc": kv,
         "prefix_cache_queries": queries, "prompt_tokens": 10.0},
    )


def client(t, bytes_total, in_flight=4, streaming=4):
    return ClientSample(T0 + t, in_flight, bytes_total, bytes_total // 10, 0, 0.0, streaming)


def make(**overrides):
    return Detector(DetectorConfig.model_validate(overrides), topology=PP8)


def feed(detector, samples, until, step=0.5, start=0.0):
    """Observe ``samples`` (time-ordered) with assess() every ``step`` s; return decisions and states."""
    samples = sorted(samples, key=lambda s: s.ts)
    decisions, states = [], []
    t = T0 + start
    i = 0
    while t <= T0 + until:
        while i < len(samples) and samples[i].ts <= t:
            detector.observe(samples[i])
            i += 1
        a = detector.assess(t)
        decisions.extend(a.new_incidents)
        states.append((round(t - T0, 2), a.state))
        t += step
    return decisions, states


def healthy_run(until, *, gen_every=1.0, start=0.0):
    """Busy and progressing: tokens, KV, client bytes every second; decode GPUs at 60%."""
    out = []
    t = start
    n = 0
    while t <= until:
        out += [server(t, 100.0 + n * 30, kv=0.3 + n * 1e-4), client(t, 5000 + n * 300), gpus(t, 60.0, 60.0)]
        t += gen_every
        n += 1
    return out


# -- pp_tail_stall ------------------------------------------------------------------


def _tail_stall_at_10_25():
    samples = healthy_run(10.0)
    # from t=10.25 the tail idles while upstream spins; counters freeze at their t=10 values
    t = 10.25
    while t < 30:
        samples += [gpus(t, 0.0)]
        t += 0.5
    for t in range(11, 30):
        samples += [server(t, 100.0 + 10 * 30, kv=0.3 + 10 * 1e-4), client(t, 5000 + 10 * 300)]
    return samples


def test_pp_tail_stall_decides_on_sequential_evidence_within_two_seconds_with_an_onset_interval():
    """Issue 37: the tail dark beside a spinning upstream and no progress is overwhelming
    evidence; it decides in a few readings, not after a fixed window, and says when the
    hang began at the earliest and the latest."""
    det = make()
    decisions, states = feed(det, _tail_stall_at_10_25(), 30)
    [d] = decisions
    assert d.rule == "pp_tail_stall" and d.kind is IncidentKind.HANG
    assert d.decided_at - (T0 + 10.25) <= 2.0
    assert d.onset_at == pytest.approx(T0 + 10.25, abs=1e-3)
    interval = d.evidence["onset_interval"]
    # the last working reading (t=10, 60%) averages up to a second before it
    assert interval["earliest"] <= T0 + 10.0 and interval["latest"] == pytest.approx(T0 + 10.25, abs=1e-3)
    assert d.evidence["thresholds"]["bound"] == pytest.approx(math.log(10_000 * 3600 / 0.5), abs=1e-3)
    assert d.evidence["signals"]["contributions"]["tail_pattern"] > 0
    assert any("tail_pattern" in r or "last stage GPU dark" in r for r in d.reasons)
    json.dumps(d.to_json())
    kinds = [s for _, s in states]
    assert kinds[0] is DetectorState.HEALTHY and kinds[-1] is DetectorState.HUNG


def test_pp_tail_stall_fires_after_its_window_with_onset_at_the_pattern_start():
    """The window rule, kept for stage CPU and for a config that switches the evidence off."""
    det = make(pp_tail_stall={"sequential": {"enabled": False}})
    decisions, states = feed(det, _tail_stall_at_10_25(), 30)
    assert len(decisions) == 1
    d = decisions[0]
    assert d.rule == "pp_tail_stall" and d.kind is IncidentKind.HANG
    assert d.onset_at == pytest.approx(T0 + 10.25, abs=1e-3)
    cfg = DetectorConfig().pp_tail_stall
    assert cfg.window <= d.decided_at - d.onset_at <= cfg.window + 1.0
    assert d.evidence["thresholds"]["window_s"] == cfg.window
    assert d.evidence["signals"]["tail_gpus"] == [7]
    assert any("GPU 7" in r for r in d.reasons)
    json.dumps(d.to_json())  # evidence is plain JSON for incident.json
    # states: healthy, then suspect while the window fills, then hung and stays hung
    kinds = [s for _, s in states]
    assert kinds[0] is DetectorState.HEALTHY
    assert DetectorState.SUSPECT in kinds
    assert kinds[-1] is DetectorState.HUNG
    assert kinds.index(DetectorState.SUSPECT) < kinds.index(DetectorState.HUNG)


def test_pp_tail_stall_needs_requests_in_flight():
    det = make()
    samples = [gpus(t * 0.5, 0.0) for t in range(60)]
    samples += [server(t, 100.0, running=0) for t in range(30)]
    samples += [client(t, 5000, in_flight=0, streaming=0) for t in range(30)]
    decisions, _ = feed(det, samples, 29)
    assert decisions == []


def test_pp_tail_stall_does_not_fire_while_tokens_still_flow():
    """The GPU pattern alone is not enough: progress after it began clears the rule."""
    det = make()
    samples = [gpus(t * 0.5, 0.0) for t in range(60)] + healthy_run(29)
    samples = [s for s in samples if not (isinstance(s, GpuSample) and s.gpus[0].util_pct == 60.0)]
    decisions, _ = feed(det, samples, 29)
    assert decisions == []
    assert det.assess(T0 + 29).rule("pp_tail_stall").state is RuleState.CLEAR


def test_pp_tail_stall_uses_200ms_util_samples_to_date_the_onset():
    det = make()
    busy = {i: [60.0] * 5 for i in range(8)}
    samples = []
    for k in range(10):
        samples.append(gpus(k, 60.0, 60.0, samples=busy))
    # the reading at t=10 holds 5 samples (9.2 .. 10.0); the stall begins at the third (9.6)
    split = {i: ([60.0, 60.0] + [0.0] * 3 if i == 7 else [60.0, 60.0] + [100.0] * 3) for i in range(8)}
    samples.append(gpus(10, 0.0, samples=split))
    stalled = {i: [0.0 if i == 7 else 100.0] * 5 for i in range(8)}
    for k in range(11, 20):
        samples.append(gpus(k, 0.0, samples=stalled))
    samples += [server(t, 500.0) for t in range(20)] + [client(t, 9000) for t in range(20)]
    decisions, _ = feed(det, samples, 20)
    assert [d.rule for d in decisions] == ["pp_tail_stall"]
    assert decisions[0].onset_at == pytest.approx(T0 + 9.6, abs=1e-3)


def test_one_stage_pipeline_has_no_tail_rule():
    det = Detector(DetectorConfig(), topology=Topology.pipeline(1))
    det.observe(GpuSample(T0, GpuSource.SIM, (GpuReading(0, 0.0),)))
    assert det.assess(T0).rule("pp_tail_stall").state is RuleState.INACTIVE


# -- generation_frozen ----------------------------------------------------------------


def frozen_after(t_stop, until, *, kv_moves=False, client_moves=False):
    samples = healthy_run(t_stop)
    n_stop = int(t_stop)
    for t in range(n_stop + 1, int(until) + 1):
        k = t - n_stop
        kv = 0.3 + n_stop * 1e-4 + (k * 1e-4 if kv_moves else 0.0)
        samples.append(server(t, 100.0 + n_stop * 30, kv=kv))
        # a lone cold prefill: its stream has no first token yet
        streaming = 0 if kv_moves else 4
        samples.append(client(t, 5000 + n_stop * 300 + (k * 50 if client_moves else 0), streaming=streaming))
        samples.append(gpus(t, 0.0, 0.0))
    return samples


def test_generation_frozen_fires_at_the_floor_when_healthy_gaps_are_short():
    det = make()
    decisions, _ = feed(det, frozen_after(20, 60), 60)
    assert [d.rule for d in decisions] == ["generation_frozen"]
    d = decisions[0]
    floor = DetectorConfig().generation_frozen.floor
    assert d.onset_at == pytest.approx(T0 + 20, abs=1e-3)
    assert d.evidence["thresholds"]["threshold_s"] == floor
    assert d.decided_at - d.onset_at == pytest.approx(floor, abs=1.0)


def test_generation_frozen_is_not_fooled_by_a_long_prefill_that_moves_kv_usage():
    """A cold 230K prefill: no tokens for ~900 steps, but KV usage grows every step."""
    det = make()
    decisions, _ = feed(det, frozen_after(20, 80, kv_moves=True), 80)
    assert decisions == []


def test_generation_frozen_counts_client_bytes_as_progress():
    det = make(client_stall={"enabled": False})
    decisions, _ = feed(det, frozen_after(20, 80, client_moves=True), 80)
    assert decisions == []


def test_generation_frozen_threshold_is_learned_from_healthy_gaps_and_clamped():
    cfg = DetectorConfig().generation_frozen
    assert cfg.threshold(1.0) == cfg.floor
    assert cfg.threshold(6.0) == 6.0 * cfg.safety_factor
    assert cfg.threshold(1000.0) == cfg.ceiling
    # progress every 6 s: learned gap 6 s -> threshold 30 s; a 25 s freeze is not a hang, 35 s is
    det = make(client_stall={"enabled": False})
    samples = healthy_run(60, gen_every=6.0)
    last = 60
    for t in range(last + 1, last + 40):
        samples += [server(t, 100.0 + 10 * 30, kv=0.3 + 10 * 1e-4), gpus(t, 0.0, 0.0)]
    early = [s for s in samples if s.ts <= T0 + last + 25]
    decisions, _ = feed(det, early, last + 25)
    assert decisions == []
    status = det.assess(T0 + last + 25).rule("generation_frozen")
    assert status.threshold_s == pytest.approx(30.0)
    assert status.state is RuleState.PENDING
    more, _ = feed(det, [s for s in samples if s.ts > T0 + last + 25], last + 40, start=last + 25.5)
    assert [d.rule for d in more] == ["generation_frozen"]


def test_generation_frozen_gives_startup_grace_before_the_first_token():
    """A compile pause at start-up: requests running, nothing moves for two minutes."""
    det = make(client_stall={"enabled": False})
    samples = [server(t, 0.0, kv=0.0, queries=0.0) for t in range(0, 130)]
    samples += [gpus(t, 100.0, 100.0) for t in range(0, 130)]
    decisions, _ = feed(det, samples, 129)
    assert decisions == []
    status = det.assess(T0 + 129).rule("generation_frozen")
    assert status.threshold_s == DetectorConfig().generation_frozen.startup_grace


def test_generation_frozen_ignores_idle_time():
    det = make()
    samples = healthy_run(10)
    samples += [server(t, 400.0, running=0, kv=0.301) for t in range(11, 100)]
    samples += [client(t, 8000, in_flight=0, streaming=0) for t in range(11, 100)]
    decisions, _ = feed(det, samples, 99)
    assert decisions == []
    assert det.assess(T0 + 99).rule("generation_frozen").state is RuleState.INACTIVE


def test_generation_frozen_stands_down_while_metrics_fail():
    det = make(client_stall={"enabled": False})
    samples = healthy_run(10)
    samples += [ServerSample(T0 + t, False, error="timeout") for t in range(11, 60)]
    samples += [client(t, 8000) for t in range(11, 60)]
    decisions, _ = feed(det, samples, 59)
    assert decisions == []
    assert det.assess(T0 + 59).rule("generation_frozen").state is RuleState.INACTIVE


# -- client_stall ---------------------------------------------------------------------


def test_client_stall_fires_when_every_stream_goes_silent():
    det = make(generation_frozen={"enabled": False}, pp_tail_stall={"enabled": False})
    samples = [client(t, 1000 + 100 * t) for t in range(0, 20)]
    samples += [client(t, 1000 + 100 * 19) for t in range(20, 80)]
    decisions, _ = feed(det, samples, 79)
    assert [d.rule for d in decisions] == ["client_stall"]
    floor = DetectorConfig().client_stall.floor
    assert decisions[0].onset_at == pytest.approx(T0 + 19, abs=1e-3)
    assert decisions[0].decided_at - decisions[0].onset_at == pytest.approx(floor, abs=1.0)


def test_keepalive_bytes_without_tokens_are_not_progress():
    """A server that keeps streams open with SSE comments (``: ping``): bytes grow
    every second, generated tokens do not. Both client-fed rules see the silence."""
    def pings(t, base_tokens):
        return ClientSample(T0 + t, 4, 100_000 + 50 * t, base_tokens, 0, 0.0, 4)

    det = make(generation_frozen={"enabled": False}, pp_tail_stall={"enabled": False})
    samples = [client(t, 1000 + 100 * t) for t in range(0, 20)]
    samples += [pings(t, (1000 + 100 * 19) // 10) for t in range(20, 80)]
    decisions, _ = feed(det, samples, 79)
    assert [d.rule for d in decisions] == ["client_stall"]
    assert decisions[0].onset_at == pytest.approx(T0 + 19, abs=1e-3)
    assert "no generated token arrived" in decisions[0].reasons[0]
    det = make(client_stall={"enabled": False})
    frozen = [s for s in frozen_after(20, 80) if not isinstance(s, ClientSample)]
    frozen += [pings(t, 500) for t in range(21, 81)]
    decisions, _ = feed(det, frozen, 80)
    assert [d.rule for d in decisions] == ["generation_frozen"]


def test_client_stall_waits_for_a_stream_past_its_first_token():
    det = make(generation_frozen={"enabled": False})
    samples = [client(t, 0, in_flight=3, streaming=0) for t in range(0, 120)]
    decisions, _ = feed(det, samples, 119)
    assert decisions == []


# -- log_signature --------------------------------------------------------------------

WATCHDOG = (
    "(Worker_PP3 pid=1234) [rank3]:[E ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=40427, OpType=BROADCAST, NumelIn=6, NumelOut=6, Timeout(ms)=60000) ran for 60012 "
    "milliseconds before timing out."
)
SHM = (
    "INFO 12-02 16:00:00 [shm_broadcast.py:466] No available shared memory broadcast block found in 60 seconds."
)
DEAD = "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause."


def log_sample(t, line):
    m = parse_log_line(line)
    return LogSample(T0 + t, m.signature, line, m.fatal, dict(m.fields))


def test_watchdog_line_is_a_hang_dated_by_its_timeout_when_nothing_better_is_known():
    det = make()
    det.observe(log_sample(100, WATCHDOG))
    a = det.assess(T0 + 100.2)
    (d,) = a.new_incidents
    assert d.rule == "log_signature" and d.kind is IncidentKind.HANG
    assert d.onset_at == pytest.approx(T0 + 40, abs=1e-3)
    assert d.evidence["signals"]["lines"][0]["fields"]["op_type"] == "BROADCAST"


def test_watchdog_line_onset_is_the_last_progress_when_metrics_saw_it():
    det = make()
    for s in healthy_run(50):
        det.observe(s)
    det.observe(log_sample(110, WATCHDOG))
    (d,) = det.assess(T0 + 110.5).new_incidents
    assert d.onset_at == pytest.approx(T0 + 50, abs=1e-3)


def test_engine_dead_is_a_crash_and_shm_wait_only_makes_suspect():
    det = make()
    det.observe(log_sample(1, SHM))
    a = det.assess(T0 + 2)
    assert a.new_incidents == () and a.state is DetectorState.SUSPECT
    det.observe(log_sample(3, DEAD))
    (d,) = det.assess(T0 + 3.5).new_incidents
    assert d.kind is IncidentKind.CRASH


# -- server_gone ----------------------------------------------------------------------


def test_process_exit_is_a_crash():
    det = make()
    det.observe(ProcessSample(T0 + 1, 42, True))
    assert det.assess(T0 + 1).new_incidents == ()
    det.observe(ProcessSample(T0 + 2, 42, False, exit_code=1))
    (d,) = det.assess(T0 + 2.5).new_incidents
    assert (d.rule, d.kind, d.onset_at) == ("server_gone", IncidentKind.CRASH, T0 + 2)
    assert d.evidence["signals"]["exit_code"] == 1


def test_observe_says_when_a_sample_settles_a_rule_so_the_loop_need_not_wait_for_its_tick():
    det = make()
    assert det.observe(gpus(1, 0.0)) is False
    assert det.observe(log_sample(2, SHM)) is False  # a warning: suspect, decided by time
    assert det.observe(log_sample(3, WATCHDOG)) is True
    assert det.observe(log_sample(3.1, WATCHDOG)) is False  # the same incident, already settled
    (d,) = det.assess(T0 + 3.1).new_incidents
    assert d.rule == "log_signature"
    assert det.observe(ProcessSample(T0 + 4, 42, False, exit_code=1)) is False  # decided: nothing to hurry
    det.reset(T0 + 10)
    assert det.observe(ProcessSample(T0 + 11, 43, True)) is False
    assert det.observe(ProcessSample(T0 + 12, 43, False, exit_code=-9)) is True  # the restarted server died
    (d,) = det.assess(T0 + 12).new_incidents
    assert d.rule == "server_gone"


def test_health_must_fail_several_times_over_a_window():
    det = make()
    det.observe(HealthSample(T0, True, 200))
    det.observe(HealthSample(T0 + 1, False, 503))
    det.observe(HealthSample(T0 + 2, False, 503))
    a = det.assess(T0 + 2.1)
    assert a.new_incidents == () and a.rule("server_gone").state is RuleState.PENDING
    det.observe(HealthSample(T0 + 3, True, 200))  # recovered: the run of failures is broken
    det.observe(HealthSample(T0 + 4, False, None, error="refused"))
    det.observe(HealthSample(T0 + 5, False, None, error="refused"))
    assert det.assess(T0 + 5.1).new_incidents == ()
    det.observe(HealthSample(T0 + 6, False, None, error="refused"))
    det.observe(HealthSample(T0 + 7, False, None, error="refused"))
    (d,) = det.assess(T0 + 7.1).new_incidents
    assert (d.rule, d.kind, d.onset_at) == ("server_gone", IncidentKind.SERVER_GONE, T0 + 4)


# -- states, hysteresis, reset ------------------------------------------------------------


def test_suspect_returns_to_healthy_only_after_clear_after():
    det = make(clear_after=5.0)
    det.observe(ProcessSample(T0, 1, True))
    det.observe(HealthSample(T0 + 1, False, 503))
    assert det.assess(T0 + 1).state is DetectorState.SUSPECT
    det.observe(HealthSample(T0 + 2, True, 200))
    assert det.assess(T0 + 2).state is DetectorState.SUSPECT
    assert det.assess(T0 + 5.5).state is DetectorState.SUSPECT
    assert det.assess(T0 + 6.0).state is DetectorState.HEALTHY


def test_hung_is_sticky_with_one_decision_until_reset():
    det = make()
    det.observe(ProcessSample(T0, 1, False, exit_code=-9))
    assert len(det.assess(T0 + 1).new_incidents) == 1
    for k in range(2, 10):
        a = det.assess(T0 + k)
        assert a.state is DetectorState.HUNG and a.new_incidents == ()
    det.reset(T0 + 10)
    # the old server's samples are ignored after the reset
    det.observe(ProcessSample(T0 + 9.5, 1, False, exit_code=-9))
    det.observe(ProcessSample(T0 + 11, 2, True))
    a = det.assess(T0 + 11)
    assert a.state is DetectorState.HEALTHY and a.new_incidents == ()
    assert det.decision is None


def test_reset_keeps_learned_gaps_and_restores_startup_grace():
    det = make(client_stall={"enabled": False})
    for s in healthy_run(60, gen_every=6.0):
        det.observe(s)
    det.reset(T0 + 61)
    det.observe(server(62, 0.0, kv=0.0))
    status = det.assess(T0 + 62).rule("generation_frozen")
    assert status.threshold_s == DetectorConfig().generation_frozen.startup_grace
    for t in range(63, 70):
        det.observe(server(t, float(t), kv=0.0))
    status = det.assess(T0 + 70).rule("generation_frozen")
    assert status.threshold_s == pytest.approx(30.0)



def cold_start_then_steady(start, *, cold_gap, steady_until):
    """A server life as the real vLLM showed it: 4 sessions' first long prompts prefill
    at once (one stream at a time starts, ``cold_gap`` s apart), then every stream
    decodes with a progress signal each second until ``steady_until``."""
    out, gen, sent = [], 100.0, 5000
    t = start
    for streaming in range(1, 5):  # the first token, then a long silent prefill per stream
        gen += 30
        sent += 300
        out += [server(t, gen), ClientSample(T0 + t, 4, sent, sent // 10, 0, 0.0, streaming)]
        t += cold_gap if streaming < 4 else 1.0
    while t <= steady_until:
        gen += 30
        sent += 300
        out += [server(t, gen), client(t, sent)]
        t += 1.0
    return out, gen, sent


def test_a_cold_start_pause_does_not_set_the_threshold_once_every_stream_runs():
    det = make(client_stall={"enabled": False})
    det.observe(server(0, 100.0))  # the life's first scrape: counters are a baseline
    samples, gen, sent = cold_start_then_steady(1.0, cold_gap=7.0, steady_until=60.0)
    for s in samples:
        det.observe(s)
    status = det.assess(T0 + 60).rule("generation_frozen")
    # the 7 s prefill gaps ran while streams were still waiting for their first token;
    # the steady gaps are 1 s, so the floor holds, not 7 s x 5
    assert status.threshold_s == pytest.approx(DetectorConfig().generation_frozen.floor)
    # a freeze from here is a hang at the floor
    frozen = [s for t in range(61, 80) for s in (server(t, gen), client(t, sent))]
    decisions, _ = feed(det, frozen, 80, start=60.5)
    assert len(decisions) == 1 and decisions[0].rule == "generation_frozen"
    assert decisions[0].decided_at - T0 == pytest.approx(60 + 15, abs=1.0)

    # the next server life's cold start is judged with the cold gaps seen before
    det.reset(T0 + 90)
    det.observe(server(90, 100.0))
    life2, _, _ = cold_start_then_steady(91.0, cold_gap=1.0, steady_until=92.0)
    for s in life2[:4]:  # first token; the other streams still prefilling
        det.observe(s)
    status = det.assess(T0 + 92).rule("generation_frozen")
    assert status.threshold_s == pytest.approx(7.0 * 5)
    assert status.evidence["thresholds"]["cold_start"] is True


# -- config ------------------------------------------------------------------------------


def test_config_rejects_impossible_marks():
    with pytest.raises(ValidationError):
        PpTailStallConfig(low_pct=95, high_pct=90)
    with pytest.raises(ValidationError):
        DetectorConfig.model_validate({"generation_frozen": {"floor": "5m", "ceiling": "1m"}})


def test_run_config_errors_name_the_detector_field(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("detector:\n  pp_tail_stall:\n    window: soon\n")
    with pytest.raises(ConfigError) as info:
        load_run_config(path)
    assert "detector.pp_tail_stall.window" in str(info.value)
    path.write_text("detector:\n  generation_frozen:\n    floor: 10s\n    ceiling: 2m\n    safety: 3\n")
    with pytest.raises(ConfigError) as info:
        load_run_config(path)
    assert "detector.generation_frozen.safety" in str(info.value) and "unknown key" in str(info.value)
    path.write_text("detector:\n  generation_frozen:\n    floor: 20s\n    ceiling: 3m\n")
    cfg = load_run_config(path).detector.generation_frozen
    assert (cfg.floor, cfg.ceiling) == (20.0, 180.0)


def test_a_hang_between_turns_is_decided_once_a_request_is_in_flight():
    """The tail dark beside a spinning upstream while nothing is in flight is the signature
    already; the rule waits for a request (as the window rule did), then decides at once,
    and the interval still starts before the stall began."""
    det = make()
    samples = healthy_run(10.0)
    samples += [server(t, 100.0 + 10 * 30, running=0) for t in range(11, 30)]
    samples += [client(t, 5000 + 10 * 300, in_flight=0, streaming=0) for t in range(11, 20)]
    samples += [client(t, 5000 + 10 * 300) for t in range(20, 30)]  # the next turn at 20 s
    samples += [gpus(10.25 + 0.5 * k, 0.0) for k in range(40)]
    decisions, _ = feed(det, samples, 30)
    [d] = decisions
    assert 20.0 <= d.decided_at - T0 <= 20.6
    assert d.evidence["onset_interval"]["latest"] == pytest.approx(T0 + 10.25, abs=1e-3)
    assert d.evidence["onset_interval"]["earliest"] <= T0 + 10.0


def test_a_hang_from_the_first_reading_after_a_restart_is_dated_after_the_reset_not_a_point():
    """The tail never read working after a restart: no working reading bounds the onset
    from below, but the hang cannot precede the detector's reset (the relaunched server
    was up by then). A detector never reset (an attached server, started by somebody
    else at a time the harness cannot know) stays a point estimate."""
    det = make()
    det.reset(T0 + 5.0)  # the target (re)started at 5 s
    samples = [client(t, 5000) for t in range(6, 30)]  # a request in flight, no token ever
    samples += [gpus(6.0 + 0.5 * k, 0.0) for k in range(48)]
    decisions, _ = feed(det, samples, 30, start=5.0)
    [d] = decisions
    assert d.rule == "pp_tail_stall"
    interval = d.evidence["onset_interval"]
    assert interval["earliest"] == pytest.approx(T0 + 5.0, abs=1e-3)
    assert interval["latest"] == pytest.approx(T0 + 6.0, abs=1e-3)


def test_a_working_reading_whose_span_reaches_back_before_the_reset_is_cut_at_the_reset():
    """The first reading after the server came up saw the tail working (its span reaches
    back into warm-up, before the reset); the hang that follows cannot have begun before
    the reset, so the interval's earliest end is the reset, not the span's start."""
    det = make()
    det.reset(T0 + 5.0)
    samples = [client(t, 5000) for t in range(6, 30)]
    samples += [gpus(5.5, 100.0)] + [gpus(6.0 + 0.5 * k, 0.0) for k in range(48)]
    decisions, _ = feed(det, samples, 30, start=5.0)
    [d] = decisions
    interval = d.evidence["onset_interval"]
    assert interval["earliest"] == pytest.approx(T0 + 5.0, abs=1e-3)
    assert T0 + 5.5 <= interval["latest"] <= T0 + 6.0 + 1e-3


def _stages(t, tail, upstream):
    return GpuSample(T0 + t, GpuSource.SIM, tuple(GpuReading(i, tail if i == 7 else upstream[i]) for i in range(8)))


_UPSTREAM = st.lists(st.floats(0.0, 100.0), min_size=7, max_size=7)
_SPINNING = st.lists(st.floats(90.0, 100.0), min_size=7, max_size=7)
_DROPPING = st.lists(st.sampled_from([0.0, 99.5]), min_size=7, max_size=7)  # some spinning stages missed


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.large_base_example, HealthCheck.data_too_large, HealthCheck.too_slow])
@given(st.floats(5.0, 12.0), st.lists(st.floats(60.0, 100.0), min_size=30, max_size=30), st.data())
def test_the_true_onset_lies_in_the_interval_whatever_upstream_reads(onset, before, data):
    """The onset interval's earliest end is the start of the span of the last reading that
    ruled the hang out: the tail at work, or nothing upstream busy with nothing in flight
    (a hung pipeline's upstream spins). With requests in flight, a reading with the tail
    dark and upstream stages dark (on a shared GPU a time-sliced spinning stage can miss a
    short window; in a small pipeline all of them at once) says nothing of when the tail
    last ran. The tail works (60-100%) until the onset, then reads dark in every reading
    whose span starts after it, beside an upstream that spins or drops any of its stages;
    readings that straddle the onset read anything. Whenever the rule decides, the true onset lies in the interval (an H100 run
    whose upstream dropped a stage 2.4 s after the hang had its earliest end after it)."""
    cfg = DetectorConfig().pp_tail_stall
    span, low = cfg.sequential.reading_span, cfg.marks(GpuSource.SIM)[0]
    samples = []
    k = 0
    t = 0.5
    while t < 40.0:
        if t < onset:
            samples.append(_stages(t, before[k % len(before)], data.draw(_UPSTREAM)))
        elif t - span < onset:
            samples.append(_stages(t, data.draw(st.floats(0.0, 100.0)), data.draw(_UPSTREAM)))
        else:
            upstream = data.draw(st.one_of(_SPINNING, _DROPPING, st.just([0.0] * 7)))  # all missed at once
            samples.append(_stages(t, data.draw(st.floats(0.0, low)), upstream))
        t += 0.5
        k += 1
    gen_until = math.floor(onset)
    samples += [server(s, 100.0 + s * 30, kv=0.3 + s * 1e-4) for s in range(0, gen_until)]
    samples += [server(s, 100.0 + gen_until * 30, kv=0.3 + gen_until * 1e-4) for s in range(gen_until, 40)]
    samples += [client(s, 5000 + min(s, gen_until) * 300) for s in range(0, 40)]
    decisions, _ = feed(make(), samples, 40)
    for d in decisions:
        if d.rule != "pp_tail_stall":
            continue
        interval = d.evidence["onset_interval"]
        assert interval["earliest"] is not None and interval["earliest"] <= T0 + onset, interval
        assert interval["latest"] >= T0 + onset - 1e-6, interval


def test_an_idle_pipeline_reading_bounds_the_onset_as_a_working_tail_does():
    """Everything dark (between turns) rules the hang out too: the interval starts at the
    last such reading's span, not at the last reading that showed the tail busy."""
    det = make()
    samples = healthy_run(5.0)  # the tail busy until 5 s
    samples += [gpus(5.5 + 0.5 * k, 0.0, 0.0) for k in range(20)]  # idle from 5.5 s to 15 s
    samples += [gpus(15.5 + 0.5 * k, 0.0) for k in range(30)]  # the hang: upstream spins from 15.5 s
    samples += [client(t, 5000 + 5 * 300, in_flight=0, streaming=0) for t in range(6, 15)]
    samples += [client(t, 5000 + 5 * 300) for t in range(15, 30)]
    samples += [server(t, 100.0 + 5 * 30, running=0 if t < 15 else 4) for t in range(6, 30)]
    decisions, _ = feed(det, samples, 30)
    [d] = decisions
    interval = d.evidence["onset_interval"]
    assert interval["earliest"] == pytest.approx(T0 + 15.0 - DetectorConfig().pp_tail_stall.sequential.reading_span,
                                                 abs=1e-3)
    assert interval["latest"] == pytest.approx(T0 + 15.5, abs=1e-3)
