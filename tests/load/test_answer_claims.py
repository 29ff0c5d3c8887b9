"""What the answers claim and how they read, over real HTTP: a loopback server
whose answers name another model, claim twice the usage, loop or carry U+FFFD,
and the simulator (healthy, then with its lying_usage and other_model faults).
The records say so; throughput and TPOT stand on what was streamed."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from loopback_app import serve_any_path

from soak.load.chunks import CLAIM_FACTOR, CLAIM_SLACK, claim_disagrees, usage_disagreement
from soak.load.client import StreamingClient
from soak.load.config import TimeoutsConfig
from soak.load.progress import ProgressTracker
from soak.sim.greedy import WORDS
from soak.workload.counters import SimCounter


@dataclass(frozen=True)
class Turn:
    path: str = "/v1/chat/completions"
    body: bytes = b'{"model":"fake-model","stream":true}'
    session_id: str | None = "s1"
    turn: int | None = 0
    planned_prompt_tokens: int | None = 100
    max_tokens: int = 4096


def chunk(text: str | None, *, model: str | None = "fake-model", finish: str | None = None,
          usage: dict | None = None) -> bytes:
    obj: dict = {"id": "c", "object": "chat.completion.chunk", "created": 1}
    if model is not None:
        obj["model"] = model
    obj["choices"] = [] if text is None and finish is None else [
        {"index": 0, "delta": {"content": text} if text else {}, "logprobs": None, "finish_reason": finish}]
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def words(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(WORDS) for _ in range(n)]


def answer(deltas: list[str], *, claim: int | None, models: list[str] | None = None) -> bytes:
    """An OpenAI stream: the deltas (one chunk each, ``models[i]`` naming each), a
    finish chunk, a usage chunk claiming ``claim`` completion tokens, [DONE]."""
    models = models or ["fake-model"] * len(deltas)
    out = [chunk(d, model=m) for d, m in zip(deltas, models)]
    out.append(chunk(None, finish="length", model=models[-1]))
    if claim is not None:
        out.append(chunk(None, model=models[-1], usage={"prompt_tokens": 100, "completion_tokens": claim,
                                                        "total_tokens": 100 + claim}))
    return b"".join(out) + b"data: [DONE]\n\n"


async def serve(body: bytes, **client_options):
    """A loopback server that answers every request with ``body`` (sent in pieces)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(0, len(body), 997):
            await response.write(body[i:i + 997])
        await response.write_eof()
        return response

    runner, url = await serve_any_path(handler)
    client = StreamingClient(base_url=url, timeouts=TimeoutsConfig(), tracker=ProgressTracker(), max_connections=4)
    for name, value in client_options.items():
        setattr(client, name, value)
    await client.start()
    return runner, client


async def one(body: bytes, **client_options):
    runner, client = await serve(body, **client_options)
    try:
        return await client.send(Turn(), request_id="r1")
    finally:
        await client.aclose()
        await runner.cleanup()


COUNT = SimCounter().count_text_sync  # exact for these words: each is one token, and so is any run of them


async def test_a_healthy_answer_reads_clean_and_records_model_and_claim() -> None:
    deltas = words(300)
    record = await one(answer(deltas, claim=300), count_output=COUNT)
    assert record.outcome == "ok" and record.model == "fake-model"
    assert record.usage_output_tokens == 300 and record.output_tokens == 300
    assert record.degenerate is None and record.anomalies == 0, record.anomaly_notes


async def test_an_answer_naming_another_model_mid_stream_is_noted_with_both_names() -> None:
    deltas = words(20)
    models = ["fake-model"] * 10 + ["other-model"] * 10
    record = await one(answer(deltas, claim=20, models=models))
    assert record.model == "fake-model"
    assert "the stream named model 'fake-model', then 'other-model'" in record.anomaly_notes
    # Every chunk from the other model: the record names it (the judge holds it against the config).
    record = await one(answer(deltas, claim=20, models=["other-model"] * 20))
    assert record.model == "other-model" and record.anomalies == 0


async def test_a_model_name_from_outside_is_printable_and_bounded() -> None:
    name = "evil\x1b[2J\nmodel" + "x" * 5000
    record = await one(answer(words(3), claim=3, models=[name] * 3))
    assert record.model is not None and record.model.isprintable() and len(record.model) <= 203
    assert record.model.startswith("evil?[2J?model")


async def test_usage_claiming_twice_the_streamed_tokens_is_noted_and_never_timed() -> None:
    """With a counter exact for the target the record counts the text received:
    output_tokens and TPOT stand on it; the claim is kept beside, and noted."""
    deltas = words(64)
    record = await one(answer(deltas, claim=128), count_output=COUNT)
    assert record.usage_output_tokens == 128 and record.output_tokens == 64
    assert "usage claims 128 completion tokens, 64 were streamed" in record.anomaly_notes
    assert record.tpot_s == pytest.approx((record.e2e_s - record.ttft_s) / 63)


async def test_without_a_counter_an_under_claim_is_noted_and_an_over_claim_left_to_the_judge() -> None:
    # Several tokens a chunk (speculative decoding): chunks are only a lower bound.
    deltas = ["".join(words(3, seed=i)) for i in range(40)]
    honest = await one(answer(deltas, claim=120))
    assert honest.anomalies == 0 and honest.output_tokens == 120 and honest.usage_output_tokens == 120
    under = await one(answer(deltas, claim=10))
    assert "usage claims 10 completion tokens, at least 40 were streamed (content chunks)" in under.anomaly_notes
    over = await one(answer(deltas, claim=240))
    assert over.usage_output_tokens == 240 and over.anomalies == 0  # the judge's cross-check has the counters


async def test_a_repetition_loop_is_marked() -> None:
    record = await one(answer(["Sure! "] + [" can"] * 120, claim=121))
    assert record.outcome == "ok" and record.degenerate == "repetition"


async def test_replacement_characters_are_marked() -> None:
    deltas = words(30)
    for i in (3, 9, 15, 21, 27):
        deltas[i] = " \ufffd"
    record = await one(answer(deltas, claim=30))
    assert record.degenerate == "replacement_char"
    few = words(30)
    few[4] = " \ufffd"
    assert (await one(answer(few, claim=30))).degenerate is None


async def test_bytes_that_do_not_decode_are_marked() -> None:
    body = answer(words(10), claim=10).replace(b'"content": " ', b'"content": "\xff\xfe ', 1)
    assert b"\xff\xfe" in body
    record = await one(body)
    assert record.outcome == "ok" and record.degenerate == "undecodable"


async def test_the_simulator_healthy_then_lying_and_naming_another_model(sim_app) -> None:
    """The real simulator over HTTP: healthy answers read clean; its lying_usage
    fault is noted with both figures and does not reach TPOT; its other_model
    fault is recorded as the model the chunks named."""
    sim = await sim_app(time_scale=100.0)
    client = StreamingClient(base_url=sim.base_url, timeouts=TimeoutsConfig(), tracker=ProgressTracker(),
                             max_connections=4)
    client.count_output = COUNT
    await client.start()
    body = json.dumps({"model": sim.server.config.model, "stream": True, "max_tokens": 300, "ignore_eos": True,
                       "stream_options": {"include_usage": True},
                       "messages": [{"role": "user", "content": "Tell me about soak tests."}]}).encode()
    turn = Turn(body=body, max_tokens=300)
    try:
        healthy = await client.send(turn, request_id="h")
        assert healthy.outcome == "ok", healthy.error
        assert healthy.model == sim.server.config.model and healthy.degenerate is None
        assert healthy.output_tokens == healthy.usage_output_tokens == 300 and healthy.anomalies == 0, \
            healthy.anomaly_notes
        async with client._session.post(sim.base_url + "/sim/fault", json={"kind": "lying_usage", "factor": 2}) as r:
            assert r.status == 200, await r.text()
        lying = await client.send(turn, request_id="l")
        # Past max_tokens, a claim is refused outright (chunks.counted_tokens), named.
        assert lying.usage_output_tokens == 600 and lying.output_tokens == 300
        assert any(n.startswith("usage.completion_tokens 600 refused") for n in lying.anomaly_notes)
        # Room for the lie: the client's bound (the turn's max_tokens) above the 2x claim.
        roomy = Turn(body=body, max_tokens=4000)
        lying = await client.send(roomy, request_id="l2")
        n = lying.output_tokens
        assert lying.outcome == "ok" and n > 2 and lying.usage_output_tokens == 2 * n
        assert n == 300
        assert f"usage claims {2 * n} completion tokens, {n} were streamed" in lying.anomaly_notes
        assert lying.tpot_s == pytest.approx((lying.e2e_s - lying.ttft_s) / (n - 1))
        async with client._session.post(sim.base_url + "/sim/fault", json={"kind": "other_model"}) as r:
            assert r.status == 200, await r.text()
        other = await client.send(turn, request_id="o")
        assert other.model == "other-model"
    finally:
        await client.aclose()


# -- the tolerance, pure -----------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6))
def test_the_claim_tolerance_is_the_stated_one_and_symmetric(claimed, streamed, chunks) -> None:
    expected = claimed > streamed * CLAIM_FACTOR + CLAIM_SLACK or claimed < streamed / CLAIM_FACTOR - CLAIM_SLACK
    assert claim_disagrees(claimed, streamed) == expected
    note = usage_disagreement(claimed, streamed=streamed, chunks=chunks)
    assert (note is not None) == expected
    if note is not None:
        assert str(claimed) in note and str(streamed) in note
    # An honest count never disagrees with itself, nor within a token or two.
    assert not claim_disagrees(streamed, streamed) and not claim_disagrees(streamed + 2, streamed)
    # No exact count: only a claim below the chunks streamed is a disagreement.
    blind = usage_disagreement(claimed, streamed=None, chunks=chunks)
    assert (blind is not None) == (claimed < chunks / CLAIM_FACTOR - CLAIM_SLACK)
    assert usage_disagreement(None, streamed=streamed, chunks=chunks) is None
