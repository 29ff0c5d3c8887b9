"""Property-based tests (hypothesis) of the two pure steps every server byte goes
through: the SSE decoder (any bytes, any framing, any split) and chunk reading
(any text, any JSON shape). Neither may raise anything but the two recorded
outcomes, and the decoder stays linear on a multi-megabyte line."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soak.errors import MalformedStream, StreamErrorObject
from soak.load.chunks import MAX_COUNT, Chunk, ContentTemplate, interpret, measure
from soak.load.sse import SSEDecoder, SSEEvent

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def decode(chunks: list[bytes], **kw) -> tuple[list[SSEEvent], SSEDecoder]:
    decoder = SSEDecoder(**kw)
    events: list[SSEEvent] = []
    for piece in chunks:
        events.extend(decoder.feed(piece))
    events.extend(decoder.flush())
    return events, decoder


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, last = [], 0
    for p in points:
        out.append(data[last:p])
        last = p
    out.append(data[last:])
    return out


# -- SSE framing --------------------------------------------------------------
newlines = st.sampled_from(["\n", "\r\n", "\r"])
field_values = st.text(alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=30)
lines = st.one_of(
    st.builds(lambda v: f"data: {v}", field_values),
    st.builds(lambda v: f"data:{v}", field_values),
    st.just("data"),
    st.builds(lambda v: f"event: {v}", field_values),
    st.builds(lambda v: f"id: {v}", field_values),
    st.builds(lambda v: f"retry: {v}", field_values),
    st.builds(lambda v: f": {v}", field_values),
    st.builds(lambda v: f"{v}", field_values),
    st.just(""),
    st.just("data: [DONE]"),
)


@st.composite
def sse_streams(draw) -> bytes:
    parts = draw(st.lists(st.tuples(lines, newlines), max_size=40))
    text = "".join(line + nl for line, nl in parts)
    if draw(st.booleans()):
        text = text.rstrip("\r\n")  # a stream cut before its last line end
    return text.encode("utf-8")


@SETTINGS
@given(sse_streams(), st.lists(st.integers(min_value=0), max_size=12))
def test_any_split_of_any_sse_stream_gives_the_events_of_the_whole(stream: bytes, cuts: list[int]) -> None:
    whole, decoder = decode([stream])
    pieces, _ = decode(split(stream, cuts))
    assert pieces == whole
    # One byte at a time too: the hardest split for "\r" + "\n" and UTF-8.
    assert decode([bytes([b]) for b in stream])[0] == whole
    for event in whole:
        assert event.data != ""  # the spec: an empty data buffer dispatches nothing


@SETTINGS
@given(st.binary(max_size=2000), st.lists(st.integers(min_value=0), max_size=8))
def test_arbitrary_bytes_never_raise_and_split_does_not_matter(data: bytes, cuts: list[int]) -> None:
    whole, decoder = decode([data])
    assert decode(split(data, cuts))[0] == whole
    assert all(isinstance(e.data, str) and isinstance(e.event, str) for e in whole)
    assert decoder.work <= 3 * len(data) + 16


@SETTINGS
@given(st.lists(st.sampled_from(["\n", "\r\n", "\r"]), min_size=1, max_size=6), st.lists(st.integers(min_value=0), max_size=6))
def test_line_ends_of_every_kind_frame_the_same_events(ends: list[str], cuts: list[int]) -> None:
    body = "".join(f"data: {i}{nl}{nl}" for i, nl in enumerate(ends)).encode()
    events, _ = decode(split(body, cuts))
    assert [e.data for e in events] == [str(i) for i in range(len(ends))]


def test_a_multi_megabyte_line_in_small_pieces_is_linear_work() -> None:
    """Work the decoder does (characters scanned or copied) per input character
    stays constant as the line grows: not quadratic re-joining of the open line."""
    ratios = []
    for megabytes in (1, 4):
        payload = "x" * (megabytes * 1024 * 1024)
        raw = f"data: {payload}\n\n".encode()
        decoder = SSEDecoder(max_chars=8 * 1024 * 1024)
        events = []
        for i in range(0, len(raw), 1024):
            events.extend(decoder.feed(raw[i : i + 1024]))
        events.extend(decoder.flush())
        assert [len(e.data) for e in events] == [len(payload)]
        ratios.append(decoder.work / len(raw))
        # The open line is held as pieces, joined once: never a growing string.
        assert decoder._parts == [] and decoder._parts_len == 0
    assert ratios[1] <= ratios[0] * 1.05
    assert ratios[1] < 4.0


def test_a_line_past_the_bound_is_dropped_and_counted_not_held() -> None:
    decoder = SSEDecoder(max_chars=10_000)
    raw = b"data: " + b"y" * 50_000
    for i in range(0, len(raw), 512):
        assert decoder.feed(raw[i : i + 512]) == []
    assert decoder.oversized == 1 and decoder._parts_len == 0
    assert [e.data for e in decoder.feed(b"\n\ndata: ok\n\n")] == ["ok"]


# -- chunk reading ------------------------------------------------------------
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)),
    max_leaves=12,
)
# Keys a chunk is read by, so shapes near the real one come up often.
keys = st.sampled_from(["choices", "delta", "content", "reasoning_content", "text", "tool_calls", "usage",
                        "finish_reason", "error", "message", "prompt_tokens", "completion_tokens",
                        "prompt_tokens_details", "cached_tokens", "index"])
chunky = st.recursive(
    json_scalars,
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(keys, children, max_size=5)),
    max_leaves=16,
)


def check_total(data: str) -> Chunk | None:
    try:
        chunk = interpret(data)
    except (MalformedStream, StreamErrorObject):
        return None
    assert isinstance(chunk, Chunk) and chunk.content >= 0
    if chunk.usage is not None:
        for value in (chunk.usage.prompt_tokens, chunk.usage.completion_tokens, chunk.usage.cached_tokens):
            assert value is None or (type(value) is int and 0 <= value <= MAX_COUNT)
    assert chunk.finish_reason is None or isinstance(chunk.finish_reason, str)
    return chunk


@SETTINGS
@given(chunky)
def test_any_json_shape_is_a_chunk_or_a_recorded_outcome(value) -> None:
    check_total(json.dumps(value))
    check_total(json.dumps({"choices": [value]}))
    check_total(json.dumps({"choices": [{"delta": value, "finish_reason": None}]}))
    check_total(json.dumps({"choices": [{"delta": {"content": "a"}}], "usage": value}))


@SETTINGS
@given(json_values)
def test_any_json_value_is_a_chunk_or_a_recorded_outcome(value) -> None:
    check_total(json.dumps(value))


@SETTINGS
@given(st.text(max_size=300))
def test_any_text_is_a_chunk_or_a_recorded_outcome(text: str) -> None:
    check_total(text)


def test_the_shapes_that_crashed_the_harness_are_outcomes() -> None:
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    malformed = [
        {**base, "choices": [{"index": 0, "delta": "oops", "finish_reason": None}]},
        {**base, "choices": {"0": 1}},
        {**base, "choices": [5]},
        {**base, "choices": [{"delta": {"content": 5}}]},
        {**base, "choices": [{"delta": {"tool_calls": "call"}}]},
        {**base, "choices": [{"text": ["a"]}]},
        [1, 2],
        "a string",
        None,
    ]
    for obj in malformed:
        try:
            interpret(json.dumps(obj))
        except MalformedStream:
            continue
        raise AssertionError(f"{obj!r} was read as a chunk")
    for text in ("{not json", "[" * 100_000 + "]" * 100_000, "1" * 5000, "\ufffd\ufffd", ""):
        try:
            interpret(text)
        except MalformedStream:
            continue
        raise AssertionError(f"{text[:20]!r} was read as a chunk")
    try:
        interpret(json.dumps({"error": {"message": "prompt too long", "type": "BadRequestError", "code": 400}}))
    except StreamErrorObject as exc:
        assert "prompt too long" in str(exc) and exc.outcome == "error"
    else:
        raise AssertionError("an error object was read as a chunk")

    # Odd but countable: the usage is ignored and noted, the content still counts.
    for usage in (5, "12", {"completion_tokens": "12"}, {"completion_tokens": 10**30}, {"completion_tokens": True},
                  {"completion_tokens": -1}, {"completion_tokens": 1.5}, {"prompt_tokens_details": 3}):
        chunk = interpret(json.dumps({**base, "choices": [{"delta": {"content": "a"}}], "usage": usage}))
        assert chunk.content == 1 and chunk.anomalies, usage
        assert chunk.usage is None or chunk.usage.completion_tokens is None
    # null everywhere is "absent".
    chunk = interpret(json.dumps({**base, "choices": [{"index": 0, "delta": {"content": None, "role": None},
                                                       "finish_reason": None, "logprobs": None}],
                                  "usage": None, "error": None}))
    assert chunk == Chunk(model=base.get("model"))
    assert interpret(json.dumps({"choices": None, "usage": {"completion_tokens": 7}})).usage.completion_tokens == 7


# -- the cheap path for content chunks ----------------------------------------
def vllm_chunk(content: str, *, finish=None, usage=None, spaces=False) -> str:
    obj = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 17, "model": "m",
           "choices": [{"index": 0, "delta": {"content": content}, "logprobs": None, "finish_reason": finish}]}
    if usage is not None:
        obj["usage"] = usage
    return json.dumps(obj, separators=None if spaces else (",", ":"), ensure_ascii=False)


@SETTINGS
@given(st.text(min_size=1, max_size=20), st.text(max_size=40), st.booleans())
def test_a_template_match_reads_exactly_as_the_full_parse(first: str, later: str, spaces: bool) -> None:
    template = ContentTemplate()
    data = vllm_chunk(first, spaces=spaces)
    template.learn(data, interpret(data))
    candidates = [
        vllm_chunk(later, spaces=spaces), vllm_chunk(later, finish="stop", spaces=spaces),
        vllm_chunk(later, usage={"completion_tokens": 3}, spaces=spaces),
        data.replace('"content"', '"reasoning"'), data[:-1], data + " ", later,
    ]
    for candidate in candidates:
        text = template.content_of(candidate)
        assert template.matches(candidate) == (text is not None)
        if text is not None:
            size, solid = measure(text)
            # The same model as the learned chunk, too: the client reads the model from full parses only.
            assert interpret(candidate) == Chunk(content=1, text_bytes=size, substantive=solid, text=text,
                                                 model=interpret(data).model), candidate


def test_the_template_is_learned_from_plain_content_and_skips_the_parse() -> None:
    template = ContentTemplate()
    data = vllm_chunk("Hello")
    template.learn(data, interpret(data))
    assert template.learned
    assert template.matches(vllm_chunk(" world"))
    assert template.matches(vllm_chunk("日本語"))
    assert not template.matches(vllm_chunk('say "hi"'))  # escapes: the full parse
    assert not template.matches(vllm_chunk(""))  # empty content is not output
    assert not template.matches(vllm_chunk("x", finish="stop"))
    assert not template.matches(vllm_chunk("x").replace('{"content":"x"}', '"oops"'))
    # Not learned from a chunk that is not plain content.
    for odd in (vllm_chunk("a", finish="length"), vllm_chunk("a", usage={"completion_tokens": 1}),
                vllm_chunk('a"b'), json.dumps({"choices": [{"delta": {"content": "a"}}, {"delta": {"content": "b"}}]})):
        fresh = ContentTemplate()
        fresh.learn(odd, interpret(odd))
        assert not fresh.learned, odd
