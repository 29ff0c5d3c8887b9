import json

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from soak.tokens import chat, tokenizer

MODEL = "deepseek-v4-flash"


def _metric(text: str, name: str, **labels) -> float:
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


async def _metrics(session, base) -> str:
    async with session.get(base + "/metrics") as r:
        return await r.text()


async def _stream(session, url, body):
    chunks = []
    async with session.post(url, json=body) as r:
        assert r.status == 200
        async for line in r.content:
            line = line.decode().strip()
            if line.startswith("data: "):
                chunks.append(line[6:])
    assert chunks[-1] == "[DONE]"
    return [json.loads(c) for c in chunks[:-1]]


async def test_tokenize_usage_and_prompt_counter_agree(sim_app):
    sim = await sim_app()
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
    messages = [{"role": "system", "content": "You are a coding agent.\n" * 20}, {"role": "user", "content": "Fix the bug in main.py"}]
    async with aiohttp.ClientSession() as s:
        async with s.post(sim.base_url + "/tokenize", json={"model": MODEL, "messages": messages, "tools": tools}) as r:
            tok = await r.json()
        assert tok["count"] == tokenizer.count(chat.render_chat(messages, tools)) == len(tok["tokens"])
        before = _metric(await _metrics(s, sim.base_url), "vllm:prompt_tokens_total")
        chunks = await _stream(s, sim.base_url + "/v1/chat/completions", {
            "model": MODEL, "messages": messages, "tools": tools, "stream": True, "max_tokens": 17,
            "stream_options": {"include_usage": True}})
        usage = chunks[-1]["usage"]
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        assert usage["prompt_tokens"] == tok["count"]
        assert usage["completion_tokens"] == 17 == tokenizer.count(text)
        # vLLM 0.11.2 leaves prompt_tokens_details out when no token was cached (a cold prompt)
        assert "prompt_tokens_details" not in usage
        after = _metric(await _metrics(s, sim.base_url), "vllm:prompt_tokens_total")
        assert after - before == tok["count"]

        prompt = "def main():\n    return 42\n" * 30
        async with s.post(sim.base_url + "/tokenize", json={"model": MODEL, "prompt": prompt}) as r:
            ctok = await r.json()
        async with s.post(sim.base_url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 9}) as r:
            body = await r.json()
        assert body["usage"]["prompt_tokens"] == ctok["count"] == tokenizer.count(prompt)
        assert body["usage"]["completion_tokens"] == 9
        assert body["choices"][0]["finish_reason"] == "length"
        final = _metric(await _metrics(s, sim.base_url), "vllm:prompt_tokens_total")
        assert final - after == ctok["count"]
        gen = _metric(await _metrics(s, sim.base_url), "vllm:generation_tokens_total")
        assert gen == 17 + 9


async def test_error_shapes(sim_app):
    sim = await sim_app(max_model_len=64)
    async with aiohttp.ClientSession() as s:
        async with s.post(sim.base_url + "/v1/completions", json={"model": "nope", "prompt": "x"}) as r:
            assert r.status == 404
            assert (await r.json())["error"]["type"] == "NotFoundError"
        async with s.post(sim.base_url + "/v1/completions", json={"model": MODEL, "prompt": "word " * 100}) as r:
            assert r.status == 400
            err = (await r.json())["error"]
            assert "maximum context length is 64" in err["message"]
        async with s.get(sim.base_url + "/health") as r:
            assert r.status == 200
        async with s.get(sim.base_url + "/v1/models") as r:
            assert (await r.json())["data"][0]["max_model_len"] == 64
        async with s.post(sim.base_url + "/detokenize", json={"model": MODEL, "tokens": tokenizer.encode("hi there\n")}) as r:
            assert (await r.json())["prompt"] == "hi there\n"


async def test_chat_session_cached_tokens_and_hit_ratio_follow_block_arithmetic(sim_app):
    bs = 16
    sim = await sim_app(block_size=bs, kv_cache_blocks=4096)
    messages = [{"role": "system", "content": "You are an agent working in a repository.\n" * 12}]
    prompts, cached = [], []
    async with aiohttp.ClientSession() as s:
        for turn in range(4):
            messages.append({"role": "user", "content": f"step {turn}: run the tests and read the output\n" * (turn + 2)})
            chunks = await _stream(s, sim.base_url + "/v1/chat/completions", {
                "model": MODEL, "messages": messages, "stream": True, "max_tokens": 5,
                "stream_options": {"include_usage": True}})
            usage = chunks[-1]["usage"]
            prompts.append(usage["prompt_tokens"])
            # 0.11.2: the details only when some token was cached (turn 0 is cold)
            assert ("prompt_tokens_details" in usage) == (turn > 0)
            cached.append(usage["prompt_tokens_details"]["cached_tokens"] if turn else 0)
            messages.append({"role": "assistant", "content": f"ran step {turn}"})
        text = await _metrics(s, sim.base_url)
    # each turn's prompt extends the previous one; only its full blocks were cached
    expected = [0] + [min(prev // bs, (cur - 1) // bs) * bs for prev, cur in zip(prompts, prompts[1:])]
    assert cached == expected and all(c > 0 for c in cached[1:])
    hits, queries = _metric(text, "vllm:prefix_cache_hits_total"), _metric(text, "vllm:prefix_cache_queries_total")
    assert (hits, queries) == (sum(expected), sum(prompts))


async def test_request_larger_than_the_kv_cache_is_rejected(sim_app):
    sim = await sim_app(block_size=16, kv_cache_blocks=4)
    async with aiohttp.ClientSession() as s:
        async with s.post(sim.base_url + "/v1/completions", json={"model": MODEL, "prompt": "x " * 80, "max_tokens": 4}) as r:
            assert r.status == 400
            assert "KV cache blocks" in (await r.json())["error"]["message"]
