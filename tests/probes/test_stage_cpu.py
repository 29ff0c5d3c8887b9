"""The stage-CPU source: its pure core (properties), the /proc edge, and the real
rig (soak.rigs.stage_cpu) read through it into the detector."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.clock import ManualClock, SystemClock
from soak.detect.config import DetectorConfig
from soak.detect.detector import Detector
from soak.errors import GpuUnavailable
from soak.probes.build import open_gpu_source, stage_cpu_source
from soak.probes.config import ProbesConfig
from soak.probes.stage_cpu import StageCpuSource, process_utilization, stage_readings, to_gpu_readings, worker_stage
from soak.proc.cpu import ProcCpu, parse_stat
from soak.records import DetectorState, Topology
from soak.samples import ClientSample, GpuSample, GpuSource

cpu_s = st.floats(min_value=0, max_value=1e6, allow_nan=False)
elapsed = st.floats(min_value=1e-3, max_value=60, allow_nan=False)


@settings(max_examples=100, deadline=None)
@given(a=cpu_s, b=cpu_s, dt=elapsed, started=st.integers(0, 10**9))
def test_utilization_is_never_negative_and_at_most_one_core(a, b, dt, started):
    before = ProcCpu(pid=7, started=started, cpu_s=a, state="R")
    after = ProcCpu(pid=7, started=started, cpu_s=b, state="R")
    util = process_utilization(before, after, elapsed_s=dt)
    assert util is not None and 0.0 <= util <= 100.0


@settings(max_examples=100, deadline=None)
@given(a=cpu_s, b=cpu_s, wa=cpu_s, wb=cpu_s, dt=elapsed)
def test_utilization_with_run_queue_wait_stays_within_one_core(a, b, wa, wb, dt):
    util = process_utilization(ProcCpu(3, 1, a, "R", wait_s=wa), ProcCpu(3, 1, b, "R", wait_s=wb), elapsed_s=dt)
    assert util is not None and 0.0 <= util <= 100.0


# At time scale 20 the simulated engine's 300 s RPC timeout is 15 s of wall time:
# under CI load the engine died (server_gone) before a starved stage reading came.
# These tests are about the stage rule, so the deadlock never times out here.
NO_TIMEOUTS = {"watchdog_timeout": "100000s", "execute_timeout": "100000s"}

def test_a_spinner_starved_of_cpu_still_reads_busy():
    # measured on a loaded 2-core box: 0.14 s on a CPU, 0.88 s waiting for one, in 1 s
    util = process_utilization(ProcCpu(3, 1, 10.0, "R", wait_s=5.0), ProcCpu(3, 1, 10.14, "R", wait_s=5.88),
                               elapsed_s=1.0)
    assert util == 100.0


@settings(max_examples=100, deadline=None)
@given(used=st.floats(min_value=0, max_value=1, allow_nan=False), dt=elapsed, cores=st.integers(1, 256))
def test_utilization_is_the_share_of_one_core_capped(used, dt, cores):
    # a process with threads on ``cores`` cores used ``used`` of them over ``dt``
    spent = used * cores * dt
    util = process_utilization(ProcCpu(1, 5, 10.0, "R"), ProcCpu(1, 5, 10.0 + spent, "R"), elapsed_s=dt)
    assert util == pytest.approx(min(used * cores * 100.0, 100.0), abs=1e-6)


@settings(max_examples=100, deadline=None)
@given(a=cpu_s, b=cpu_s, s1=st.integers(0, 10**9), s2=st.integers(0, 10**9), dt=elapsed)
def test_a_reused_pid_is_not_a_delta(a, b, s1, s2, dt):
    util = process_utilization(ProcCpu(9, s1, a, "S"), ProcCpu(9, s2, b, "R"), elapsed_s=dt)
    assert (util is None) == (s1 != s2)


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 3), cpu_s, cpu_s), min_size=1, max_size=12), dt=elapsed)
def test_a_stage_reads_its_busiest_worker(rows, dt):
    before = {pid: ProcCpu(pid, 1, a, "S") for pid, (_, a, _) in enumerate(rows, 100)}
    after = {pid: ProcCpu(pid, 1, b, "R") for pid, (_, _, b) in enumerate(rows, 100)}
    stage_of = {pid: stage for pid, (stage, _, _) in enumerate(rows, 100)}
    got = {s.stage: s for s in stage_readings(before, after, elapsed_s=dt, stage_of=stage_of)}
    assert set(got) == set(stage_of.values())
    for stage, reading in got.items():
        mine = [process_utilization(before[p], after[p], elapsed_s=dt) for p, s in stage_of.items() if s == stage]
        assert reading.util_pct == round(max(mine), 1)
        assert 0.0 <= reading.util_pct <= 100.0


def test_a_process_seen_once_gives_no_reading_rather_than_zero():
    after = {5: ProcCpu(5, 1, 3.0, "R")}
    assert stage_readings({}, after, elapsed_s=0.5, stage_of={5: 1}) == ()


def test_schedstat_wait_is_read_and_its_absence_is_none():
    from soak.proc.cpu import parse_schedstat

    assert parse_schedstat(b"1286724 880000000 1\n") == 0.88
    assert parse_schedstat(None) is None and parse_schedstat(b"garbled") is None


def test_stat_with_a_parenthesised_name_parses():
    # fields after the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
    rest = "R 1 1 1 0 -1 0 0 0 0 0 250 50 0 0 20 0 1 0 12345 0 0"
    parsed = parse_stat(42, f"42 (VLLM::Worker_PP1 (x)) {rest}", ticks=100)
    assert parsed == ProcCpu(pid=42, started=12345, cpu_s=3.0, state="R")
    assert parse_stat(42, "42 (truncated") is None


def test_workers_are_placed_by_title():
    assert worker_stage(["VLLM::Worker_PP2"]) == 2
    assert worker_stage(["VLLM::Worker_TP1"]) == 0
    assert worker_stage(["VLLM::EngineCore"]) is None
    assert worker_stage(["python", "-m", "x"]) is None


def test_tensor_parallel_stages_land_on_their_first_index():
    from soak.probes.stage_cpu import StageCpu

    readings = to_gpu_readings([StageCpu(0, 90.0, (1,), ("R",)), StageCpu(1, 0.0, (2,), ("S",))],
                               Topology.pipeline(2, 2))
    assert [(g.index, g.util_pct) for g in readings] == [(0, 90.0), (2, 0.0)]


def _fake_tree(walks: list, cpu: dict, *, root: int = 1):
    """A target whose tree walk is counted and whose /proc is ``cpu`` (pid -> ProcCpu)."""
    def descendants(pid):
        walks.append(pid)
        return frozenset(cpu)

    def read(pids):
        return {p: cpu[p] for p in pids if p in cpu}

    return descendants, read


def test_known_workers_are_read_without_walking_the_tree_each_time():
    # Walking every process on a loaded box took up to 540 ms, reading two workers 2-9 ms.
    clock, walks = ManualClock(), []
    cpu = {1: ProcCpu(1, 1, 0.0, "S", ("vllm", "serve")),
           10: ProcCpu(10, 5, 0.0, "S", ("VLLM::Worker_PP0",)), 11: ProcCpu(11, 5, 0.0, "S", ("VLLM::Worker_PP1",))}
    descendants, read = _fake_tree(walks, cpu)
    source = StageCpuSource(clock=clock, root_pid=lambda: 1, descendants=descendants, read=read,
                            topology=Topology.pipeline(2), rewalk_s=5.0)
    for k in range(8):
        clock.advance(0.5)
        cpu[11] = ProcCpu(11, 5, k * 0.5, "R", ("VLLM::Worker_PP1",))
        stages = source.read_blocking()
    assert len(walks) == 1
    assert [(x.stage, x.util_pct) for x in stages] == [(0, 0.0), (1, 100.0)]
    clock.advance(5.0)
    source.read_blocking()
    assert len(walks) == 2  # every rewalk_s, for a worker that came later
    del cpu[11]  # a worker gone: its stage has no reading, and the tree is walked again
    source.read_blocking()
    clock.advance(0.5)
    source.read_blocking()
    assert len(walks) == 3


def test_a_read_past_its_deadline_is_not_queued_behind():
    import threading

    release, reads = threading.Event(), []

    def slow_read(pids):
        reads.append(pids)
        release.wait(5)
        return {}

    source = StageCpuSource(clock=ManualClock(), root_pid=lambda: 1, descendants=lambda pid: frozenset({2}),
                            read=slow_read, deadline_s=0.1)

    async def two():
        first = await source.read()
        second = await source.read()
        release.set()
        await asyncio.sleep(0.2)
        return first, second

    first, second = asyncio.run(two())
    assert "did not answer in 0.1s" in first.error
    assert second.error == "stage CPU: the previous /proc read has not finished"
    assert len(reads) == 1


# -- the rig, read for real ---------------------------------------------------------------


def _rig(shape: str, *, stages: int, after: float, duration: float = 30.0, extra: tuple[str, ...] = ()):
    proc = subprocess.Popen([sys.executable, "-m", "soak.rigs.stage_cpu", "--stages", str(stages), "--shape", shape,
                             "--after", str(after), "--duration", str(duration), *extra],
                            stdout=subprocess.PIPE, text=True)
    info = json.loads(proc.stdout.readline())
    return proc, info


async def _watch(shape: str, *, stages: int, after: float, seconds: float, extra: tuple[str, ...] = (),
                 waiting: bool = False):
    """The rig through the source into a detector, with a client whose tokens move
    while the pipeline works and stand still in a stuck shape (one request in flight).
    ``waiting``: the idle shape with a request in flight and no token (a stuck pipeline
    whose ranks sleep), not a gap between turns."""
    import time

    proc, info = _rig(shape, stages=stages, after=after, extra=extra)
    try:
        clock = SystemClock()
        source = stage_cpu_source(clock=clock, root_pid=lambda: info["root"], proc=None,
                                  topology=Topology.pipeline(stages))
        await source.open()
        detector = Detector(DetectorConfig(), topology=Topology.pipeline(stages))
        tokens, decided, readings = 0, None, []
        end = time.time() + seconds
        while time.time() < end and decided is None:
            now = clock.now()
            sample = await source.read()
            readings.append([g.util_pct for g in sample.gpus])
            gap = shape == "idle" and not waiting and time.time() >= info["fault_at"]
            if shape == "healthy" or gap or time.time() < info["fault_at"]:
                tokens += 1  # a working pipeline generates; an idle one has nothing in flight
            detector.observe(sample)
            detector.observe(ClientSample(ts=now, in_flight=0 if gap else 1, bytes_total=tokens * 10,
                                          tokens_total=tokens, requests_done=0, streaming=1))
            assessment = detector.assess(now)
            if assessment.new_incidents:
                decided = (assessment.new_incidents[0], time.time() - info["fault_at"])
            await asyncio.sleep(0.5)
        return decided, readings, detector
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_seeds_deadlock_shape_is_a_hang_of_the_last_stage():
    decided, readings, _ = asyncio.run(_watch("deadlock", stages=2, after=3.0, seconds=20.0))
    assert decided is not None, readings
    decision, after_fault = decided
    assert decision.rule == "pp_tail_stall"
    assert "last stage 1 CPU" in decision.reasons[0]
    assert decision.evidence["signals"]["source"] == "stage_cpu"
    assert after_fault < 15.0


def test_a_stopped_last_stage_beside_spinning_ones_is_a_hang():
    decided, readings, _ = asyncio.run(_watch("stopped", stages=2, after=3.0, seconds=20.0))
    assert decided is not None and decided[0].rule == "pp_tail_stall", readings


def test_every_stage_asleep_with_a_request_waiting_is_a_hang_of_the_last_stage():
    # the real CPU build's skipped send or SIGSTOPped tail: gloo's receive sleeps, nothing spins
    decided, readings, _ = asyncio.run(_watch("idle", stages=2, after=3.0, seconds=20.0, waiting=True))
    assert decided is not None, readings
    decision, after_fault = decided
    assert (decision.rule, decision.evidence["shape"], decision.evidence["stage"]) == ("stage_cpu_stall", "asleep", 1)
    assert decision.reasons[0].startswith("all stages asleep with 1 request in flight and no token for")
    assert after_fault < 12.0, (after_fault, readings)


def test_a_last_stage_spinning_alone_is_a_hang_of_that_stage():
    # the real CPU build's deaf last stage: it spins, the stage before it sleeps
    decided, readings, _ = asyncio.run(_watch("spin_last", stages=3, after=3.0, seconds=20.0))
    assert decided is not None, readings
    decision, after_fault = decided
    assert (decision.rule, decision.evidence["shape"], decision.evidence["stage"]) == ("stage_cpu_stall", "spin", 2)
    assert after_fault < 12.0, (after_fault, readings)


@pytest.mark.parametrize("shape", ["healthy", "idle"])
def test_healthy_turns_and_idle_gaps_raise_nothing(shape):
    decided, readings, detector = asyncio.run(_watch(shape, stages=2, after=1.0, seconds=9.0))
    assert decided is None, (decided, readings)
    assert detector.state is not DetectorState.HUNG


def test_a_long_cold_prefill_before_the_first_token_raises_nothing():
    # stage 0 busy for 10 s while the tail sleeps, before any token: start-up
    async def run():
        proc, info = _rig("cold", stages=2, after=0.0, extra=("--cold", "10"))
        try:
            clock = SystemClock()
            source = stage_cpu_source(clock=clock, root_pid=lambda: info["root"], proc=None, topology=None)
            await source.open()
            detector = Detector(DetectorConfig(), topology=Topology.pipeline(2))
            statuses = []
            for _ in range(20):
                now = clock.now()
                detector.observe(await source.read())
                detector.observe(ClientSample(ts=now, in_flight=1, bytes_total=0, tokens_total=0, requests_done=0))
                assessment = detector.assess(now)
                statuses.append({r.rule: r for r in assessment.rules}["pp_tail_stall"])
                assert not assessment.new_incidents
                await asyncio.sleep(0.5)
            return statuses
        finally:
            proc.terminate()
            proc.wait(timeout=10)

    statuses = asyncio.run(run())
    assert any("before this server life's first token" in " ".join(s.reasons) for s in statuses), \
        [(s.state.value, s.reasons) for s in statuses]


def test_auto_falls_back_to_stage_cpu_only_for_titled_workers():
    class NoNvml:
        async def open(self):
            raise GpuUnavailable("NVML unavailable: no library")

    auto = ProbesConfig()

    async def run(root: int):
        return await open_gpu_source(NoNvml(), auto, is_simulator=False, clock=ManualClock(), root_pid=lambda: root)

    proc, info = _rig("idle", stages=2, after=0.0, duration=10.0)
    try:
        assert isinstance(asyncio.run(run(info["root"])), StageCpuSource)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(GpuUnavailable, match="NVML unavailable"):
            asyncio.run(run(plain.pid))
    finally:
        plain.kill()
        plain.wait()
    # before the server has started its titles cannot be checked: stage CPU, saying why it reads nothing
    early = asyncio.run(open_gpu_source(NoNvml(), auto, is_simulator=False, clock=ManualClock(),
                                        root_pid=lambda: None))
    sample = asyncio.run(early.read())
    assert sample.source is GpuSource.STAGE_CPU and "NVML unavailable" in sample.error
    nvml = ProbesConfig.model_validate({"gpu": {"kind": "nvml"}})
    with pytest.raises(GpuUnavailable):
        asyncio.run(open_gpu_source(NoNvml(), nvml, is_simulator=False, clock=ManualClock(), root_pid=lambda: 1))


def test_the_live_view_says_stage_cpu_not_gpu():
    from soak.export.live import ViewState
    from soak.samples import GpuReading

    state = ViewState(clock=ManualClock())
    state.on_sample(GpuSample(ts=2.0, source=GpuSource.STAGE_CPU,
                              gpus=(GpuReading(index=0, util_pct=97.0), GpuReading(index=1, util_pct=0.0))))
    line = state.line(3.0)
    assert "stage CPU% max/mean 97/97 0/0" in line and "gpu%" not in line


DEADLOCKED_SIM = {"time_scale": 20, "pp_size": 2, "faults": [{"kind": "pp_deadlock", "at": "200s", **NO_TIMEOUTS}]}


def _soak_run_on_burning_sim(tmp_path, target: dict, **extra) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """``soak run`` against ``target`` (the deadlocking simulator, its workers burning the
    CPU their state says: SOAK_SIM_BURN_CPU=1) with only the stage rules deciding: the
    log lines and, on a loaded box, the generic rules would come first, and a starved
    simulator (its spinning workers hold both cores) misses /health for seconds, which
    is not what these tests are about; an exit still decides."""
    import os

    import yaml

    config = {
        "name": "stagecpu", "duration": "40s", "target": target,
        "workload": {"kind": "synthetic_agentic", "min_context_tokens": 2000, "max_context_tokens": 6000,
                     "start_context_tokens": {"dist": "uniform", "low": 2000, "high": 2400},
                     "shared_prefix_tokens": 1000, "tool_result_tokens": {"dist": "uniform", "low": 200, "high": 400},
                     "output_tokens": 12, "think_time_s": 0.1, "tokenizer": {"kind": "estimate"}},
        "load": {"concurrency": 3, "drain": "5s"},
        "detector": {"log_signature": {"enabled": False}, "generation_frozen": {"enabled": False},
                     "client_stall": {"enabled": False},
                     "server_gone": {"health_failures": 1000, "health_window": "120s"}},
        "response": {"on_hang": "stop", "evidence": {"py_spy": False, "flight_recorder_wait": "1s"}},
        "exporter": {"enabled": False}, "view": {"mode": "plain", "plain_interval": "1s"}, **extra,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "soak", "run", str(path), "--out", str(run_dir), "--no-html"],
                          env=dict(os.environ, SOAK_SIM_BURN_CPU="1"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, (done.stdout[-2000:], done.stderr[-2000:])
    return done, [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_soak_run_on_a_cpu_burning_simulator_names_the_last_stage(tmp_path):
    """``soak run`` with ``probes.gpu: stage_cpu`` against the simulator: its PP deadlock
    (upstream spin, last stage holds) is a pp_tail_stall hang read from stage CPU."""
    done, recorded = _soak_run_on_burning_sim(tmp_path, {"kind": "simulator", "sim": DEADLOCKED_SIM},
                                              probes={"gpu": {"kind": "stage_cpu"}})
    assert "stage CPU%" in done.stdout
    decision = next(e for e in recorded if e["type"] == "decision")
    states = [e for e in recorded if e["type"] == "detector_state"]
    assert decision["rule"] == "pp_tail_stall", (decision, states)
    assert "last stage 1 CPU" in decision["reasons"][0]


def test_auto_on_a_launched_server_without_nvml_reads_stage_cpu_and_catches_the_deadlock(tmp_path):
    """The default ``probes.gpu`` (auto) on a box without NVML, against a launched
    server (the simulator started as a command, workers burning CPU): stage CPU."""
    import socket

    import yaml

    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML works on this machine: auto reads it")
    except Exception:
        pass
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sim = tmp_path / "sim.yaml"
    sim.write_text(yaml.safe_dump(DEADLOCKED_SIM), encoding="utf-8")
    _, recorded = _soak_run_on_burning_sim(tmp_path, {
        "kind": "launched", "base_url": f"http://127.0.0.1:{port}", "pp_size": 2,
        "command": [sys.executable, "-m", "soak", "sim", "--config", str(sim), "--host", "127.0.0.1",
                    "--port", str(port)]})
    decision = next(e for e in recorded if e["type"] == "decision")
    assert decision["rule"] == "pp_tail_stall" and decision["evidence"]["signals"]["source"] == "stage_cpu", decision


def test_an_explicit_stage_cpu_source_opens_before_a_launched_server_starts():
    """``probes.gpu: stage_cpu`` is opened before a launched server exists: it opens,
    reads nothing and says why; once a root shows without workers, open still refuses."""
    explicit = ProbesConfig.model_validate({"gpu": {"kind": "stage_cpu"}})
    root = {"pid": None}
    source = asyncio.run(open_gpu_source(stage_cpu_source(clock=ManualClock(), root_pid=lambda: root["pid"],
                                                          proc=None, topology=None),
                                         explicit, is_simulator=False, clock=ManualClock(),
                                         root_pid=lambda: root["pid"]))
    sample = asyncio.run(source.read())
    assert sample.source is GpuSource.STAGE_CPU and sample.gpus == () and sample.error
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        root["pid"] = plain.pid
        with pytest.raises(GpuUnavailable, match="no VLLM::Worker"):
            asyncio.run(source.open())
    finally:
        plain.kill()
        plain.wait()


def test_a_reading_after_a_late_one_spans_the_late_ones_interval():
    # A read past its deadline is dropped; the next delivered reading covers the whole
    # gap, so a worker busy during the gap is not read as asleep afterwards.
    import threading

    clock, gate, slow = ManualClock(), threading.Event(), {"on": False}
    cpu = {10: ProcCpu(10, 5, 0.0, "S", ("VLLM::Worker_PP0",)), 11: ProcCpu(11, 5, 0.0, "S", ("VLLM::Worker_PP1",))}

    def read(pids):
        if slow["on"]:
            gate.wait(5)
        return {p: cpu[p] for p in pids if p in cpu}

    source = StageCpuSource(clock=clock, root_pid=lambda: 1, descendants=lambda pid: frozenset(cpu), read=read,
                            topology=Topology.pipeline(2), deadline_s=0.2)

    async def go():
        await source.read()  # the first reading: no delta yet
        clock.advance(1.0)
        cpu[10] = ProcCpu(10, 5, 1.0, "R", ("VLLM::Worker_PP0",))  # stage 0 works for that second
        slow["on"] = True
        late = await source.read()
        gate.set()
        await asyncio.sleep(0.3)  # the late read finishes and is dropped
        slow["on"] = False
        clock.advance(1.0)
        return late, await source.read()

    late, after = asyncio.run(go())
    assert "did not answer" in late.error
    assert [g.util_pct for g in after.gpus] == [50.0, 0.0]  # 1 s of work over the 2 s since the last reading
