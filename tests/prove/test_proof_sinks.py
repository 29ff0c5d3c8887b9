"""Where a prove: run's test stands, as the live view and the exporter show it
(soak.run.proving.LiveProof hands them each tick's decision through FanOut)."""

from __future__ import annotations

import io
from pathlib import Path

from prometheus_client import CollectorRegistry

from soak.clock import ManualClock
from soak.events import EventType
from soak.export.config import ExporterConfig
from soak.export.exporter import Exporter
from soak.export.live import LiveView
from soak.prove.sprt import decide, plan, walk
from soak.records import RunInfo, TargetKind
from soak.run.proving import LiveProof
from soak.run.sinks import FanOut
from soak.run.stopping import LoadStop

T0 = 1_800_000_000.0
ISSUE = plan(broken_mtbf_s=1200.0, target_mtbf_s=12000.0)  # θ1 20 min, θ0 200 min, α = β = 5%


def _info() -> RunInfo:
    return RunInfo(run_id="night-1", run_dir=Path("/tmp/x"), started_at=T0, duration_s=7200.0, warmup_s=0,
                   target_kind=TargetKind.SIMULATOR, base_url="http://127.0.0.1:1", model="m", root_pid=None)


def _gauges(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in registry.collect() for s in m.samples
            if s.name.startswith("soak_prove")}


class Work:
    """The productive requests a live run feeds its proof (ProofSink.on_request): one
    every 10 s, so the target is seen working the whole time."""

    def __init__(self, sink) -> None:
        self.sink, self.fed = sink, T0

    def until(self, now: float) -> None:
        while self.fed + 10.0 <= now:
            self.fed += 10.0
            self.sink.on_request({"outcome": "ok", "ttft_s": 0.1, "output_tokens": 5, "ended_at": self.fed})


def test_the_exporter_says_where_the_test_stands_on_the_runs_registry() -> None:
    registry = CollectorRegistry()
    exporter = Exporter(ExporterConfig(enabled=False, port=0), registry=registry)
    FanOut([exporter]).on_proof(decide(ISSUE, exposure_s=24 * 60, hangs=0))
    got = _gauges(registry)
    assert got[("soak_prove_exposure_seconds", ())] == 24 * 60 and got[("soak_prove_hangs", ())] == 0
    assert round(got[("soak_prove_accept_at_seconds", ())] / 60, 1) == 65.4
    assert got[("soak_prove_reject_at_hangs", ())] == 2  # two hangs now would reject
    assert got[("soak_prove_decision", (("decision", "undecided"),))] == 1
    assert got[("soak_prove_decision", (("decision", "accepted"),))] == 0
    FanOut([exporter]).on_proof(walk(ISSUE, hang_exposures_s=[], exposure_s=70 * 60))
    got = _gauges(registry)
    assert got[("soak_prove_decision", (("decision", "accepted"),))] == 1
    assert got[("soak_prove_decision", (("decision", "undecided"),))] == 0
    assert got[("soak_prove_reject_at_hangs", ())] != got[("soak_prove_reject_at_hangs", ())]  # NaN: decided
    exporter.close()


async def test_the_live_view_has_one_proof_line_and_says_the_decision_once() -> None:
    clock = ManualClock(T0)
    out = io.StringIO()
    view = LiveView(clock=clock, mode="plain", stream=out, plain_interval_s=3600)
    view.on_start(_info())
    stop = LoadStop()
    fan = FanOut([view])
    proof = LiveProof(ISSUE, horizon_s=300.0, stop_at_decision=False, stop=stop, emit=lambda *a, **k: None, show=fan.on_proof)
    for type in (EventType.RUN_STARTED, EventType.LOAD_STARTED):
        proof.sink.on_event(type, {"ts": T0})
    work = Work(proof.sink)
    clock.advance(24 * 60)
    proof.tick(clock.now())
    # no work fed yet: no time at risk (a server that answers nothing proves nothing)
    assert view.state.line(clock.now()).endswith(
        "| proof: 65 more clean minutes to accept; 2 hangs before minute 37 reject")
    work.until(clock.now())
    proof.tick(clock.now())
    assert view.state.line(clock.now()).endswith(
        "| proof: 41 more clean minutes to accept; 2 hangs before minute 37 reject")
    for _ in range(2):
        clock.advance(42 * 60)
        work.until(clock.now())
        proof.tick(clock.now())
    said = [line for line in out.getvalue().splitlines() if line.startswith("soak: proof:")]
    assert said == ["soak: proof: accepted: fixed (α 5%, β 5%) after 65.4 clean minutes"]
    assert "| proof: accepted: fixed (α 5%, β 5%) after 65.4 clean minutes" in view.state.line(clock.now())
    assert stop.reason is None  # not asked to stop at the decision
    view.close()


def test_stop_at_decision_stops_the_load_with_the_sentence_and_records_it_once() -> None:
    class Load:
        stopping = False

        def stop(self, reason: str) -> None:
            self.stopping = True

    events: list[tuple[str, dict]] = []
    stop = LoadStop()
    stop.load = Load()  # type: ignore[assignment]
    proof = LiveProof(ISSUE, horizon_s=300.0, stop_at_decision=True, stop=stop, emit=lambda t, **f: events.append((t, f)),
                      show=lambda d: None)
    proof.started()
    for type in (EventType.RUN_STARTED, EventType.LOAD_STARTED):
        proof.sink.on_event(type, {"ts": T0})
    work = Work(proof.sink)

    def tick(at: float):
        work.until(at)
        return proof.tick(at)

    tick(T0 + 60 * 60)
    assert stop.reason is None
    tick(T0 + 66 * 60)
    # past the accept line (65.4 min) but a hang begun before it may be detected until 70.4 min
    assert stop.reason is None and tick(T0 + 70 * 60).sentence.startswith("26 more clean seconds to accept")
    tick(T0 + 71 * 60)
    tick(T0 + 72 * 60)
    assert stop.reason == "proof accepted: fixed (α 5%, β 5%) after 65.4 clean minutes"
    assert [t for t, _ in events] == [EventType.PROVE_PLAN, EventType.PROOF_DECIDED]
    assert events[0][1]["plan"]["target_mtbf_s"] == 12000.0 and events[1][1]["decision"] == "accepted"
