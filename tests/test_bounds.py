"""Everything from outside is bounded (soak.bounds), as properties: for any
bytes, compression, nesting or line shape, a bounded reader returns data within
its limits or raises the project's own InputRejected/BoundExceeded naming the
bound; it never produces more than the bound, and never raises anything else."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopback_app import serve_any_path
from soak.bounds import (
    Bound, BodyDecoder, BoundExceeded, InputRejected, Limits, OverlongLine, decode_body, iter_lines, load_yaml,
    loads_json, read_file, value_depth, within,
)
from soak.errors import SoakError
from soak.jsonl import SKIP, JsonlLineError, parse_line, raw_lines, typed_fields, is_number, is_timestamp

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------ bodies

def _compress(data: bytes, coding: str, level: int) -> bytes:
    if coding == "gzip":
        return gzip.compress(data, compresslevel=level)
    if coding == "deflate":
        return zlib.compress(data, level)
    if coding == "raw-deflate":
        c = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
        return c.compress(data) + c.flush()
    return data


def _bomb(coding: str, size: int) -> bytes:
    """``size`` zeros compressed, built a MiB at a time (a real bomb, made at test time)."""
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "raw-deflate": -zlib.MAX_WBITS}[coding]
    c = zlib.compressobj(9, zlib.DEFLATED, wbits)
    block = bytes(1 << 20)
    out = [c.compress(block) for _ in range(size >> 20)]
    return b"".join(out) + c.flush()


codings = st.sampled_from(["", "identity", "gzip", "deflate", "raw-deflate"])


def _header(coding: str) -> str:
    return "deflate" if coding == "raw-deflate" else coding


def _feed_in_chunks(decoder: BodyDecoder, data: bytes, sizes: list[int]) -> bytes:
    out, pos, i = [], 0, 0
    while pos < len(data):
        n = sizes[i % len(sizes)] if sizes else len(data)
        out.append(decoder.feed(data[pos:pos + n]))
        pos += n
        i += 1
    out.append(decoder.finish())
    return b"".join(out)


@FAST
@given(body=st.binary(max_size=4096), coding=codings, level=st.integers(0, 9), limit=st.integers(1, 6000),
       sizes=st.lists(st.integers(1, 700), max_size=5))
def test_a_body_decodes_whole_within_its_bound_or_names_the_bound(body, coding, level, limit, sizes) -> None:
    wire = _compress(body, coding, level)
    decoder = BodyDecoder(_header(coding), limit=limit)
    try:
        out = _feed_in_chunks(decoder, wire, sizes)
    except BoundExceeded as exc:
        assert exc.bound is Bound.BODY_BYTES and "body_bytes" in str(exc)
        assert len(body) > limit or len(wire) > limit
        assert decoder.produced <= limit + 1  # one byte past the bound is how it is seen
        return
    assert out == body and len(out) <= limit


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(coding=st.sampled_from(["gzip", "deflate", "raw-deflate"]), mib=st.integers(8, 32),
       limit=st.sampled_from([1 << 10, 1 << 16, 4 << 20]), chunk=st.sampled_from([1 << 10, 64 << 10, 1 << 20]))
def test_a_decompression_bomb_stops_at_the_bound_having_produced_no_more(coding, mib, limit, chunk) -> None:
    wire = _bomb(coding, mib << 20)
    assert len(wire) * 500 < mib << 20  # a bomb: small on the wire, huge inflated
    decoder = BodyDecoder(_header(coding), limit=max(limit, len(wire)))
    with pytest.raises(BoundExceeded) as caught:
        _feed_in_chunks(decoder, wire, [chunk])
    assert caught.value.bound is Bound.BODY_BYTES
    assert decoder.produced <= decoder.limit + 1


@FAST
@given(wire=st.binary(max_size=2048), header=st.one_of(codings, st.text(max_size=20)), limit=st.integers(1, 4096))
def test_any_bytes_under_any_content_encoding_decode_or_are_rejected_as_ours(wire, header, limit) -> None:
    try:
        out = decode_body(wire, _header(header), limit=limit)
    except InputRejected as exc:
        assert isinstance(exc, SoakError) and "\n" not in str(exc)
        return
    assert len(out) <= limit


def test_gzip_members_and_cut_bodies() -> None:
    two = gzip.compress(b"ab") + gzip.compress(b"cd")
    assert decode_body(two, "gzip") == b"abcd"
    with pytest.raises(InputRejected, match="cut short"):
        decode_body(gzip.compress(b"x" * 1000)[:-10], "gzip")
    with pytest.raises(InputRejected, match="unsupported Content-Encoding"):
        decode_body(b"x", "br")
    assert decode_body(b"", "gzip") == b""


# ------------------------------------------------------------------ lines

line_shapes = st.lists(st.one_of(st.binary(max_size=300).map(lambda b: b.replace(b"\n", b"")),
                                 st.integers(0, 5000).map(lambda n: b"a" * n)), max_size=8)


@FAST
@given(lines=line_shapes, final_newline=st.booleans(), limit=st.integers(1, 2000))
def test_lines_are_returned_whole_or_as_an_overlong_marker_never_longer_than_the_bound(lines, final_newline,
                                                                                         limit) -> None:
    data = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    got = list(iter_lines(io.BytesIO(data), limit=limit, chunk=64))
    *whole, last = data.split(b"\n")  # lines end at \n only (a \r is a byte of the line)
    expected = [line + b"\n" for line in whole] + ([last] if last else [])
    assert [n for n, _ in got] == list(range(1, len(expected) + 1))
    for (number, raw), want in zip(got, expected):
        assert len(raw) <= limit + 1
        if type(raw) is OverlongLine:
            assert len(want.rstrip(b"\n")) > limit and raw.error.bound is Bound.LINE_BYTES
            assert raw.error.line == number
        else:
            assert raw == want


class Endless(io.RawIOBase):
    """/dev/zero, counted: how much a reader pulled from it."""

    def __init__(self) -> None:
        self.pulled = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = len(buffer)
        buffer[:n] = bytes(n)
        self.pulled += n
        return n


def test_an_endless_line_raises_after_reading_the_bound_and_no_more() -> None:
    raw = Endless()
    handle = io.BufferedReader(raw)
    with pytest.raises(JsonlLineError, match=r":1: a line longer than 1 KiB \(bound line_bytes\)"):
        for number, line in raw_lines(handle, limits=Limits(line_bytes=1024)):
            parse_line(line, path="/dev/zero", number=number)
    assert raw.pulled <= 1024 + 2 * 8192
    # skipping such a line gives up once it passed the skip bound: nothing after it is reachable
    raw = Endless()
    assert list(iter_lines(io.BufferedReader(raw), limit=1024, skip_limit=1 << 20, chunk=4096))[0][0] == 1
    assert raw.pulled <= (1 << 20) + 3 * 8192


def test_read_file_reads_a_device_no_further_than_the_bound(tmp_path) -> None:
    with pytest.raises(BoundExceeded, match="file_bytes"):
        read_file("/dev/zero", limit=1 << 20)
    (tmp_path / "f").write_bytes(b"x" * 10)
    assert read_file(tmp_path / "f", limit=10) == b"x" * 10


# ------------------------------------------------------------------ JSON

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=20)


def _nest(value, depth: int, brackets: str):
    for i in range(depth):
        value = [value] if brackets[i % len(brackets)] == "[" else {"k": value}
    return value


@FAST
@given(leaf=json_values, depth=st.integers(0, 400), brackets=st.sampled_from(["[", "{", "[{", "{{["]),
       max_depth=st.integers(1, 200), noise=st.text(alphabet='[]{}"\\', max_size=6))
def test_json_within_the_depth_parses_and_deeper_is_the_nesting_bound(leaf, depth, brackets, max_depth,
                                                                      noise) -> None:
    value = _nest({"s": noise, "v": leaf}, depth, brackets)
    actual = value_depth(value, stop=10**6)
    try:
        got = loads_json(json.dumps(value).encode(), max_depth=max_depth)
    except BoundExceeded as exc:
        assert exc.bound is Bound.NESTING
        assert actual > max_depth  # the brackets inside strings never count
        return
    assert actual <= max_depth and got == value


@FAST
@given(depth=st.integers(1000, 200_000), opener=st.sampled_from(["[", '{"a":']))
def test_a_deep_text_is_rejected_without_recursing(depth, opener) -> None:
    closer = "]" if opener == "[" else "}"
    with pytest.raises(BoundExceeded) as caught:
        loads_json((opener * depth + "1" + closer * depth).encode())
    assert caught.value.bound is Bound.NESTING


@FAST
@given(data=st.binary(max_size=300))
def test_any_bytes_as_json_are_a_value_or_ours(data) -> None:
    try:
        loads_json(data)
    except InputRejected:
        pass


@FAST
@given(lines=st.lists(st.one_of(st.binary(max_size=200).map(lambda b: b.replace(b"\n", b"")),
                                st.integers(100, 3000).map(lambda n: b"[" * n + b"]" * n),
                                st.integers(0, 3000).map(lambda n: b'"' + b"x" * n + b'"')), max_size=8))
def test_a_run_directory_line_of_any_shape_is_read_or_counted(lines) -> None:
    data = b"\n".join(lines) + b"\n"
    stats: dict[str, int] = {}
    kept = 0
    for number, raw in raw_lines(io.BytesIO(data), limits=Limits(line_bytes=2000)):
        value = parse_line(raw, path="x.jsonl", number=number, errors="skip", stats=stats,
                           limits=Limits(line_bytes=2000))
        kept += value is not SKIP
    nonblank = sum(1 for line in lines if line.strip())
    assert kept + stats.get("bad_lines", 0) + stats.get("torn_lines", 0) == nonblank


@FAST
@given(record=st.dictionaries(st.sampled_from(["ts", "n", "x"]), json_values, max_size=3))
def test_a_field_of_the_wrong_type_reads_as_absent_and_is_counted(record) -> None:
    stats: dict[str, int] = {}
    checks = {"ts": is_timestamp, "n": is_number}
    out = typed_fields(record, checks, stats)
    for key, check in checks.items():
        assert key not in out or out[key] is None or check(out[key])
    dropped = len(record) - len(out)
    assert stats.get("wrong_type_fields", 0) == dropped
    assert out.get("x") == record.get("x")


# ------------------------------------------------------------------ YAML

@FAST
@given(depth=st.integers(1, 3000), style=st.sampled_from(["flow-list", "flow-map", "block"]),
       max_depth=st.integers(2, 200))
def test_yaml_nesting_past_the_bound_is_one_error_with_its_line(depth, style, max_depth) -> None:
    if style == "flow-list":
        text = "a: " + "[" * depth + "1" + "]" * depth + "\n"
    elif style == "flow-map":
        text = "a: " + "{b: " * depth + "1" + "}" * depth + "\n"
    else:
        depth = min(depth, 400)
        text = "".join(" " * i + f"k{i}:\n" for i in range(depth)) + " " * depth + "v: 1\n"
    # nodes on the deepest path: the root mapping, `depth` collections, the scalar
    nodes = depth + 2
    try:
        load_yaml(text, limits=Limits(depth=max_depth))
    except BoundExceeded as exc:
        assert exc.bound is Bound.NESTING and exc.line is not None and nodes > max_depth
        return
    assert nodes <= max_depth


def test_a_yaml_alias_bomb_is_the_alias_bound() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join(f'*a{i - 1}' for _ in range(9))}]" for i in range(1, 200)]
    with pytest.raises(BoundExceeded) as caught:
        load_yaml("\n".join(lines) + "\n")
    assert caught.value.bound is Bound.YAML_ALIASES and caught.value.line is not None


@FAST
@given(text=st.text(max_size=200))
def test_any_text_as_yaml_is_a_value_or_ours(text) -> None:
    try:
        load_yaml(text)
    except InputRejected:
        pass  # ours; anything else fails the test


# ------------------------------------------------------------------ time

def test_a_call_that_trickles_ends_at_its_total_time() -> None:
    async def trickle() -> None:
        for _ in range(100):
            await asyncio.sleep(0.02)  # progress every 20 ms: no per-read timer would ever fire

    async def main() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(BoundExceeded) as caught:
            await within(0.2, trickle(), what="GET http://x/metrics")
        assert caught.value.bound is Bound.TOTAL_TIME and "GET http://x/metrics" in str(caught.value)
        return loop.time() - start

    assert asyncio.run(main()) < 1.5


# ------------------------------------------------------------------ HTTP, end to end on loopback

@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(coding=st.sampled_from(["gzip", "deflate", "raw-deflate", ""]), body=st.binary(max_size=3000),
       bomb=st.booleans())
def test_fetch_returns_the_body_or_names_the_bound_whatever_the_server_compresses(coding, body, bomb) -> None:
    import aiohttp
    from aiohttp import web

    from soak.bounds import fetch

    wire = _bomb(coding, 16 << 20) if bomb and coding else _compress(body, coding, 6)

    async def handler(request):
        return web.Response(body=wire, headers={"Content-Encoding": _header(coding)} if coding else {})

    async def main() -> None:
        runner, url = await serve_any_path(handler)
        try:
            async with aiohttp.ClientSession() as session:
                try:
                    got = await fetch(session, url + "/metrics", total_s=10, limits=Limits(body_bytes=1 << 20))
                except BoundExceeded as exc:
                    assert bomb and coding and exc.bound is Bound.BODY_BYTES
                    return
                assert not (bomb and coding) and got.body == body
        finally:
            await runner.cleanup()

    asyncio.run(main())


def test_the_stream_client_asks_for_identity_and_names_a_compressed_stream() -> None:
    from aiohttp import web

    from soak.load.client import StreamingClient
    from soak.load.config import TimeoutsConfig
    from soak.load.progress import ProgressTracker
    from soak.workload.types import TurnRequest

    asked: list[str] = []
    stream = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'

    async def handler(request):
        asked.append(request.headers.get("Accept-Encoding", ""))
        await request.read()
        return web.Response(body=gzip.compress(stream), headers={"Content-Encoding": "gzip",
                                                                  "Content-Type": "text/event-stream"})

    async def main():
        runner, url = await serve_any_path(handler)
        client = StreamingClient(base_url=url, timeouts=TimeoutsConfig(connect=2, first_token=5, stall=5, total=10),
                                 tracker=ProgressTracker(), max_connections=2)
        await client.start()
        try:
            turn = TurnRequest(session_id=None, turn=None, path="/v1/chat/completions", body=b"{}",
                               planned_prompt_tokens=None, max_tokens=4, think_time_s=0.0)
            return await client.send(turn, request_id="r1")
        finally:
            await client.aclose()
            await runner.cleanup()

    record = asyncio.run(main())
    assert asked == ["identity"]
    assert record.outcome == "malformed_stream" and "Content-Encoding: gzip" in (record.error or "")
