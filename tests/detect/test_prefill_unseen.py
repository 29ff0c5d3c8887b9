"""A /metrics that shows nothing a prefill moves (no KV usage: a proxy's own, a server
that is not vLLM, an allowlisted scrape, no scrape at all): a long prefill must not read as a hang, and a stop must still
be caught, later. Before: every checked-in healthy trace was a ``generation_frozen``
hang 38-158 s in (a 190K-token cold prefill looked like 15 s of silence)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from soak.detect import Detector, DetectorConfig
from soak.detect.replay import replay
from soak.detect.signals import SERVER_PROGRESS_KEYS
from soak.records import Topology
from soak.samples import GpuSample, LogSample, ServerSample
from soak.store.rundir import read_samples

TRACES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
HEALTHY = sorted(TRACES.glob("healthy_*.jsonl.gz"))
_LOADED = {p.name: list(read_samples(p)) for p in HEALTHY}
# What such a /metrics may still carry: any server key but KV usage (the prompt counter
# included: it counts a prompt at its first token, not while it prefills).
OTHER_KEYS = sorted({*SERVER_PROGRESS_KEYS, "num_requests_running", "num_requests_waiting"} - {"kv_cache_usage_perc"})


def _strip(samples, keep: set[str] | None, *, gpu: bool):
    """Server samples with only ``keep`` (None: no scrape at all); GPU readings kept or not."""
    out = []
    for s in samples:
        if isinstance(s, ServerSample):
            if keep is None:
                continue
            s = dataclasses.replace(s, values={k: v for k, v in s.values.items() if k in keep})
        elif isinstance(s, GpuSample) and not gpu:
            continue
        out.append(s)
    return out


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=st.sampled_from([p.name for p in HEALTHY]),
       keep=st.one_of(st.none(), st.sets(st.sampled_from(OTHER_KEYS))), gpu=st.booleans())
@example(trace="healthy_cold_prefill.jsonl.gz", keep={"prompt_tokens"}, gpu=False)  # counts at the first token only
@example(trace="healthy_agentic.jsonl.gz", keep=set(OTHER_KEYS), gpu=True)  # all but KV usage
def test_a_healthy_run_behind_a_metrics_page_that_hides_prefill_is_never_a_hang(trace, keep, gpu):
    samples = _strip(_LOADED[trace], keep, gpu=gpu)
    result = replay(samples, Detector(DetectorConfig(), topology=Topology.pipeline(8)))
    assert result.decisions == [], [(d.rule, d.reasons[:2]) for d in result.decisions]


def test_with_the_prefill_signals_the_learned_threshold_still_applies():
    """The allowance is for what the probes cannot see: with KV usage in the scrape a
    frozen server is called at the learned threshold, not after the allowance."""
    cfg = DetectorConfig()
    dead = list(read_samples(TRACES / "fault_all_idle_deadlock.jsonl.gz"))
    (d,) = replay(dead, Detector(cfg, topology=Topology.pipeline(8))).decisions
    assert d.rule == "generation_frozen"
    assert d.evidence["thresholds"]["prefill_unseen"] is False
    assert d.evidence["thresholds"]["threshold_s"] < cfg.generation_frozen.unseen_prefill_grace


def test_a_stop_behind_such_a_page_is_caught_at_the_learned_threshold_while_streams_decode_else_at_the_allowance(trace_make):
    make = trace_make
    cfg = DetectorConfig()
    grace = cfg.generation_frozen.unseen_prefill_grace
    for seed in (10, 11):  # a stop while two streams decode; a stop while the one request prefills
        truth: dict = {}
        sc = make.Scenario(f"t_unseen_{seed}", 60.0 + grace + 30.0, sessions=4, seed=seed, context_min=20_000,
                           context_max=40_000, shared_prefix=2_000, fault="pp_deadlock", fault_at=60.0)
        samples = [s for s in make.record(sc, truth=truth) if not isinstance(s, (ServerSample, GpuSample, LogSample))]
        onset = make.T0 + truth["onset"]
        decoding = next(s for s in samples if s.kind == "client" and s.ts >= onset).streaming > 0
        decisions = replay(samples, Detector(cfg, topology=Topology.pipeline(8))).decisions
        assert decisions, seed
        d = decisions[0]
        assert d.rule == "generation_frozen"
        assert d.evidence["thresholds"]["prefill_unseen"] is (not decoding)
        if decoding:  # the learned threshold, its 15-s floor here: as fast as with /metrics
            assert onset + cfg.generation_frozen.floor <= d.decided_at <= onset + cfg.generation_frozen.floor + 5.0
        else:  # nothing shows whether the prompt is still prefilling: the allowance
            assert onset + grace - 5.0 <= d.decided_at <= onset + grace + 5.0
