"""The canary probe against a loopback server that answers in vLLM's chat format:
the request it sends, the pacing and its measured share, the UNJUDGED paths
(failures, no logprobs, hostile bodies), and that a bad verdict comes only from
the judge."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soak.clock import SystemClock
from soak.net import session as outbound_session
from soak.oracle.answer import answer_from_body
from soak.oracle.book import ReferenceBook
from soak.oracle.compare import judge_answer, usable
from soak.probes.canary import NO_LOGPROBS, Canary, CanaryPacer, CanaryProbe
from soak.probes.canary_prompts import body_of, long_prompts, short_prompts
from soak.samples import CanarySample, CanaryVerdict
from tests.loopback_app import serve_any_path

BAD = (CanaryVerdict.CORRUPT, CanaryVerdict.CROSSTALK)
WORDS = ["The", " cache", " is", " warm", ".", " It", " holds", " blocks"]


def chat_body(tokens, *, alt_gap=5.0, model="m") -> dict:
    content = [{"token": t, "logprob": -0.1, "bytes": list(t.encode()),
                "top_logprobs": [{"token": t, "logprob": -0.1}, {"token": "~", "logprob": -0.1 - alt_gap}]}
               for t in tokens]
    return {"id": "x", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(tokens)},
                         "logprobs": {"content": content}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": len(tokens), "total_tokens": 12 + len(tokens)}}


def canaries(n=2):
    return [Canary(p, body_of(p, model="m", top_logprobs=5)) for p in short_prompts(count=n, seed=1, max_tokens=8)]


def probe(url, session, *, book=None, interval=0.01, share=0.5, tracker=None, timeout=5.0, n=2):
    got, events = [], []
    p = CanaryProbe(canaries(n), base_url=url, session=session, book=book or ReferenceBook(tie_margin=0.2),
                    on_sample=got.append, emit=lambda t, **f: events.append((t, f)), clock=SystemClock(),
                    interval_s=interval, max_share=share, timeout_s=timeout, concurrency=4, tracker=tracker,
                    api_key="sekrit")
    return p, got, events


async def test_the_request_is_greedy_with_logprobs_and_the_key():
    seen = []

    async def handler(request):
        seen.append((request.path, request.headers.get("Authorization"), json.loads(await request.read())))
        return web.json_response(chat_body(WORDS))

    runner, url = await serve_any_path(handler)
    async with outbound_session() as s:
        p, _, _ = probe(url, s)
        first = await p.ask(p.canaries[0])
        second = await p.ask(p.canaries[0])
    await runner.cleanup()
    path, auth, body = seen[0]
    assert path == "/v1/chat/completions" and auth == "Bearer sekrit"
    assert body["temperature"] == 0 and body["logprobs"] is True and body["top_logprobs"] == 5
    assert body["max_tokens"] == 8 and body["stream"] is False and isinstance(body["seed"], int)
    assert body["model"] == "m"
    assert first.verdict is CanaryVerdict.REFERENCE and second.verdict is CanaryVerdict.MATCH
    assert second.prompt_tokens == 12 and second.output_tokens == len(WORDS) and second.reference_source == "run"


async def test_an_unexplained_divergence_is_corrupt_with_its_evidence():
    answers = [WORDS, WORDS[:3] + [" cold"] + WORDS[4:]]

    async def handler(request):
        return web.json_response(chat_body(answers.pop(0) if answers else WORDS))

    runner, url = await serve_any_path(handler)
    async with outbound_session() as s:
        p, _, _ = probe(url, s)
        p.observe(SimpleNamespace())  # not a server sample: ignored
        from soak.samples import ServerSample

        p.observe(ServerSample(ts=1.0, ok=True, values={"num_requests_running": 7.0, "num_requests_waiting": 2.0,
                                                         "kv_cache_usage_perc": 0.61}))
        await p.ask(p.canaries[0])
        bad = await p.ask(p.canaries[0])
    await runner.cleanup()
    assert bad.verdict is CanaryVerdict.CORRUPT and bad.position == 3
    ev = bad.evidence
    assert ev["judgement"]["position"] == 3
    assert ev["server"] == {"ts": 1.0, "running": 7.0, "waiting": 2.0, "kv_cache_usage_perc": 0.61}
    assert [t["token"] for t in ev["reference"]["tokens"]][3] == " warm"
    assert [t["token"] for t in ev["answer"]["tokens"]][3] == " cold"
    assert ev["load"]["in_flight"] == 0
    assert len(json.dumps(ev)) < 50_000  # bounded


async def test_a_near_tie_flip_is_explained_not_corrupt():
    answers = [chat_body(WORDS, alt_gap=0.05), chat_body(WORDS[:3] + ["~"] + WORDS[4:], alt_gap=0.05)]

    async def handler(request):
        return web.json_response(answers.pop(0) if answers else chat_body(WORDS))

    runner, url = await serve_any_path(handler)
    async with outbound_session() as s:
        p, _, _ = probe(url, s)
        await p.ask(p.canaries[0])
        flip = await p.ask(p.canaries[0])
    await runner.cleanup()
    assert flip.verdict is CanaryVerdict.EXPLAINED


async def test_failures_and_hostile_bodies_are_unjudged_never_corrupt():
    bodies = [
        web.Response(status=500, text="boom"),
        web.Response(body=b"not json {", content_type="application/json"),
        web.Response(body=b'{"choices": [{"logprobs": {"content": [{"token": "a", "logprob": NaN}]}}]}',
                     content_type="application/json"),
        web.json_response({"choices": "nope"}),
        web.json_response({"choices": [{"message": {"content": 5}, "logprobs": {"content": [{"token": 3}]}}]}),
        web.json_response([1, 2, 3]),
        web.Response(body=b'{"a":"' + b"x" * (70 * 1024 * 1024) + b'"}', content_type="application/json"),
        web.Response(status=302, headers={"Location": "http://10.0.0.1/"}),
    ]

    async def handler(request):
        return bodies.pop(0)

    runner, url = await serve_any_path(handler)
    book = ReferenceBook(tie_margin=0.2, recorded={"short-0": answer_from_body(chat_body(WORDS))})
    async with outbound_session() as s:
        p, _, _ = probe(url, s, book=book)
        results = [await p.ask(p.canaries[0]) for _ in range(8)]
    await runner.cleanup()
    assert all(r.verdict is CanaryVerdict.UNJUDGED and r.error for r in results), [(r.verdict, r.error) for r in results]
    assert "HTTP 500" in results[0].error


async def test_a_hang_is_unjudged_after_the_timeout():
    async def handler(request):
        await asyncio.sleep(1.5)
        return web.json_response(chat_body(WORDS))

    runner, url = await serve_any_path(handler)
    async with outbound_session() as s:
        p, _, _ = probe(url, s, timeout=0.3)
        sample = await p.ask(p.canaries[0])
    await runner.cleanup()
    assert sample.verdict is CanaryVerdict.UNJUDGED and "0.3s" in sample.error and sample.e2e_s < 2


async def test_no_logprobs_is_said_once_and_unjudged():
    async def handler(request):
        body = chat_body(WORDS)
        body["choices"][0]["logprobs"] = None
        return web.json_response(body)

    runner, url = await serve_any_path(handler)
    async with outbound_session() as s:
        p, _, events = probe(url, s)
        results = [await p.ask(p.canaries[i % 2]) for i in range(4)]
    await runner.cleanup()
    assert all(r.verdict is CanaryVerdict.UNJUDGED and r.error == NO_LOGPROBS for r in results)
    assert [f["message"] for _, f in events] == [NO_LOGPROBS]


class FullLoad:
    """A tracker whose ``concurrency`` streams have been in flight since it was made."""

    def __init__(self, n, started):
        self._streams = [(i, SimpleNamespace(started_at=started, tokens=0)) for i in range(n)]

    def streams(self):
        return list(self._streams)


async def test_pacing_one_at_a_time_interval_and_share_bound():
    in_flight, peak, starts = 0, 0, []
    loop = asyncio.get_running_loop()

    async def handler(request):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        starts.append(loop.time())
        await asyncio.sleep(0.03)
        in_flight -= 1
        return web.json_response(chat_body(WORDS))

    runner, url = await serve_any_path(handler)
    clock = SystemClock()
    async with outbound_session() as s:
        p, got, _ = probe(url, s, interval=0.02, share=0.2, tracker=FullLoad(4, clock.monotonic()))
        p.start()
        await asyncio.sleep(1.2)
        await p.aclose()
    await runner.cleanup()
    assert peak == 1 and len(got) >= 3
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert min(gaps) >= 0.02
    # Each canary waits until the share after it would be within the bound (its
    # estimate: its last run); the night's first has none, so it is not held to it.
    assert all(isinstance(g.share, float) and g.share <= 0.2 * 1.25 for g in got[1:]), [g.share for g in got]
    assert got[-1].share > 0.05  # and the canaries do use what they are allowed


@settings(max_examples=200, deadline=None)
@given(durations=st.lists(st.floats(0.01, 30.0), min_size=1, max_size=6), busy=st.floats(0.1, 1.0),
       share=st.floats(0.005, 0.3), interval=st.floats(0.1, 60.0), c=st.integers(1, 64))
def test_the_pacer_keeps_the_share_when_canaries_take_their_estimate(durations, busy, share, interval, c):
    """Whatever the load's utilization, canary lengths and bound: a canary that takes
    as long as its estimate leaves the measured share within the bound, and starts
    at least an interval after the one before."""
    pacer = CanaryPacer(interval_s=interval, max_share=share, concurrency=c)
    t, last = 0.0, None
    pacer.started(0.0)
    for round_ in range(3):
        for d in durations:
            for _ in range(10_000):
                wait = pacer.wait_s(now=t, load_busy_s=busy * c * t, estimate_s=d)
                if wait <= 0:
                    break
                t += wait
            assert wait <= 0
            assert last is None or t - last >= interval - 1e-9
            pacer.started(t)
            last = t
            t += d
            pacer.finished(d)
            assert pacer.share(busy * c * t) <= share + 1e-9


def test_short_prompts_are_fixed_by_the_seed_and_digests_name_the_request():
    a, b = short_prompts(count=4, seed=7, max_tokens=32), short_prompts(count=4, seed=7, max_tokens=32)
    assert a == b and len({p.digest for p in a}) == 4
    assert short_prompts(count=4, seed=7, max_tokens=16)[0].digest != a[0].digest
    assert len(short_prompts(count=40, seed=7, max_tokens=32)) == 40


def test_long_prompts_reuse_each_sessions_first_turn():
    first = {"messages": [{"role": "system", "content": "S" * 1000}, {"role": "user", "content": "repo"}],
             "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto", "stream": True}

    class Session:
        def __init__(self, i):
            self.i = i

        def next_turn(self):
            return SimpleNamespace(path="/v1/chat/completions", body=json.dumps(first).encode(),
                                   planned_prompt_tokens=190_000 + self.i)

    workload = SimpleNamespace(mode="sessions", new_session=lambda i: Session(i) if i < 1 else None)
    prompts, note = long_prompts(workload, count=2, max_tokens=32)
    assert len(prompts) == 1 and "1 of 2" in note
    prompt, choice = prompts[0]
    assert prompt.long and prompt.approx_prompt_tokens == 190_000 and choice == "auto"
    assert list(prompt.messages[:2]) == first["messages"]  # the cached prefix, byte for byte
    body = json.loads(body_of(prompt, model="m", top_logprobs=5, tool_choice=choice))
    assert body["tools"] == first["tools"] and body["tool_choice"] == "auto" and body["stream"] is False


# -- whatever the server answers, a bad verdict is the judge's ---------------------

_lp = st.one_of(st.floats(allow_nan=False, allow_infinity=False, min_value=-50, max_value=0), st.none(),
                st.text(max_size=3), st.booleans())
_entry = st.one_of(
    st.fixed_dictionaries({"token": st.sampled_from(WORDS + ["~", "x"]), "logprob": _lp,
                           "top_logprobs": st.lists(st.fixed_dictionaries({"token": st.sampled_from(WORDS + ["~"]),
                                                                           "logprob": _lp}), max_size=3)}),
    st.integers(), st.none(), st.fixed_dictionaries({"token": st.integers()}))
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                     lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3),
                     max_leaves=10)
_body = st.one_of(
    st.builds(lambda content, finish: {"model": "m", "choices": [{"message": {"content": "x"}, "finish_reason": finish,
                                                                  "logprobs": {"content": content}}]},
              st.lists(_entry, max_size=10), st.sampled_from(["length", "stop", None, 3])),
    _json)
REFERENCE = answer_from_body(chat_body(WORDS))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=_body)
def test_a_bad_verdict_only_where_the_judge_finds_an_unexplained_divergence(body):
    async def one() -> CanarySample:
        async def handler(request):
            return web.Response(body=json.dumps(body).encode(), content_type="application/json")

        runner, url = await serve_any_path(handler)
        try:
            async with outbound_session() as s:
                p, _, _ = probe(url, s, book=ReferenceBook(tie_margin=0.2, recorded={"short-0": REFERENCE}))
                return await p.ask(p.canaries[0])
        finally:
            await runner.cleanup()

    sample = asyncio.run(one())
    assert isinstance(sample, CanarySample)
    answer = answer_from_body(json.loads(json.dumps(body)))
    if sample.verdict in BAD:
        assert usable(answer) is None
        assert judge_answer(REFERENCE, answer, tie_margin=0.2).verdict in BAD
    elif sample.verdict is not CanaryVerdict.UNJUDGED:
        assert sample.verdict in (CanaryVerdict.MATCH, CanaryVerdict.EXPLAINED)


async def test_the_end_lets_a_canary_in_flight_answer_then_cuts_one_that_cannot_and_records_it():
    """The server counts a canary's tokens whether or not the harness waits for it,
    so every canary sent is on the record: answered within the grace, or cut and
    said to be cut; none starts once the probe is closing."""
    release = asyncio.Event()
    arrived = asyncio.Event()
    sent = 0

    async def handler(request):
        nonlocal sent
        sent += 1
        arrived.set()
        await release.wait()
        return web.json_response(chat_body(WORDS))

    runner, url = await serve_any_path(handler)
    async with outbound_session() as s:
        p, got, _ = probe(url, s, interval=0.01, share=0.9, tracker=FullLoad(4, SystemClock().monotonic()))
        p.start()
        await asyncio.wait_for(arrived.wait(), 5)
        asyncio.get_running_loop().call_later(0.05, release.set)
        await p.aclose(grace_s=5.0)  # answered within its grace
        assert [g.error for g in got] == [None] and sent == 1

        release.clear()
        arrived.clear()
        p2, got2, _ = probe(url, s, interval=0.01, share=0.9, tracker=FullLoad(4, SystemClock().monotonic()))
        p2.start()
        await asyncio.wait_for(arrived.wait(), 5)
        await p2.aclose(grace_s=0.05)  # the server never answers: cut, on the record
        await p2.aclose(grace_s=0.05)  # idempotent
        release.set()
    await runner.cleanup()
    assert sent == 2 and len(got2) == 1
    assert got2[0].verdict is CanaryVerdict.UNJUDGED and got2[0].error.startswith("cut:")
    assert got2[0].started_at is not None and got2[0].e2e_s >= 0.05
