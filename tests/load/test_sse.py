"""The SSE decoder on chunks split anywhere: every split of a stream decodes to
the same events as the whole stream in one piece."""

from __future__ import annotations

import json

import pytest

from soak.load.sse import SSEDecoder, SSEEvent


def decode_all(chunks: list[bytes]) -> tuple[list[SSEEvent], SSEDecoder]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for chunk in chunks:
        events.extend(decoder.feed(chunk))
    events.extend(decoder.flush())
    return events, decoder


def vllm_stream(newline: bytes) -> bytes:
    parts = []
    for word in ("Hé", "llo", " wörld ", "日本語", "🙂"):
        chunk = {"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
        parts.append(b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + newline + newline)
    parts.append(b": keep-alive comment" + newline)
    parts.append(b"data: [DONE]" + newline + newline)
    return b"".join(parts)


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_every_two_way_split_gives_the_same_events(newline: bytes) -> None:
    stream = vllm_stream(newline)
    whole, decoder = decode_all([stream])
    assert [e.data for e in whole][-1] == "[DONE]"
    assert whole[-1].is_done
    texts = "".join(json.loads(e.data)["choices"][0]["delta"]["content"] for e in whole[:-1])
    assert texts == "Héllo wörld 日本語🙂"
    assert decoder.comments == 1
    for cut in range(1, len(stream)):
        events, _ = decode_all([stream[:cut], stream[cut:]])
        assert events == whole, f"split at byte {cut}"


def test_byte_at_a_time_and_three_way_splits() -> None:
    stream = vllm_stream(b"\r\n")
    whole, _ = decode_all([stream])
    assert decode_all([bytes([b]) for b in stream])[0] == whole
    for a in range(1, len(stream), 7):
        for b in range(a + 1, len(stream), 11):
            assert decode_all([stream[:a], stream[a:b], stream[b:]])[0] == whole


def test_split_inside_a_multibyte_character_is_not_replaced() -> None:
    raw = "data: 🙂é\n\n".encode()
    emoji_start = raw.index("🙂".encode())
    decoder = SSEDecoder()
    assert decoder.feed(raw[: emoji_start + 2]) == []
    events = decoder.feed(raw[emoji_start + 2 :])
    assert [e.data for e in events] == ["🙂é"]
    assert "\ufffd" not in events[0].data


def test_cr_at_end_of_chunk_then_lf_is_one_line_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\n") == []
    # One blank line (not two) dispatches exactly one event.
    events = decoder.feed(b"\r\n")
    assert [e.data for e in events] == ["a"]
    assert decoder.feed(b"data: b\r") == []
    # "\r\r" is a line end and a blank line: the event is out at once, not held
    # back until the next chunk shows whether a "\n" follows.
    assert [e.data for e in decoder.feed(b"\r")] == ["b"]
    assert [e.data for e in decoder.feed(b"\ndata: c\n\n")] == ["c"]


def test_multiline_data_event_id_retry_and_comments() -> None:
    events, decoder = decode_all(
        [b": comment one\n:another\nevent: update\nid: 7\nretry: 1500\ndata: line one\ndata:line two\ndata\n\n"]
    )
    assert events == [SSEEvent(data="line one\nline two\n", event="update", id="7", retry=1500)]
    assert decoder.comments == 2
    assert decoder.malformed_lines == 0


def test_malformed_lines_are_counted_not_fatal() -> None:
    events, decoder = decode_all([b"garbage line\nfoo: bar\nretry: soon\ndata: ok\n\n"])
    assert [e.data for e in events] == ["ok"]
    # "garbage line" is a field name with no value (spec: ignored), "foo" unknown, retry not a number.
    assert decoder.malformed_lines == 3


def test_blank_lines_without_data_dispatch_nothing() -> None:
    events, _ = decode_all([b"\n\n\nevent: x\n\ndata: y\n\n"])
    assert events == [SSEEvent(data="y")]


def test_flush_returns_an_event_missing_its_blank_line() -> None:
    events, _ = decode_all([b"data: [DONE]"])
    assert [e.data for e in events] == ["[DONE]"]
    events, _ = decode_all([b"data: [DONE]\r"])
    assert [e.data for e in events] == ["[DONE]"]


def test_invalid_utf8_is_replaced_not_raised() -> None:
    events, _ = decode_all([b"data: \xff\xfe ok\n\n"])
    assert events[0].data.endswith(" ok")
    assert "\ufffd" in events[0].data
