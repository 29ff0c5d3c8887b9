"""Mooncake replay against the simulator: the trace's reuse reaches the server's prefix cache."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from soak.workload import SimCounter, build_workload
from soak.workload.config import MooncakeTraceConfig
from soak.workload.mooncake import trace_reuse_ratio

from .helpers import SHARED_MOONCAKE, WORKLOADS, cached_of, send


async def test_sample_trace_cached_tokens_equal_shared_whole_blocks(sim_app):
    sim = await sim_app(time_scale=5000.0, kv_cache_blocks=65536)
    config = MooncakeTraceConfig(path=WORKLOADS / "traces" / "mooncake-sample.jsonl", replay="closed_loop", max_tokens_override=1)
    workload = build_workload(config, base_dir=WORKLOADS, seed=3, model="deepseek-v4-flash")
    await workload.calibrate(SimCounter())
    checked = reused = 0
    async with aiohttp.ClientSession() as http:
        index = 0
        while (session := workload.new_session(index)) is not None:
            turn = session.next_turn()
            usage = await send(http, sim.base_url, turn)
            assert usage["prompt_tokens"] == turn.planned_prompt_tokens
            assert cached_of(usage) == turn.planned_cached_tokens, (index, usage, turn.planned_cached_tokens)
            checked += 1
            reused += turn.planned_cached_tokens > 0
            index += 1
    assert checked == len(workload.rows) == 240
    assert reused > 100  # the sample does reuse prefixes


@pytest.mark.skipif(not SHARED_MOONCAKE.exists(), reason="no ../shared/data/mooncake (a user's own clone)")
@pytest.mark.timeout(300)
async def test_real_trace_first_2000_rows_hit_ratio_matches_hash_id_reuse(sim_app):
    # 2,000 rows are 27M prompt tokens and 39K distinct blocks: the cache holds them all
    sim = await sim_app(time_scale=100000.0, kv_cache_blocks=200_000, max_num_seqs=64, max_num_batched_tokens=65536)
    config = MooncakeTraceConfig(path=SHARED_MOONCAKE, limit=2000, replay="closed_loop", max_tokens_override=1)
    workload = build_workload(config, base_dir=WORKLOADS, seed=0, model="deepseek-v4-flash")
    await workload.calibrate(SimCounter())
    expected = trace_reuse_ratio(workload.rows)
    prompt = cached = 0
    # In trace order, a few at a time: a row's prefix is cached once the rows before it ran.
    async with aiohttp.ClientSession() as http:
        for start in range(0, len(workload.rows), 4):
            turns = [workload.new_session(i).next_turn() for i in range(start, min(start + 4, len(workload.rows)))]
            for usage in await asyncio.gather(*(send(http, sim.base_url, t) for t in turns)):
                prompt += usage["prompt_tokens"]
                cached += cached_of(usage)
    assert prompt == sum(r.input_length for r in workload.rows)
    assert abs(cached / prompt - expected) <= 0.01, (cached / prompt, expected)
