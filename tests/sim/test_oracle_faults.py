"""Over real HTTP: logprobs in vLLM's formats, greedy determinism, and the faults a
correctness oracle and the work-claim cross-checks must catch."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from soak.oracle.answer import answer_from_body
from soak.oracle.compare import judge_answer
from soak.samples import CanaryVerdict
from soak.tokens import tokenizer

MODEL = "deepseek-v4-flash"


def _chat(content: str, n: int = 24, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": n,
            "temperature": 0, "seed": 7, "logprobs": True, "top_logprobs": 5, **extra}


async def _post(s, url, body):
    async with s.post(url, json=body) as r:
        return r.status, await r.json()


async def _stream(s, url, body) -> list[dict]:
    chunks = []
    async with s.post(url, json={**body, "stream": True}) as r:
        assert r.status == 200
        async for line in r.content:
            if line.startswith(b"data: {"):
                chunks.append(json.loads(line[6:]))
    return chunks


def _counter(text: str, name: str) -> float:
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(name)


async def _metric(s, base, name="vllm:generation_tokens_total") -> float:
    async with s.get(base + "/metrics") as r:
        return _counter(await r.text(), name)


async def test_chat_and_completion_logprobs_parse_whole_and_streamed(sim_app):
    sim = await sim_app(near_tie_flip=0.0)
    base = sim.base_url
    async with aiohttp.ClientSession() as s:
        status, body = await _post(s, base + "/v1/chat/completions", _chat("hello", 30))
        assert status == 200
        ans = answer_from_body(body)
        assert ans.malformed is None and len(ans.tokens) == 30 == body["usage"]["completion_tokens"]
        assert "".join(ans.token_texts) == body["choices"][0]["message"]["content"]
        assert len(tokenizer.encode(ans.text)) == 30
        for t in ans.tokens:
            assert len(t.top) == 5 and t.top[0][1] >= t.logprob and t.token in dict(t.top)
        entry = body["choices"][0]["logprobs"]["content"][0]
        assert bytes(entry["bytes"]).decode() == entry["token"]
        # streamed: the delta chunks' logprobs, in order, are the whole answer's
        chunks = await _stream(s, base + "/v1/chat/completions", _chat("hello", 30))
        content = [e for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
                   for e in c["choices"][0]["logprobs"]["content"]]
        assert content == body["choices"][0]["logprobs"]["content"]
        # completions: logprobs: k, with text_offset
        status, comp = await _post(s, base + "/v1/completions", {"model": MODEL, "prompt": "hello", "max_tokens": 12, "logprobs": 3})
        lp = comp["choices"][0]["logprobs"]
        ans = answer_from_body(comp)
        assert ans.malformed is None and len(ans.tokens) == 12 and "".join(lp["tokens"]) == comp["choices"][0]["text"]
        assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(12)]
        assert all(3 <= len(top) <= 4 and tok in top for tok, top in zip(lp["tokens"], lp["top_logprobs"]))
        chunks = await _stream(s, base + "/v1/completions", {"model": MODEL, "prompt": "hello", "max_tokens": 12, "logprobs": 3})
        merged = [o for c in chunks if c["choices"] and c["choices"][0]["logprobs"] for o in c["choices"][0]["logprobs"]["text_offset"]]
        assert merged == lp["text_offset"]
        # without the fields: null, as before
        status, plain = await _post(s, base + "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 3})
        assert plain["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("extra, chat_form", [
    ({"top_logprobs": 21}, True), ({"top_logprobs": -2}, True), ({"logprobs": False, "top_logprobs": 2}, True),
    ({"logprobs": "yes"}, True), ({"logprobs": 21}, False), ({"logprobs": -3}, False), ({"logprobs": 1.5}, False),
])
async def test_bad_logprobs_values_are_400(sim_app, extra, chat_form):
    sim = await sim_app()
    async with aiohttp.ClientSession() as s:
        if chat_form:
            url, body = sim.base_url + "/v1/chat/completions", {**_chat("x", 3), **extra}
        else:
            url, body = sim.base_url + "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 3, **extra}
        status, err = await _post(s, url, body)
        assert status == 400 and err["error"]["type"] == "BadRequestError"


async def test_greedy_answers_are_a_function_of_the_prompt_content(sim_app):
    sim = await sim_app(near_tie_flip=0.0, max_num_seqs=4)
    async with aiohttp.ClientSession() as s:
        url = sim.base_url + "/v1/chat/completions"
        prompts = ["alpha beta", "alpha beto", "gamma delt", "alpha beta"]  # equal lengths
        results = await asyncio.gather(*(_post(s, url, _chat(p, 20)) for p in prompts * 3))
        texts = [b["choices"][0]["message"]["content"] for _, b in results]
        by_prompt = {}
        for p, t in zip(prompts * 3, texts):
            by_prompt.setdefault(p, set()).add(t)
        assert all(len(v) == 1 for v in by_prompt.values()), by_prompt  # batch-invariant: one answer each
        assert len({next(iter(v)) for v in by_prompt.values()}) == 3  # distinct prompts, distinct answers


async def _canary_round(s, url, prompts):
    return [answer_from_body(b) for _, b in await asyncio.gather(*(_post(s, url, _chat(p, 48)) for p in prompts))]


async def test_healthy_default_sim_raises_no_corruption_and_corrupt_output_does(sim_app):
    sim = await sim_app(near_tie_rate=0.1, max_num_seqs=8)
    prompts = [f"canary number {i}" for i in range(8)]
    async with aiohttp.ClientSession() as s:
        url = sim.base_url + "/v1/chat/completions"
        refs = await _canary_round(s, url, prompts)
        healthy = []
        for _ in range(4):
            healthy += [judge_answer(r, a, tie_margin=0.005).verdict for r, a in zip(refs, await _canary_round(s, url, prompts))]
        assert CanaryVerdict.CORRUPT not in healthy and CanaryVerdict.CROSSTALK not in healthy
        status, fault = await _post(s, sim.base_url + "/sim/fault", {"kind": "corrupt_output"})
        assert status == 200 and fault["active"]
        bad = [judge_answer(r, a, tie_margin=0.005).verdict for r, a in zip(refs, await _canary_round(s, url, prompts))]
        assert bad.count(CanaryVerdict.CORRUPT) >= 6, bad
        async with s.get(sim.base_url + "/sim/state") as r:
            faults = (await r.json())["faults"]
    assert faults[-1]["kind"] == "corrupt_output" and faults[-1]["onset_at"] is not None


async def test_corrupt_output_long_scope_spares_short_prompts(sim_app):
    sim = await sim_app(near_tie_flip=0.0, max_num_seqs=8, faults=[{"kind": "corrupt_output", "scope": "long", "long_tokens": 200}])
    async with aiohttp.ClientSession() as s:
        url = sim.base_url + "/v1/chat/completions"
        short = [f"short {i}" for i in range(4)]
        long_ = [f"long {i} " + "word " * 300 for i in range(4)]
        first = await _canary_round(s, url, short + long_)
        ref_long = [answer_from_body(b) for _, b in [await _post(s, url, _chat(p, 48)) for p in long_]]  # lone: delay line
        again = await _canary_round(s, url, short)
    assert [a.token_texts for a in again] == [a.token_texts for a in first[:4]]
    assert all(judge_answer(a, b, tie_margin=0.005).verdict is CanaryVerdict.CORRUPT for a, b in zip(first[4:], ref_long))


async def test_seed_story_corruption_first_then_the_pp_deadlock(sim_app):
    sim = await sim_app(time_scale=100, near_tie_flip=0.0,
                        faults=[{"kind": "corrupt_then_deadlock", "at": 1, "deadlock_after": 60,
                                 "deadlock": {"execute_timeout": 600, "ringbuffer_warning_interval": 0}}])
    async with aiohttp.ClientSession() as s:
        url = sim.base_url + "/v1/chat/completions"
        status, body = await _post(s, url, _chat("story", 8))
        assert status == 200  # the corruption fires in this first step; answers still come back
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            async with s.get(sim.base_url + "/sim/state") as r:
                st = await r.json()
            if len(st["faults"]) == 2:
                break
            await _post(s, url, _chat("keep going", 4))
        kinds = [f["kind"] for f in st["faults"]]
        assert kinds == ["corrupt_then_deadlock", "pp_deadlock"] and st["engine"]["hung"]
        corrupt_at, deadlock_at = st["faults"][0]["onset_at"], st["faults"][1]["onset_at"]
        assert 0.55 <= deadlock_at - corrupt_at <= 3.0  # 60 simulated s at time scale 100, and a step


async def test_lying_usage_claims_twice_what_was_streamed(sim_app):
    sim = await sim_app(faults=[{"kind": "lying_usage", "factor": 2}])
    async with aiohttp.ClientSession() as s:
        before = await _metric(s, sim.base_url)
        chunks = await _stream(s, sim.base_url + "/v1/chat/completions", {**_chat("count me", 40), "stream_options": {"include_usage": True}})
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        usage = chunks[-1]["usage"]
        assert len(tokenizer.encode(text)) == 40 and usage["completion_tokens"] == 80
        assert await _metric(s, sim.base_url) - before == 40  # the server's own counter tells the truth


async def test_other_model_names_another_model_than_v1_models(sim_app):
    sim = await sim_app(faults=[{"kind": "other_model"}])
    async with aiohttp.ClientSession() as s:
        async with s.get(sim.base_url + "/v1/models") as r:
            assert (await r.json())["data"][0]["id"] == MODEL
        chunks = await _stream(s, sim.base_url + "/v1/chat/completions", _chat("who", 5))
        _, whole = await _post(s, sim.base_url + "/v1/completions", {"model": MODEL, "prompt": "who", "max_tokens": 3})
    assert {c["model"] for c in chunks} == {"other-model"} and whole["model"] == "other-model"


async def test_replay_answers_the_same_bytes_without_work(sim_app):
    sim = await sim_app(faults=[{"kind": "replay"}])
    async with aiohttp.ClientSession() as s:
        url = sim.base_url + "/v1/chat/completions"
        raw = []
        for p in ("one", "two", "three", "four"):
            async with s.post(url, json={**_chat(p, 16), "stream": True}) as r:
                raw.append(await r.read())
        after_first = await _metric(s, sim.base_url)
        for p in ("five", "six"):
            async with s.post(url, json={**_chat(p, 16), "stream": True}) as r:
                raw.append(await r.read())
        assert len(set(raw)) == 1 and b"[DONE]" in raw[0]
        assert await _metric(s, sim.base_url) == after_first == 16  # one answer's work, six answers
        whole = []
        for p in ("seven", "eight", "nine"):
            async with s.post(sim.base_url + "/v1/completions", json={"model": MODEL, "prompt": p, "max_tokens": 4}) as r:
                whole.append(await r.read())
        assert len(set(whole)) == 1 and await _metric(s, sim.base_url) == 20  # the first whole answer's 4 tokens


async def test_collapse_makes_every_step_factor_slower(sim_app):
    sim = await sim_app(time_scale=100, num_speculative_tokens=0)
    async with aiohttp.ClientSession() as s:
        url = sim.base_url + "/v1/chat/completions"
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 10}
        healthy = []
        for _ in range(3):  # the best of three: the first request also warms the server up
            t0 = time.monotonic()
            await _post(s, url, body)
            healthy.append(time.monotonic() - t0)
        await _post(s, sim.base_url + "/sim/fault", {"kind": "collapse", "factor": 300})
        t0 = time.monotonic()
        status, _ = await _post(s, url, body)
        slow = time.monotonic() - t0
    # 10 steps of 16 simulated ms at time scale 100: 1.6 ms wall healthy, 480 ms collapsed
    assert status == 200 and slow >= 0.45 and slow > 5 * min(healthy)


def _pure_greedy(messages, n) -> list[str]:
    """What a batch-invariant sim answers, computed here: the prompt's content alone decides."""
    from soak.sim import greedy
    from soak.tokens import chat

    s, out = greedy.prompt_digest("".join(chat.render_sections(messages, None, add_generation_prompt=True))), []
    for _ in range(n):
        out.append(greedy.WORDS[greedy.top_of(s)])
        s = greedy.advance(s, greedy.top_of(s))
    return out


def test_a_soak_sim_process_answers_as_computed_then_corrupts_after_its_onset(sim_process):
    import urllib.request

    sim = sim_process("--fault", "corrupt_output:after_requests=1", "--near-tie-flip", "0", time_scale=50, processes=False)

    def ask(body):
        req = urllib.request.Request(sim.base_url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=20) as r:
            return answer_from_body(json.loads(r.read()))

    body = _chat("lone canary", 24)
    expected = _pure_greedy(body["messages"], 24)
    healthy = ask(body)  # request 1: before the onset; a reference from another process holds
    assert list(healthy.token_texts) == expected
    corrupt = ask(body)  # request 2 fires the fault: alone, it receives its own sample 8 positions back
    assert list(corrupt.token_texts[:8]) == expected[:8] and list(corrupt.token_texts) != expected
    assert judge_answer(healthy, corrupt, tie_margin=0.005).verdict is CanaryVerdict.CORRUPT
    faults = sim.state()["faults"]
    assert faults[0]["kind"] == "corrupt_output" and faults[0]["fired"] and faults[0]["onset_at"] is not None
