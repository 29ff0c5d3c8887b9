"""``stage_cpu_stall``: a stuck pipeline through the stage-CPU source, on generated
sample sequences (pure: no I/O, no clock). The shapes are those the real vLLM CPU
build showed (docs/real-vllm.md): every stage asleep for a skipped or late send and
a SIGSTOPped last stage, the last stage spinning alone for a deaf spinner."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from soak.detect import Detector, DetectorConfig
from soak.detect.stage_shapes import ShapeReading, StageShape, classify, stage_levels
from soak.records import DetectorState, RuleState, Topology
from soak.samples import ClientSample, GpuReading, GpuSample, GpuSource, ServerSample

T0 = 1_800_000_000.0
GPU_DT = 0.5  # probes.gpu_interval
STEP = 0.5  # detector.interval
WINDOW = 5.0
PP2 = Topology.pipeline(2)


def cpu(t: float, *levels: float, source: GpuSource = GpuSource.STAGE_CPU) -> GpuSample:
    return GpuSample(T0 + t, source, tuple(GpuReading(i, v) for i, v in enumerate(levels)))


def client(t: float, tokens: int, in_flight: int = 3, streaming: int | None = None) -> ClientSample:
    return ClientSample(T0 + t, in_flight, tokens * 6, tokens, 0, 0.0,
                        in_flight if streaming is None else streaming)


def only_stage_rule(**stage_cpu_stall) -> Detector:
    """The stage rule alone: the generic silence rules have their own tests and floors."""
    off = {"enabled": False}
    return Detector(DetectorConfig.model_validate({
        "generation_frozen": off, "client_stall": off, "pp_tail_stall": off, "server_gone": off,
        "log_signature": off, "stage_cpu_stall": stage_cpu_stall,
    }), topology=PP2)


def run(det: Detector, samples, until: float):
    """Observe in time order, assessing every STEP s; return (decisions, stage rule statuses)."""
    samples = sorted(samples, key=lambda s: s.ts)
    decisions, statuses = [], []
    i, t = 0, 0.0
    while t <= until + 1e-9:
        while i < len(samples) and samples[i].ts <= T0 + t:
            det.observe(samples[i])
            i += 1
        a = det.assess(T0 + t)
        decisions.extend(a.new_incidents)
        statuses.append((t, next(s for s in a.rules if s.rule == "stage_cpu_stall")))
        t = round(t + STEP, 6)
    return decisions, statuses


def healthy(until: float, *, start: float = 0.0, tokens: int = 0, in_flight: int = 3):
    """A working pipeline: stages taking turns at 40-100% of a core, a token every 0.5 s."""
    out, t = [], start
    while t < until:
        tokens += 1
        out += [cpu(t, 100.0 if int(t * 2) % 2 else 55.0, 62.0), client(t, tokens, in_flight)]
        t = round(t + GPU_DT, 6)
    return out, tokens


def stuck(start: float, until: float, levels: tuple[float, ...], tokens: int, in_flight: int = 3):
    out, t = [], start
    while t <= until:
        out += [cpu(t, *levels), client(t, tokens, in_flight)]
        t = round(t + GPU_DT, 6)
    return out


# -- the shapes ----------------------------------------------------------------------


def test_the_shapes_of_the_real_cpu_build():
    marks = {"asleep_pct": 30.0, "spin_pct": 75.0}
    assert classify((3.0, 0.0), **marks).shape is StageShape.ASLEEP  # (a)/(b), SIGSTOP
    assert classify((3.0, 0.0), **marks).stage == 1  # the engine waits for the last stage
    assert classify((2.0, 98.0), **marks) == classify((0.0, 100.0), **marks)  # (c): the tail spins
    assert classify((2.0, 98.0), **marks).stage == 1
    assert classify((0.0, 99.0, 1.0, 0.5), **marks).stage == 1  # a middle stage spinning alone
    assert classify((45.0, 0.0), **marks).shape is StageShape.ASLEEP  # SIGSTOP: stage 0 winds down
    assert classify((98.0, 2.0), **marks) is None  # the GPU seed's shape: pp_tail_stall's
    assert classify((55.0, 62.0), **marks) is None  # stages taking turns
    assert classify((5.0, 60.0), **marks) is None  # a tail half busy is working, not spinning
    # Stage 0 awake beside a spinning tail is still the tail spinning alone (on a loaded box a
    # sleeping neighbour reads 50-60% for readings on end): a prefill's turn there moves KV
    # usage within the window, and the window with no progress is what tells them apart.
    assert classify((55.0, 100.0), **marks) == ShapeReading(StageShape.SPIN, 1)
    assert classify((80.0, 100.0), **marks) is None  # both spinning: a pipeline at full speed


def test_a_stage_with_no_reading_is_missing_not_asleep():
    assert stage_levels({0: 1.0}, PP2) is None
    assert stage_levels({0: 1.0, 2: 0.0, 3: 80.0}, Topology.pipeline(2, 2)) == (1.0, 80.0)


def test_marks_out_of_order_are_refused():
    with pytest.raises(ValidationError, match="asleep_pct must be below spin_pct"):
        DetectorConfig.model_validate({"stage_cpu_stall": {"asleep_pct": 80, "spin_pct": 50}})


# -- decisions -----------------------------------------------------------------------


def test_every_stage_asleep_with_requests_in_flight_is_a_hang_of_the_last_stage():
    prefix, tokens = healthy(20.0)
    decisions, _ = run(only_stage_rule(), prefix + stuck(20.0, 40.0, (2.0, 0.0), tokens), 40.0)
    [d] = decisions
    assert d.rule == "stage_cpu_stall"
    assert d.evidence["source"] == "stage_cpu" and d.evidence["shape"] == "asleep" and d.evidence["stage"] == 1
    assert "all stages asleep with 3 requests in flight and no token for" in d.reasons[0]
    assert "last stage 1" in d.reasons[1]
    assert 20.0 + WINDOW <= d.decided_at - T0 <= 20.0 + WINDOW + GPU_DT + STEP
    assert d.onset_at - T0 == pytest.approx(19.5)  # the last token


def test_a_last_stage_spinning_alone_is_a_hang_of_that_stage():
    prefix, tokens = healthy(20.0)
    decisions, _ = run(only_stage_rule(), prefix + stuck(20.0, 40.0, (1.0, 97.0), tokens, in_flight=1), 40.0)
    [d] = decisions
    assert d.evidence["shape"] == "spin" and d.evidence["stage"] == 1
    assert d.reasons[0].startswith("stage 1 spins alone with 1 request in flight and no token for")


def test_a_middle_stage_spinning_alone_is_named():
    det = Detector(DetectorConfig(), topology=Topology.pipeline(4))
    samples, tokens, t = [], 0, 0.0
    while t < 10.0:
        samples += [cpu(t, 60, 70, 80, 90), client(t, tokens)]
        tokens, t = tokens + 1, t + GPU_DT
    while t < 25.0:
        samples += [cpu(t, 0, 0, 100, 2), client(t, tokens)]
        t += GPU_DT
    decisions, _ = run(det, samples, 25.0)
    assert [(d.rule, d.evidence["stage"]) for d in decisions] == [("stage_cpu_stall", 2)]


def test_the_gpu_seeds_shape_stays_pp_tail_stall():
    prefix, tokens = healthy(20.0)
    det = Detector(DetectorConfig(), topology=PP2)
    decisions, _ = run(det, prefix + stuck(20.0, 40.0, (99.0, 1.0), tokens), 40.0)
    assert [d.rule for d in decisions] == ["pp_tail_stall"]


def test_an_idle_gap_then_a_slow_start_is_timed_from_the_requests_arrival():
    # Nothing in flight for 30 s (every stage asleep), then requests come and the API
    # server takes 3 s before the engine sees them: not a hang; and a hang that
    # begins as they come is timed from their arrival, not from the idle gap.
    prefix, tokens = healthy(10.0)
    idle = stuck(10.0, 40.0, (0.5, 0.0), tokens, in_flight=0)
    slow = stuck(40.5, 43.0, (0.5, 0.0), tokens, in_flight=4)
    rest, _ = healthy(60.0, start=43.5, tokens=tokens, in_flight=4)
    decisions, statuses = run(only_stage_rule(), prefix + idle + slow + rest, 60.0)
    assert decisions == []
    hang = stuck(40.5, 60.0, (0.5, 0.0), tokens, in_flight=4)
    decisions, _ = run(only_stage_rule(), prefix + idle + hang, 60.0)
    [d] = decisions
    assert 40.5 + WINDOW <= d.decided_at - T0 <= 40.5 + WINDOW + GPU_DT + STEP
    assert d.onset_at - T0 == pytest.approx(40.5)


def test_a_cold_prefill_with_stages_taking_turns_is_not_a_hang():
    # 8K tokens on a loaded 2-core box: no token for 12 s, each stage's chunk in turn
    prefix, tokens = healthy(20.0)
    turns, t = [], 20.0
    while t < 32.0:
        busy = int((t - 20.0) / 1.5) % 2
        turns += [cpu(t, 100.0 if busy == 0 else 4.0, 100.0 if busy else 3.0), client(t, tokens)]
        t += GPU_DT
    after, _ = healthy(40.0, start=32.0, tokens=tokens)
    decisions, _ = run(Detector(DetectorConfig(), topology=PP2), prefix + turns + after, 40.0)
    assert decisions == []


def test_progress_seen_by_the_server_restarts_the_clock():
    # KV usage moving (a long chunked prefill) is progress even without a token
    prefix, tokens = healthy(10.0)
    samples = prefix + stuck(10.0, 30.0, (0.0, 0.0), tokens)
    samples += [ServerSample(T0 + t, True, {"kv_cache_usage_perc": 0.1 + t / 100, "num_requests_running": 3.0})
                for t in range(10, 31)]
    decisions, _ = run(only_stage_rule(), samples, 30.0)
    assert decisions == []


def test_the_detector_is_suspect_halfway_through_the_window():
    prefix, tokens = healthy(20.0)
    _, statuses = run(only_stage_rule(window=10.0), prefix + stuck(20.0, 26.0, (0.0, 0.0), tokens), 26.0)
    by_t = dict(statuses)
    assert by_t[24.0].state is RuleState.CLEAR and by_t[25.5].state is RuleState.PENDING
    assert by_t[25.5].reasons[0].startswith("all stages asleep")


def test_it_reads_stage_cpu_only_and_can_be_switched_off():
    prefix, tokens = healthy(20.0)
    shape = stuck(20.0, 40.0, (2.0, 0.0), tokens)
    assert run(only_stage_rule(enabled=False), prefix + shape, 40.0)[0] == []
    gpu = [cpu(s.ts - T0, *(g.util_pct for g in s.gpus), source=GpuSource.NVML) if isinstance(s, GpuSample) else s
           for s in prefix + shape]
    decisions, statuses = run(only_stage_rule(), gpu, 40.0)
    assert decisions == [] and statuses[-1][1].state is RuleState.INACTIVE


# -- properties ----------------------------------------------------------------------

levels = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)
shape_levels = st.one_of(
    st.tuples(st.floats(0.0, 10.0), st.floats(0.0, 10.0)),  # all asleep
    st.tuples(st.floats(0.0, 10.0), st.floats(75.0, 100.0)),  # the tail spinning alone
)


@settings(max_examples=100, deadline=None)
@given(readings=st.lists(st.tuples(levels, levels), min_size=10, max_size=80),
       gaps=st.lists(st.integers(1, 9), min_size=1, max_size=80), in_flight=st.integers(1, 8))
def test_never_fires_while_tokens_keep_arriving(readings, gaps, in_flight):
    """Whatever the stages read, tokens arriving less than a window apart are a working pipeline."""
    det, samples, tokens, next_token, t = only_stage_rule(), [], 0, 0.0, 0.0
    for k, (a, b) in enumerate(readings):
        if t >= next_token:
            tokens += 1
            next_token = t + gaps[k % len(gaps)] * GPU_DT  # at most 4.5 s apart
        samples += [cpu(t, a, b), client(t, tokens, in_flight)]
        t += GPU_DT
    decisions, _ = run(det, samples, t)
    assert decisions == []


@settings(max_examples=100, deadline=None)
@given(readings=st.lists(shape_levels, min_size=10, max_size=80))
def test_never_fires_with_nothing_in_flight(readings):
    prefix, tokens = healthy(5.0)
    samples = prefix + [s for k, (a, b) in enumerate(readings)
                        for s in (cpu(5.0 + k * GPU_DT, a, b), client(5.0 + k * GPU_DT, tokens, in_flight=0))]
    decisions, statuses = run(only_stage_rule(), samples, 5.0 + len(readings) * GPU_DT)
    assert decisions == [] and all(s.state is not RuleState.PENDING for _, s in statuses)


@settings(max_examples=100, deadline=None)
@given(readings=st.lists(st.one_of(shape_levels, st.tuples(levels, levels)), min_size=10, max_size=80),
       in_flight=st.integers(1, 8))
def test_never_fires_before_the_server_lifes_first_token(readings, in_flight):
    """Start-up, torch.compile, the first prefills and lazy compiles: no token yet."""
    samples = [s for k, (a, b) in enumerate(readings) for s in (cpu(k * GPU_DT, a, b), client(k * GPU_DT, 0, in_flight))]
    decisions, _ = run(only_stage_rule(), samples, len(readings) * GPU_DT)
    assert decisions == []


@settings(max_examples=100, deadline=None)
@given(prefix_s=st.integers(2, 30), hold=shape_levels, in_flight=st.integers(1, 8),
       window=st.sampled_from([3.0, 5.0, 8.0]), phase=st.integers(0, 9).map(lambda k: k * 0.05))
def test_fires_within_the_window_and_one_reading_of_the_shape_holding(prefix_s, hold, in_flight, window, phase):
    prefix, tokens = healthy(float(prefix_s), in_flight=in_flight)
    begin = prefix_s + phase
    end = begin + window + 3.0
    decisions, _ = run(only_stage_rule(window=window), prefix + stuck(begin, end, hold, tokens, in_flight), end)
    [d] = decisions
    assert d.evidence["stage"] == 1
    assert d.evidence["shape"] == ("asleep" if hold[1] <= 10.0 else "spin")
    assert begin + window <= d.decided_at - T0 <= begin + window + GPU_DT + STEP


gpu_trace = st.lists(st.tuples(levels, levels, st.booleans(), st.integers(0, 4)), min_size=10, max_size=60)


@settings(max_examples=100, deadline=None)
@given(trace=gpu_trace, source=st.sampled_from([GpuSource.NVML, GpuSource.DCGM, GpuSource.SIM]))
def test_gpu_sources_decide_as_they_did_without_the_rule(trace, source):
    def decisions(enabled: bool):
        det = Detector(DetectorConfig.model_validate({"stage_cpu_stall": {"enabled": enabled}}), topology=PP2)
        samples, tokens = [], 0
        for k, (a, b, moves, in_flight) in enumerate(trace):
            tokens += moves
            samples += [cpu(k * GPU_DT, a, b, source=source), client(k * GPU_DT, tokens, in_flight)]
        found, _ = run(det, samples, len(trace) * GPU_DT + 20.0)
        return [(d.rule, d.onset_at, d.decided_at, d.reasons) for d in found], det.state

    assert decisions(True) == decisions(False)


def test_a_hang_stays_hung_until_reset():
    prefix, tokens = healthy(20.0)
    det = only_stage_rule()
    decisions, _ = run(det, prefix + stuck(20.0, 60.0, (0.0, 0.0), tokens), 60.0)
    assert len(decisions) == 1 and det.state is DetectorState.HUNG


def test_a_spinner_that_waited_out_a_reading_on_a_run_queue_keeps_its_run():
    # the kernel books run-queue wait when the thread next runs: 0% once, then 100%
    prefix, tokens = healthy(20.0)
    levels = [(1.0, 100.0), (0.0, 98.0), (0.0, 0.0), (0.5, 100.0)] * 6
    shape = [s for k, (a, b) in enumerate(levels) for s in (cpu(20.0 + k * GPU_DT, a, b), client(20.0 + k * GPU_DT, tokens))]
    decisions, _ = run(only_stage_rule(), prefix + shape, 32.0)
    [d] = decisions
    assert d.evidence["shape"] == "spin" and d.decided_at - T0 <= 20.0 + WINDOW + GPU_DT + STEP
    # another stage spinning two readings in a row ends it: the pipeline moves
    levels = [(1.0, 100.0), (0.0, 98.0), (90.0, 40.0), (85.0, 100.0)] * 6
    shape = [s for k, (a, b) in enumerate(levels) for s in (cpu(20.0 + k * GPU_DT, a, b), client(20.0 + k * GPU_DT, tokens))]
    assert run(only_stage_rule(), prefix + shape, 32.0)[0] == []


def test_a_deaf_last_stages_neighbour_waking_once_keeps_the_spin_run():
    # spin_last on the real CPU build (bench hang 5): stage 0 asleep but read 32% and 42%
    # once each; without the blip the run began again each time and the log rule decided at 11 s
    prefix, tokens = healthy(20.0)
    stage0 = [23, 23, 13, 18, 12, 32, 18, 20, 6, 29, 22, 28, 28, 18, 18, 17, 42, 16, 10, 11, 14]
    shape = [s for k, a in enumerate(stage0) for s in (cpu(20.0 + k * GPU_DT, a, 100.0), client(20.0 + k * GPU_DT, tokens))]
    [d] = run(only_stage_rule(), prefix + shape, 31.0)[0]
    assert (d.evidence["shape"], d.evidence["stage"]) == ("spin", 1)
    assert d.decided_at - T0 <= 20.0 + WINDOW + GPU_DT + STEP


def test_a_sleeping_ranks_wake_up_read_once_is_a_blip_but_work_ends_the_run():
    # Lag_send on the real CPU build at load 19: asleep stages read 4-26%, one reading 69%.
    prefix, tokens = healthy(20.0)
    levels = [(5.8, 13.1), (23.2, 20.0), (5.7, 17.7), (8.4, 8.6), (10.4, 69.2), (22.9, 4.4), (4.8, 7.3)] * 3
    shape = [s for k, (a, b) in enumerate(levels) for s in (cpu(20.0 + k * GPU_DT, a, b), client(20.0 + k * GPU_DT, tokens))]
    [d] = run(only_stage_rule(), prefix + shape, 31.0)[0]
    assert d.evidence["shape"] == "asleep" and d.decided_at - T0 <= 20.0 + WINDOW + GPU_DT + STEP
    # two readings in a row of the last stage working end it, and the shape starts again after
    levels = [(5.0, 5.0)] * 6 + [(5.0, 60.0), (8.0, 55.0)] + [(5.0, 5.0)] * 6 + [(5.0, 60.0), (8.0, 55.0)]
    shape = [s for k, (a, b) in enumerate(levels) for s in (cpu(20.0 + k * GPU_DT, a, b), client(20.0 + k * GPU_DT, tokens))]
    assert run(only_stage_rule(), prefix + shape, 28.0)[0] == []


def test_a_stopped_tail_beside_a_stage_winding_down_says_so():
    # SIGSTOP of the last stage on the real CPU build: stage 0 read 12-50% for seconds
    prefix, tokens = healthy(20.0)
    levels = [(12.4, 0.0), (17.8, 0.0), (37.2, 0.0), (41.7, 0.0), (49.9, 0.0), (46.2, 0.0), (26.8, 0.0)] * 3
    shape = [s for k, (a, b) in enumerate(levels) for s in (cpu(20.0 + k * GPU_DT, a, b), client(20.0 + k * GPU_DT, tokens))]
    [d] = run(only_stage_rule(asleep_pct=30.0), prefix + shape, 31.0)[0]  # stage 0 over the mark, under spin
    assert (d.evidence["shape"], d.evidence["stage"]) == ("asleep", 1)
    assert d.reasons[0].startswith("last stage 1 asleep and no stage spinning with 3 requests in flight")


def test_the_gpu_seeds_shape_through_stage_cpu_survives_one_spinner_dip():
    # stage 0 spinning beside a dark tail, once read at 47% (its run-queue wait booked late)
    prefix, tokens = healthy(20.0)
    levels = [(100.0, 0.0)] * 4 + [(47.2, 0.0)] + [(100.0, 0.0)] * 4 + [(67.1, 0.0)] + [(100.0, 0.0)] * 8
    shape = [s for k, (a, b) in enumerate(levels) for s in (cpu(20.0 + k * GPU_DT, a, b), client(20.0 + k * GPU_DT, tokens))]
    decisions, _ = run(Detector(DetectorConfig(), topology=PP2), prefix + shape, 30.0)
    assert [d.rule for d in decisions] == ["pp_tail_stall"]
    assert decisions[0].decided_at - T0 <= 20.0 + WINDOW + GPU_DT + STEP
    # a GPU source reads no blips (NVML samples are no late-booked waits); since issue 37 its
    # sequential evidence decides from the first readings, before the dip at 22 s
    gpu = [cpu(s.ts - T0, *(g.util_pct for g in s.gpus), source=GpuSource.NVML) if isinstance(s, GpuSample) else s
           for s in prefix + shape]
    decisions, _ = run(Detector(DetectorConfig(), topology=PP2), gpu, 30.0)
    assert [d.rule for d in decisions] == ["pp_tail_stall"] and decisions[0].decided_at - T0 <= 22.0


# -- blips: one reading out of shape keeps a run, two in a row end it ----------------

stuck_shapes = st.sampled_from([
    ("stage_cpu_stall", (st.floats(0.0, 30.0), st.floats(0.0, 30.0))),  # every stage asleep
    ("stage_cpu_stall", (st.floats(0.0, 74.0), st.floats(75.0, 100.0))),  # the tail the one stage spinning
    ("pp_tail_stall", (st.floats(75.0, 100.0), st.floats(0.0, 30.0))),  # the GPU seed's shape
])
busy = st.tuples(st.floats(75.0, 100.0), st.floats(75.0, 100.0))  # both stages busy: no stuck shape


def stage_named(decision) -> int | None:
    return decision.evidence.get("stage", decision.evidence.get("signals", {}).get("tail_stage"))


def only_stage_rules() -> Detector:
    off = {"enabled": False}
    return Detector(DetectorConfig.model_validate({
        "generation_frozen": off, "client_stall": off, "server_gone": off, "log_signature": off}), topology=PP2)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), shape=stuck_shapes, prefix_s=st.integers(2, 20))
def test_single_readings_out_of_shape_never_hide_a_stuck_pipeline(data, shape, prefix_s):
    """Whatever one reading out of shape reads, a stuck pipeline in which no two come in
    a row is decided by its stage rule, naming the last stage, within the window and two
    readings (the blip may fall on the window's last reading)."""
    rule, (a, b) = shape
    n = int(WINDOW / GPU_DT) + 6
    blips = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    blips = [x and not (k and blips[k - 1]) and k not in (0, n - 1) for k, x in enumerate(blips)]
    prefix, tokens = healthy(float(prefix_s))
    shape_samples = []
    for k, blip in enumerate(blips):
        t = prefix_s + k * GPU_DT
        reading = data.draw(st.tuples(levels, levels) if blip else st.tuples(a, b))
        shape_samples += [cpu(t, *reading), client(t, tokens)]
    decisions, _ = run(only_stage_rules(), prefix + shape_samples, prefix_s + n * GPU_DT + 2.0)
    assert decisions, "a stuck pipeline went undecided"
    d = decisions[0]
    assert d.rule == rule and stage_named(d) == 1
    assert d.decided_at - T0 <= prefix_s + WINDOW + 2 * GPU_DT + STEP


@settings(max_examples=150, deadline=None)
@given(data=st.data(), shape=stuck_shapes, period=st.integers(3, int(WINDOW / GPU_DT)))
def test_two_readings_busy_in_a_row_end_every_stuck_run(data, shape, period):
    """A pipeline whose stages are both busy for two readings at least every window is moving:
    the stage rules stay quiet however stuck it looks between (the generic rules watch
    tokens)."""
    _, (a, b) = shape
    prefix, tokens = healthy(5.0)
    samples, t = list(prefix), 5.0
    for k in range(60):
        reading = data.draw(busy if k % period in (0, 1) else st.tuples(a, b))
        samples += [cpu(t, *reading), client(t, tokens)]
        t += GPU_DT
    assert run(only_stage_rules(), samples, t)[0] == []


def test_a_new_shape_that_ended_the_old_run_began_at_its_first_reading():
    # bench spin_last, load 10: the spinner dipped once (all asleep) just as tokens stopped,
    # then spun; the spin run is timed from its first reading, not its second
    prefix, tokens = healthy(20.0)
    levels = [(4.2, 0.8), (8.1, 100.0), (8.7, 100.0)] + [(10.0, 100.0)] * 14
    shape = [s for k, (a, b) in enumerate(levels) for s in (cpu(20.0 + k * GPU_DT, a, b), client(20.0 + k * GPU_DT, tokens))]
    [d] = run(only_stage_rule(), prefix + shape, 30.0)[0]
    assert (d.evidence["shape"], d.evidence["stage"]) == ("spin", 1)
    assert d.decided_at - T0 < 20.0 + 2 * GPU_DT + WINDOW  # timed from the reading at 20.5, not 21.0


@settings(max_examples=100, deadline=None)
@given(moving_s=st.integers(3, 30), source=st.sampled_from([GpuSource.STAGE_CPU, GpuSource.NVML]),
       gap=st.integers(1, 2))
def test_the_seeds_shape_is_timed_from_the_last_progress_not_cleared_by_it(moving_s, source, gap):
    """The GPU seed's shape (stage 0 spinning, the tail dark) seen while tokens still came
    (a loaded box's readings, a run the blips kept) decides one window after they stop
    (progress within the grace of the shape's start is the last scrape before the stop),
    and not while tokens keep coming (here at most a second apart)."""
    window = DetectorConfig().pp_tail_stall.marks(source)[2]
    samples, tokens, t = [], 0, 0.0
    while t < 3.0:  # a healthy start, so the server life has its first token
        tokens += 1
        samples += [cpu(t, 60.0, 60.0, source=source), client(t, tokens)]
        t = round(t + GPU_DT, 6)
    k = 0
    while t < 3.0 + moving_s:
        if k % gap == 0:
            tokens += 1
        samples += [cpu(t, 100.0, 0.0, source=source), client(t, tokens)]
        t, k = round(t + GPU_DT, 6), k + 1
    last_progress = min(s.ts for s in samples if isinstance(s, ClientSample) and s.tokens_total == tokens) - T0
    # progress within the grace of the pattern's start is the scrape that lands just after the stop
    start = last_progress if last_progress > 3.0 + DetectorConfig().pp_tail_stall.progress_grace else 3.0
    end = t + window + 3.0
    samples += stuck(t, end, (100.0, 0.0), tokens)
    samples = [cpu(s.ts - T0, *(g.util_pct for g in s.gpus), source=source) if isinstance(s, GpuSample) else s
               for s in samples]
    decisions, _ = run(only_stage_rules(), samples, end)
    assert [d.rule for d in decisions] == ["pp_tail_stall"]
    if source is GpuSource.STAGE_CPU:
        assert start + window <= decisions[0].decided_at - T0 <= start + window + GPU_DT + STEP
    else:  # GPU readings, sequential evidence (issue 37): never while tokens come, then within 3 s
        assert last_progress < decisions[0].decided_at - T0 <= last_progress + 3.0
