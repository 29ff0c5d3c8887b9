"""The pure engine under a virtual clock: prefix-cache arithmetic, LRU eviction, spec decode."""

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from soak.metric_names import VLLM_METRICS, MetricType
from soak.sim.config import SimConfig
from soak.sim.engine import Engine, SimRequest
from soak.sim.metrics import SimMetrics
from soak.sim.prefix_cache import block_hashes


def _req(rid, pieces, stop_at=1, bs=4):
    return SimRequest(request_id=rid, prompt_tokens=len(pieces), hashes=block_hashes(pieces, bs),
                      stop_at=stop_at, finish_reason="length", arrival=0.0)


def _run(engine, now=0.0, max_steps=100_000):
    steps = 0
    while engine.has_work:
        now = engine.step(now).ends_at
        steps += 1
        assert steps < max_steps
    return now


def _tokens(prefix, n):
    return [f"{prefix}{i} " for i in range(n)]


def test_shared_prefix_hits_whole_blocks_only():
    cfg = SimConfig(block_size=4, kv_cache_blocks=100, max_num_batched_tokens=64, num_speculative_tokens=0)
    metrics = SimMetrics(cfg)
    engine = Engine(cfg, observer=metrics)
    turn1 = _tokens("a", 18)  # 4 full blocks + 2 tokens
    turn2 = turn1 + _tokens("b", 9)  # shares 18 tokens: 4 whole blocks
    r1, r2 = _req("1", turn1), _req("2", turn2)
    engine.add_request(r1)
    _run(engine)
    engine.add_request(r2)
    _run(engine)
    assert r1.cached_tokens == 0
    assert r2.cached_tokens == 16  # 4 * block_size, the partial block is recomputed
    # a fully cached block-aligned prompt still recomputes its last token: one block less
    r3 = _req("3", turn1[:16])
    engine.add_request(r3)
    _run(engine)
    assert r3.cached_tokens == 12
    values = _values(metrics)
    assert values["vllm:prefix_cache_queries_total"] == 18 + 27 + 16
    assert values["vllm:prefix_cache_hits_total"] == 16 + 12
    assert values["vllm:prompt_tokens_total"] == 18 + 27 + 16


def test_lru_eviction_lowers_hits_as_predicted():
    cfg = SimConfig(block_size=4, kv_cache_blocks=10, max_num_batched_tokens=64, num_speculative_tokens=0)
    engine = Engine(cfg)
    a = _tokens("a", 16)  # 4 blocks, cached after it finishes
    engine.add_request(_req("a1", a))
    _run(engine)
    assert engine.pool.cached_hashes() == 4 and engine.pool.usage == 0.0
    engine.add_request(_req("b", _tokens("b", 32)))  # 8 blocks: 2 must be evicted, A's tail first
    _run(engine)
    assert engine.pool.evictions == 2
    again = _req("a2", a)
    engine.add_request(again)
    _run(engine)
    assert again.cached_tokens == 2 * 4  # A0, A1 survived; A2, A3 were least recently used


def test_kv_usage_moves_during_chunked_prefill_while_token_counters_stand_still():
    cfg = SimConfig(block_size=16, kv_cache_blocks=1000, max_num_batched_tokens=32, num_speculative_tokens=0)
    metrics = SimMetrics(cfg)
    engine = Engine(cfg, observer=metrics)
    engine.add_request(_req("long", _tokens("x", 320), stop_at=4, bs=16))
    now, usages = 0.0, []
    for _ in range(5):
        now = engine.step(now).ends_at
        usages.append(engine.pool.usage)
    assert usages == sorted(usages) and usages[0] < usages[-1]
    assert _values(metrics)["vllm:prompt_tokens_total"] == 0
    assert _values(metrics)["vllm:generation_tokens_total"] == 0


def test_cold_and_cached_prefill_durations_match_the_real_box():
    cfg = SimConfig()  # defaults: pp 8, block 256, 256 tokens a step
    engine = Engine(cfg)
    prompt = _tokens("t", 230_000)
    cold = _req("cold", prompt, bs=256)
    engine.add_request(cold)
    _run(engine)
    warm_prompt = prompt[:216_200] + _tokens("n", 13_800)  # 94% shared
    warm = _req("warm", warm_prompt, bs=256)
    start = cold.finished_at
    warm.arrival = start
    engine.add_request(warm)
    _run(engine, now=start)
    assert 10 <= cold.first_token_at <= 60  # tens of seconds
    assert 0.5 <= warm.first_token_at - start <= 6  # a few seconds


def _values(metrics):
    out = {}
    for fam in text_string_to_metric_families(metrics.render().decode()):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0) + s.value
    return out


def _families(metrics):
    return {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}


def test_every_metric_present_with_labels_and_spec_decode_only_when_on():
    on = SimMetrics(SimConfig())
    off = SimMetrics(SimConfig(num_speculative_tokens=0))
    fams_on, fams_off = _families(on), _families(off)
    all_names = {s.name for f in fams_on.values() for s in f.samples}
    for spec in VLLM_METRICS.values():
        if spec.hidden:
            assert spec.exposed not in fams_on
            continue
        fam = fams_on[spec.exposed]
        assert fam.type == spec.type.value
        for s in fam.samples:
            assert s.labels["model_name"] == "deepseek-v4-flash" and s.labels["engine"] == "0"
        assert set(spec.sample_names) <= all_names, spec.key  # _created is a family of its own in 0.0.4 text
        if spec.type is MetricType.HISTOGRAM:
            bounds = sorted(float(s.labels["le"]) for s in fam.samples if s.name.endswith("_bucket"))
            assert tuple(bounds[:-1]) == tuple(float(b) for b in (spec.buckets or bounds[:-1]))
        assert (spec.exposed in fams_off) == (not spec.spec_decode_only)
    hidden = _families(SimMetrics(SimConfig(show_hidden_metrics_for_version="0.10")))
    assert {"vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries", "vllm:gpu_prefix_cache_hits"} <= set(hidden)


@pytest.mark.parametrize("p", [0.3, 0.8])
def test_spec_decode_acceptance_rate_matches_configuration(p):
    cfg = SimConfig(num_speculative_tokens=5, spec_acceptance=p, max_num_seqs=8, max_num_batched_tokens=256, seed=3)
    metrics = SimMetrics(cfg)
    engine = Engine(cfg, observer=metrics)
    for i in range(8):
        engine.add_request(_req(str(i), _tokens(f"p{i}", 40), stop_at=2000, bs=256))
    _run(engine)
    v = _values(metrics)
    drafted, accepted = v["vllm:spec_decode_num_draft_tokens_total"], v["vllm:spec_decode_num_accepted_tokens_total"]
    assert drafted == 5 * v["vllm:spec_decode_num_drafts_total"]
    rate = accepted / drafted
    sigma = math.sqrt(p * (1 - p) / drafted)
    assert abs(rate - p) < 4 * sigma
    assert v["vllm:generation_tokens_total"] == 8 * 2000  # max_tokens honoured exactly
    per_pos = [s.value for f in text_string_to_metric_families(metrics.render().decode())
               for s in f.samples if s.name == "vllm:spec_decode_num_accepted_tokens_per_pos_total"]
    assert sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True)
