"""What counts as generated output, and how many tokens a request is counted for
(soak.load.chunks: ``measure``, ``_has_content``, ``counted_tokens``; the client
applies them per request). Properties over generated streams, then the real
client against a loopback server that answers with nothing, whitespace, empty
tool calls or an absurd usage claim."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soak.criteria import CriteriaConfig, RequestTally, judge
from soak.criteria.rules import generated_tokens
from soak.load.chunks import counted_tokens, interpret
from soak.load.client import StreamingClient, _Stream
from soak.load.config import TimeoutsConfig
from soak.load.progress import ProgressTracker
from loopback_app import serve_any_path
from test_client import Turn

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
WHITESPACE = st.text(alphabet=" \t\n\r\u00a0\u2003\u3000", max_size=6)
EMPTY_CALL = st.sampled_from([{}, {"index": 0}, {"id": "call_1", "type": "function"},
                              {"index": 0, "function": {}}, {"function": {"name": "", "arguments": ""}},
                              {"function": {"name": None, "arguments": None}}, {"function": "f"}, "x", None])


def event(delta: dict, *, finish=None, usage=None) -> str:
    obj = {"id": "c", "object": "chat.completion.chunk", "model": "m",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        obj["usage"] = usage
    return json.dumps(obj, separators=(",", ":"))


@st.composite
def hollow_deltas(draw):
    """A delta that says nothing: whitespace in any content field, empty tool calls, a role."""
    kind = draw(st.sampled_from(("content", "reasoning_content", "reasoning", "tool_calls", "role", "mixed")))
    if kind == "role":
        return {"role": "assistant"}
    if kind == "tool_calls":
        return {"tool_calls": draw(st.lists(EMPTY_CALL, max_size=3))}
    if kind == "mixed":
        return {"content": draw(WHITESPACE), "tool_calls": draw(st.lists(EMPTY_CALL, max_size=2))}
    return {kind: draw(WHITESPACE)}


def played(events: list[str], max_tokens: int | None = 64):
    """The client's record of a stream that delivered ``events`` then [DONE] (no network)."""
    client = StreamingClient(base_url="http://127.0.0.1:9", timeouts=TimeoutsConfig(), tracker=ProgressTracker(),
                             max_connections=1)
    _, progress = client._tracker.open(0.0)
    state = _Stream(max_tokens)
    for i, data in enumerate(events + ["[DONE]"]):
        client._on_event(data, 0.01 * (i + 1), progress, state)
    turn = Turn(path="/v1/chat/completions", body=b"{}", max_tokens=max_tokens or 0)
    return client._record(turn, "r", False, 1000.0, 0.0, progress, state, None), progress


@SETTINGS
@given(st.lists(hollow_deltas(), min_size=1, max_size=12), st.none() | st.integers(min_value=0, max_value=2**31 - 1))
def test_a_stream_of_whitespace_empty_tool_calls_or_nothing_generates_no_tokens(deltas, claimed) -> None:
    """Whatever the server claims, a request whose every chunk is whitespace, an
    empty tool call or nothing is no work: 0 output tokens, never a success."""
    events = [event(d) for d in deltas] + [event({}, finish="stop")]
    if claimed is not None:
        events.append(json.dumps({"choices": [], "usage": {"completion_tokens": claimed}}))
    record, _ = played(events)
    assert record.outcome == "ok"
    assert record.output_tokens == 0, (record.output_tokens, record.anomaly_notes)
    assert generated_tokens(record) == 0
    for d in deltas:  # per chunk: an empty tool call is no content, whitespace is
        chunk = interpret(event(d))
        assert not chunk.substantive
        assert chunk.content == (1 if any(isinstance(v, str) and v for v in (d.get("content"),
                                 d.get("reasoning_content"), d.get("reasoning"))) else 0), d


@SETTINGS
@given(st.text(min_size=1, max_size=8).filter(lambda t: not t.isspace()), hollow_deltas())
def test_one_word_among_whitespace_is_output(word, hollow) -> None:
    record, _ = played([event(hollow), event({"content": " "}), event({"content": word}), event({"content": " "})])
    assert record.output_tokens >= 1 and generated_tokens(record) >= 1


@SETTINGS
@given(st.sampled_from(("name", "arguments")), st.text(min_size=1, max_size=10))
def test_a_tool_call_with_a_name_or_arguments_is_content(field, text) -> None:
    chunk = interpret(event({"tool_calls": [{"index": 0, "function": {field: text}}]}))
    assert chunk.content == 1 and chunk.substantive == (not text.isspace())


@SETTINGS
@given(st.none() | st.integers(min_value=0, max_value=2**31 - 1), st.integers(min_value=0, max_value=50),
       st.integers(min_value=0, max_value=500), st.integers(min_value=0, max_value=60),
       st.none() | st.integers(min_value=-1, max_value=100))
def test_a_usage_claim_is_counted_only_within_what_arrived_and_max_tokens(claimed, chunks, text_bytes, extra,
                                                                         max_tokens) -> None:
    events = chunks + extra  # every content chunk is an event; others may come besides
    count, refused = counted_tokens(claimed, chunks=chunks, text_bytes=max(text_bytes, chunks), events=events,
                                    max_tokens=max_tokens)
    assert 0 <= count <= max(text_bytes, chunks) + events
    if max_tokens is not None and max_tokens >= 1:
        assert count <= max_tokens
    if claimed is not None:
        # Honest claims stand; a claim past the bound is refused, and said so.
        assert (refused is None) == (count == claimed)
        if refused is not None:
            assert str(claimed) in refused and count <= chunks


@SETTINGS
@given(st.integers(min_value=1, max_value=2**31 - 1), st.integers(min_value=1, max_value=64),
       st.lists(st.text(min_size=1, max_size=4).filter(lambda t: not t.isspace()), min_size=1, max_size=8))
def test_the_client_records_the_bounded_count_and_the_refusal(claimed, max_tokens, words) -> None:
    events = [event({"content": w}) for w in words] + [event({}, finish="length"),
                                                       json.dumps({"choices": [], "usage": {"completion_tokens": claimed}})]
    record, progress = played(events, max_tokens=max_tokens)
    bound = min(max_tokens, sum(len(w.encode("utf-8", "surrogatepass")) for w in words) + len(events))
    assert record.output_tokens <= bound and progress.tokens <= max(bound, len(words))
    if claimed > bound:
        assert record.anomalies >= 1 and any(f"usage.completion_tokens {claimed} refused" in n
                                             for n in record.anomaly_notes), record.anomaly_notes
    elif claimed < len(words) / 1.1 - 2:
        # Within the bound but below the chunks streamed (each holds a token): said, with both figures.
        assert record.output_tokens == claimed and record.anomalies == 1
        assert record.anomaly_notes == (f"usage claims {claimed} completion tokens, at least {len(words)} "
                                        "were streamed (content chunks)",)
    else:
        assert record.output_tokens == claimed and not record.anomalies


# -- the real client against a loopback server ----------------------------------
def _sse(data: str) -> bytes:
    return b"data: " + data.encode() + b"\n\n"


BODIES = {
    "empty": [event({"role": "assistant"}), event({}, finish="stop"),
              json.dumps({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 0}})],
    "whitespace": [event({"content": " "})] * 12 + [event({}, finish="stop"),
                                                   json.dumps({"choices": [], "usage": {"completion_tokens": 12}})],
    "empty_tool_call": [event({"tool_calls": [{}]}), event({}, finish="stop"),
                        json.dumps({"choices": [], "usage": {"completion_tokens": 500}})],
    "inflated": [event({"content": "x"}), event({}, finish="length"),
                 json.dumps({"choices": [], "usage": {"completion_tokens": 2_000_000_000}})],
    "ok": [event({"content": w}) for w in ("a", " b", " c")] + [event({}, finish="stop"),
                                                              json.dumps({"choices": [], "usage": {"completion_tokens": 3}})],
}


async def answer(request: web.Request) -> web.StreamResponse:
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    mode = request.match_info["tail"].split("/", 1)[0]  # /{mode}/v1/chat/completions
    for data in BODIES[mode] + ["[DONE]"]:
        await response.write(_sse(data))
    await response.write_eof()
    return response


@pytest.fixture
async def url():
    runner, base = await serve_any_path(answer)
    yield base
    await runner.cleanup()


async def test_the_real_client_counts_no_work_for_hollow_answers_and_refuses_absurd_usage(url) -> None:
    async with StreamingClient(base_url=url, timeouts=TimeoutsConfig(connect=2, first_token=5, stall=5, total=20),
                               tracker=ProgressTracker(), max_connections=4, sweep_interval_s=0.05) as client:
        async def send(mode: str, n: int = 1):
            return [await client.send(Turn(path=f"/{mode}/v1/chat/completions", body=b"{}", max_tokens=256),
                                      request_id=f"{mode}{i}") for i in range(n)]

        for mode in ("empty", "whitespace", "empty_tool_call"):
            (record,) = await send(mode)
            assert record.outcome == "ok" and record.output_tokens == 0 and generated_tokens(record) == 0, mode
        (inflated,) = await send("inflated")
        assert inflated.output_tokens <= 256 and inflated.anomalies
        assert any("usage.completion_tokens 2000000000 refused" in n for n in inflated.anomaly_notes)
        # One good answer, then nothing: the server answering nothing fails the error rate.
        records = await send("ok") + await send("empty", 40)
        tally = RequestTally.of(CriteriaConfig(), [r.to_json() for r in records])
        decision = judge(CriteriaConfig(), tally, final=True)
        assert not decision.passed and "error_rate" in [r.name for r in decision.failed]
        assert "no_output 40" in decision.reasons[0]
        # A rare empty completion among many good ones is within the budget.
        records = await send("ok", 40) + await send("empty")
        assert judge(CriteriaConfig(), RequestTally.of(CriteriaConfig(), [r.to_json() for r in records]),
                     final=True).passed
