"""agentic-pp8 against the simulator, over real HTTP: sizes by /tokenize, hit ratio by the server."""

from __future__ import annotations

import aiohttp
import pytest

from soak.config import load_run_config
from soak.workload import TargetCounter, build_workload

from .helpers import WORKLOADS, cached_of, send, tokenize_chat

SESSIONS = 2  # whole sessions, one after another: about 35 turns of 190K-230K tokens


@pytest.fixture
async def agentic_pp8_on_sim(sim_app):
    config = load_run_config(WORKLOADS / "agentic-pp8.yaml")
    sim = await sim_app(time_scale=5000.0, kv_cache_blocks=8192)
    workload = build_workload(config.workload, base_dir=WORKLOADS, seed=config.seed, model="deepseek-v4-flash")
    async with aiohttp.ClientSession() as http:
        counter = TargetCounter(sim.base_url, "deepseek-v4-flash", session=http)
        await workload.calibrate(counter)
        yield workload, sim, http, config


@pytest.mark.timeout(240)
async def test_agentic_pp8_sizes_and_hit_ratio_on_the_simulator(agentic_pp8_on_sim):
    workload, sim, http, config = agentic_pp8_on_sim
    assert workload.counter_label == "exact (target /tokenize)"
    prompts, cached, planned_prompt, planned_cached = [], [], [], []
    for index in range(SESSIONS):
        session = workload.new_session(index)
        while (turn := session.next_turn()) is not None:
            counted = await tokenize_chat(http, sim.base_url, turn.body)
            assert 190_000 <= counted <= 230_000, (session.session_id, turn.turn, counted)
            assert counted == turn.planned_prompt_tokens
            usage = await send(http, sim.base_url, turn)
            assert usage["prompt_tokens"] == counted
            prompts.append(usage["prompt_tokens"])
            cached.append(cached_of(usage))
            planned_prompt.append(turn.planned_prompt_tokens)
            planned_cached.append(turn.planned_cached_tokens)
    assert len(prompts) >= 2 * SESSIONS * 5  # several turns per session, not one-shot prompts
    measured = sum(cached) / sum(prompts)
    planned_here = sum(planned_cached) / sum(planned_prompt)
    plan = workload.plan(duration_s=config.duration, concurrency=config.load.concurrency, block_size=256)
    assert measured >= 0.92, measured
    assert abs(measured - planned_here) <= 0.02, (measured, planned_here)
    assert abs(measured - plan.hit_ratio) <= 0.02, (measured, plan.hit_ratio)
    assert plan.prompt_tokens_min >= 190_000 and plan.prompt_tokens_max <= 230_000
    assert 0.93 <= plan.hit_ratio <= 0.95
