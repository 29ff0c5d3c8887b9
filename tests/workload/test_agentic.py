"""synthetic_agentic without a server: determinism, exact sizes, shared segments, the plan."""

from __future__ import annotations

import json
import random

import pytest

from soak.tokens import chat, tokenizer
from soak.workload import SimCounter, build_workload
from soak.workload.config import SyntheticAgenticConfig
from soak.workload.corpus import load_corpus
from soak.workload.config import StdlibCorpus

SMALL = dict(
    min_context_tokens=20_000,
    max_context_tokens=30_000,
    start_context_tokens={"dist": "uniform", "low": 20_000, "high": 22_000},
    shared_prefix_tokens=3000,
    context_chunk_tokens=1500,
    context_chunks=48,
    tool_result_pool=32,
    tool_result_tokens={"dist": "lognormal", "median": 900, "sigma": 0.5, "min": 50, "max": 3000},
    corpus={"kind": "stdlib", "max_bytes": 2_000_000},
)


async def _workload(seed: int, **overrides):
    config = SyntheticAgenticConfig.model_validate({**SMALL, **overrides})
    workload = build_workload(config, base_dir=".", seed=seed, model="sim-model")
    await workload.calibrate(SimCounter())
    return workload


def _bodies(workload, sessions: int = 3, turns: int = 4) -> list[bytes]:
    out = []
    for index in range(sessions):
        session = workload.new_session(index)
        for _ in range(turns):
            turn = session.next_turn()
            if turn is None:
                break
            out.append(turn.body)
    return out


async def test_same_seed_sends_byte_identical_bodies_and_another_seed_differs():
    first, again, other = await _workload(11), await _workload(11), await _workload(12)
    assert _bodies(first) == _bodies(again)
    assert all(a != b for a, b in zip(_bodies(first), _bodies(other)))


async def test_planned_tokens_equal_whole_prompt_counts_and_stay_in_range():
    workload = await _workload(5)
    seen = 0
    for index in range(3):
        session = workload.new_session(index)
        while (turn := session.next_turn()) is not None:
            body = json.loads(turn.body)
            assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
            assert body["max_tokens"] == turn.max_tokens
            rendered = chat.render_chat(body["messages"], body["tools"])
            assert tokenizer.count(rendered) == turn.planned_prompt_tokens
            assert 20_000 <= turn.planned_prompt_tokens <= 30_000
            seen += 1
    assert seen > 10


async def test_turns_extend_the_previous_prompt_and_sessions_share_only_the_prefix():
    workload = await _workload(5)
    a, b = workload.new_session(0), workload.new_session(1)
    a1, a2, b1 = a.next_turn(), a.next_turn(), b.next_turn()
    render = lambda t: chat.render_chat(json.loads(t.body)["messages"], json.loads(t.body)["tools"], add_generation_prompt=False)
    assert render(a2).startswith(render(a1))
    common = 0
    for x, y in zip(render(a1), render(b1)):
        if x != y:
            break
        common += 1
    shared = chat.render_chat([json.loads(a1.body)["messages"][0]], json.loads(a1.body)["tools"], add_generation_prompt=False)
    assert common >= len(shared)  # the shared prefix is common ...
    assert common < len(shared) + 200  # ... and little past it: each session reads its own repository


async def test_a_conversation_is_shared_segments_not_copies():
    workload = await _workload(5)
    session = workload.new_session(0)
    for _ in range(3):
        session.next_turn()
    chunk_pieces = [p for p in session._pieces if any(p is c for c in workload._chunks)]
    result_pieces = [p for p in session._pieces if any(p is r for r in workload._results)]
    assert len(chunk_pieces) >= 5 and len(result_pieces) == 2
    assert session._pieces[0] is workload._head


async def test_the_plan_states_sizes_hit_ratio_and_requests():
    workload = await _workload(5)
    plan = workload.plan(duration_s=600, concurrency=4, block_size=256)
    assert plan.requests > 4 and plan.sessions >= 4
    assert 20_000 <= plan.prompt_tokens_min <= plan.prompt_tokens_max <= 30_000
    assert 0.5 < plan.hit_ratio < 1.0
    assert plan.counter == "exact (simulator tokenizer)"
    text = plan.describe()
    assert "expected prefix-cache hit ratio" in text and "exact (simulator tokenizer)" in text
    assert json.loads(json.dumps(plan.to_json()))["requests"] == plan.requests
    # whole blocks only: every planned cached figure is a multiple of the block size
    assert all(t.cached_tokens % 256 == 0 for t in plan.sample_turns)
    longer = workload.plan(duration_s=1200, concurrency=4, block_size=256)
    assert longer.requests > plan.requests


async def test_max_sessions_bounds_the_workload():
    workload = await _workload(5, max_sessions=2)
    assert workload.new_session(1) is not None and workload.new_session(2) is None


def test_default_corpus_is_the_standard_library():
    corpus = load_corpus(StdlibCorpus(max_bytes=200_000))
    assert corpus.files and any(f.name.endswith(".py") for f in corpus.files)
    assert all(line.endswith("\n") and line.strip() for f in corpus.files for line in f.lines)


def test_distributions_are_seeded():
    from soak.workload.config import LognormalDist, UniformDist
    from soak.workload.distributions import sample

    dist = LognormalDist(median=100, sigma=1.0, min=10, max=400)
    draws = [sample(dist, random.Random(3)) for _ in range(2)]
    assert draws[0] == draws[1]
    values = [sample(dist, rng) for rng in [random.Random(4)] for _ in range(2000)]
    assert min(values) >= 10 and max(values) <= 400
    assert 80 < sorted(values)[1000] < 125  # the median is the median
    uniform = [sample(UniformDist(low=5, high=6), random.Random(i)) for i in range(50)]
    assert all(5 <= v <= 6 for v in uniform)


async def test_too_few_chunks_for_the_start_context_is_a_workload_error():
    from soak.errors import WorkloadError

    with pytest.raises(WorkloadError) as info:
        await _workload(5, context_chunks=4)
    assert "context_chunks" in str(info.value)


class _StrictServerCounter(SimCounter):
    """Counts like the simulator but refuses what vLLM with transformers 5 refuses:
    a chat /tokenize of an empty conversation (HTTP 400 there)."""

    def __init__(self) -> None:
        super().__init__()
        self.chats: list[list] = []

    async def count_chat(self, messages, tools=None, *, add_generation_prompt: bool = True) -> int:
        if not messages:
            raise AssertionError("calibration sent an empty conversation")
        self.chats.append(list(messages))
        return await super().count_chat(messages, tools, add_generation_prompt=add_generation_prompt)


async def test_calibration_never_asks_to_count_an_empty_conversation():
    config = SyntheticAgenticConfig.model_validate(SMALL)
    workload = build_workload(config, base_dir=".", seed=3, model="m")
    counter = _StrictServerCounter()
    await workload.calibrate(counter)
    assert counter.chats and all(counter.chats)
    assert workload.plan(duration_s=60, concurrency=2).requests > 0


@pytest.mark.parametrize(
    "tool_choice, has_tools, choice",
    [("none", True, "none"), ("auto", True, "auto"), ("omit", True, None), ("no_tools", False, None)],
)
async def test_tool_choice_decides_what_the_request_says_about_tools(tool_choice, has_tools, choice):
    # vLLM reads tools without tool_choice as "auto" and refuses it (HTTP 400) unless
    # started with --enable-auto-tool-choice: the default must be "none".
    workload = await _workload(5, tool_choice=tool_choice)
    body = json.loads(_bodies(workload, sessions=1, turns=2)[-1])
    assert ("tools" in body) is has_tools
    assert body.get("tool_choice") == choice
    # the planned size is still the whole prompt's count, tools included or not
    turn = workload.new_session(0).next_turn()
    assert turn.planned_prompt_tokens == await SimCounter().count_chat(
        json.loads(turn.body)["messages"], json.loads(turn.body).get("tools"))


def test_the_default_tool_choice_is_one_every_vllm_accepts():
    assert SyntheticAgenticConfig().tool_choice == "none"
