"""Replays of the recorded traces (tests/fixtures/traces, made by make.py from the
simulator's engine): healthy runs give no incident, every fault the right rule."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from soak.detect import Detector, DetectorConfig
from soak.records import DetectorState, IncidentKind, Topology
from soak.detect.replay import replay
from soak.store.rundir import read_samples
from soak.errors import ConfigError
from soak.samples import ClientSample, LogSample, ProcessSample, ServerSample

TRACES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
T0 = 1_780_000_000.0  # make.py's epoch

# name -> (expected rules or None for no incident, fault onset in simulated s)
EXPECTED = {
    "healthy_agentic": (None, None),
    "healthy_cold_prefill": (None, None),
    "healthy_startup_pause": (None, None),
    "healthy_idle_gaps": (None, None),
    "healthy_spec_burst": (None, None),
    "fault_metrics_stall": (None, None),
    "fault_pp_deadlock": (("pp_tail_stall",), 150.0),
    "fault_pp_deadlock_nvml": (("pp_tail_stall",), 123.4),
    "fault_all_idle_deadlock": (("generation_frozen",), 140.0),
    "fault_crash": (("log_signature", "server_gone"), 130.0),
}
KINDS = {"fault_crash": IncidentKind.CRASH}


def run(name: str, config: DetectorConfig | None = None, samples=None):
    detector = Detector(config or DetectorConfig(), topology=Topology.pipeline(8))
    samples = samples if samples is not None else read_samples(TRACES / f"{name}.jsonl.gz")
    return replay(samples, detector)


def test_every_fixture_is_covered():
    on_disk = {p.name.removesuffix(".jsonl.gz") for p in TRACES.glob("*.jsonl.gz")}
    assert on_disk == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(n for n, (rules, _) in EXPECTED.items() if rules is None))
def test_healthy_trace_gives_no_incident(name):
    result = run(name)
    assert result.decisions == []
    assert DetectorState.HUNG not in result.states
    assert result.duration_s > 120


@pytest.mark.parametrize("name", sorted(n for n, (rules, _) in EXPECTED.items() if rules is not None))
def test_fault_trace_gives_the_right_rule(name):
    rules, onset = EXPECTED[name]
    result = run(name)
    assert len(result.decisions) == 1, result.decisions
    d = result.decisions[0]
    assert d.rule in rules
    assert d.kind is KINDS.get(name, IncidentKind.HANG)
    # onset: the best estimate of when progress stopped, within a probe interval or two
    assert d.onset_at == pytest.approx(T0 + onset, abs=2.0)
    assert d.decided_at >= d.onset_at
    json.dumps(d.to_json())


def test_pp_deadlock_is_decided_within_the_goal():
    for name in ("fault_pp_deadlock", "fault_pp_deadlock_nvml"):
        d = run(name).decisions[0]
        assert d.decided_at - (T0 + EXPECTED[name][1]) <= 10.0


def test_a_settling_sample_is_judged_at_its_own_time_as_the_live_loop_does():
    samples = list(read_samples(TRACES / "fault_crash.jsonl.gz"))
    settling = next(s for s in samples if (isinstance(s, LogSample) and s.fatal)
                    or (isinstance(s, ProcessSample) and not s.alive))
    (d,) = run("fault_crash", samples=samples).decisions
    assert d.decided_at == settling.ts  # not at the next 0.5 s tick


def _gen_flat_spans(samples):
    """Longest stretch with the generation counter flat while requests ran."""
    longest = 0.0
    since = None
    last_gen = None
    for s in samples:
        if not isinstance(s, ServerSample) or not s.ok:
            continue
        gen, running = s.values.get("generation_tokens"), s.values.get("num_requests_running", 0)
        if running > 0 and gen == last_gen:
            since = since if since is not None else s.ts
            longest = max(longest, s.ts - since)
        else:
            since = s.ts if running > 0 else None
        last_gen = gen
    return longest


def test_the_cold_prefill_trap_is_real():
    """The cold-prefill trace holds long healthy stretches of flat token counters;
    with learning off (a fixed 15 s threshold) the other progress signals alone
    keep generation_frozen from calling them hangs, and without them it would."""
    samples = list(read_samples(TRACES / "healthy_cold_prefill.jsonl.gz"))
    fixed = DetectorConfig.model_validate({"generation_frozen": {"floor": 15, "ceiling": 15}})
    assert _gen_flat_spans(samples) > 15
    assert run("healthy_cold_prefill", fixed, samples).decisions == []
    blind = []
    for s in samples:
        if isinstance(s, ServerSample) and s.ok:
            keep = {k: v for k, v in s.values.items()
                    if k in ("generation_tokens", "num_requests_running", "num_requests_waiting")}
            s = dataclasses.replace(s, values=keep)
        elif isinstance(s, ClientSample):
            continue
        blind.append(s)
    blinded = run("healthy_cold_prefill", fixed, blind)
    assert [d.rule for d in blinded.decisions] == ["generation_frozen"]


def test_replay_reads_gzip_and_plain_and_names_a_bad_line(tmp_path):
    plain = tmp_path / "samples.jsonl"
    lines = [json.dumps({"kind": "health", "ts": T0, "ok": True, "status": 200})]
    plain.write_text("\n".join(lines) + "\n{not json\n")
    reader = read_samples(plain)
    assert next(reader).ok
    with pytest.raises(ConfigError) as info:
        next(reader)
    assert f"{plain}:2" in str(info.value)


def test_make_still_records_from_the_simulator_engine(trace_make):
    """The recorder runs against today's simulator: a short healthy run and a deadlock."""
    make = trace_make
    healthy = list(make.record(make.Scenario("t_healthy", 60.0, sessions=2, seed=99, context_min=20_000,
                                             context_max=40_000, shared_prefix=2_000)))
    kinds = {s.kind for s in healthy}
    assert {"gpu", "server", "client", "health", "process"} <= kinds
    assert run("t", samples=healthy).decisions == []
    stalled = make.record(make.Scenario("t_dead", 60.0, sessions=2, seed=98, context_min=20_000,
                                        context_max=40_000, shared_prefix=2_000, fault="pp_deadlock", fault_at=40.0))
    (d,) = run("t", samples=stalled).decisions
    assert d.rule == "pp_tail_stall" and d.onset_at == pytest.approx(make.T0 + 40.0, abs=1.0)


def test_a_deadlock_due_between_turns_strikes_at_the_next_engine_step(trace_make):
    """A real PP deadlock happens inside a step: one due while the engine idles strikes when
    the next request's first step starts, and that is the onset the bench measures from."""
    make = trace_make
    deferred = 0
    for seed in range(3):
        truth: dict = {}
        sc = make.Scenario(f"t_idle_{seed}", 120.0, sessions=1, seed=500 + seed, context_min=20_000,
                           context_max=40_000, shared_prefix=2_000, think_s=(20.0, 30.0),
                           fault="pp_deadlock", fault_at=70.0)
        samples = list(make.record(sc, truth=truth))
        onset = make.T0 + truth["onset"]
        assert onset >= make.T0 + 70.0
        deferred += onset > make.T0 + 70.0
        clients = [s for s in samples if s.kind == "client" and s.ts >= onset]
        assert clients and clients[0].in_flight > 0  # a request was in its step at the onset
        stuck = [s for s in samples if s.kind == "gpu" and s.gpus[7].util_pct <= 10.0
                 and min(g.util_pct for g in s.gpus[:7]) >= 90.0]
        assert stuck and min(s.ts for s in stuck) >= onset
    assert deferred  # with 20-30 s between turns, some deadlock came due while idle
