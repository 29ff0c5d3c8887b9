"""The streaming client against a real aiohttp server on loopback that misbehaves
on request: each failure lands in the record's outcome and the client goes on."""

from __future__ import annotations

import asyncio
import json
from ports import free_port  # per-worker ports: tests/ports.py
from dataclasses import dataclass

import pytest
from aiohttp import web

from soak.load.client import StreamingClient
from soak.load.config import TimeoutsConfig
from soak.load.progress import ProgressTracker


@dataclass(frozen=True)
class Turn:
    path: str
    body: bytes
    session_id: str | None = "s1"
    turn: int | None = 0
    planned_prompt_tokens: int | None = 100
    max_tokens: int = 5
    think_time_s: float = 0.0


def chunk(content: str | None = None, finish: str | None = None, usage: dict | None = None) -> bytes:
    obj: dict = {"id": "c", "object": "chat.completion.chunk", "choices": []}
    if content is not None or finish is not None:
        obj["choices"] = [{"index": 0, "delta": {"content": content} if content else {}, "finish_reason": finish}]
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def behaviour(request: web.Request) -> web.StreamResponse:
    mode = request.match_info["mode"]
    await request.read()
    if mode == "status":
        return web.json_response({"error": {"message": "model overloaded", "code": 503}}, status=503)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if mode == "first_token":
        await response.write(b": waiting\n\n")
        await asyncio.sleep(30)
    if mode == "ping_only":  # keep-alive comments and nothing else, for ever
        for _ in range(600):
            await response.write(b": ping\n\n")
            await asyncio.sleep(0.05)
    await response.write(b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}).encode() + b"\n\n")
    for i in range(5):
        await response.write(chunk(f"t{i}"))
        await asyncio.sleep(0.01)
        if mode == "stall" and i == 2:
            await asyncio.sleep(30)
        if mode == "ping_stall" and i == 2:  # generation stops; keep-alives go on
            for _ in range(600):
                await response.write(b": ping\n\n")
                await asyncio.sleep(0.05)
        if mode == "reset" and i == 2:
            request.transport.abort()  # type: ignore[union-attr]
            return response
        if mode == "malformed" and i == 2:
            await response.write(b"data: {not json\n\n")
    await response.write(chunk(finish="stop"))
    # "spec": five chunks carrying 17 tokens, as speculative decoding sends them.
    completion = 17 if mode == "spec" else 5
    usage = {"prompt_tokens": 120, "completion_tokens": completion, "total_tokens": 120 + completion, "prompt_tokens_details": {"cached_tokens": 96}}
    await response.write(chunk(usage=usage))
    if mode != "no_done":
        await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


@pytest.fixture
async def server_url():
    app = web.Application()
    app.router.add_post("/{mode}/v1/chat/completions", behaviour)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


@pytest.fixture
async def make_client():
    clients: list[StreamingClient] = []

    async def make(base_url: str, **timeouts) -> StreamingClient:
        client = StreamingClient(
            base_url=base_url,
            timeouts=TimeoutsConfig(**{"connect": 2, "first_token": 5, "stall": 5, "total": 20, **timeouts}),
            tracker=ProgressTracker(),
            max_connections=8,
            sweep_interval_s=0.05,
        )
        await client.start()
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


def turn(mode: str) -> Turn:
    return Turn(path=f"/{mode}/v1/chat/completions", body=b'{"stream": true}')


async def test_ok_stream_measures_ttft_itl_tpot_and_usage(server_url, make_client) -> None:
    client = await make_client(server_url)
    record = await client.send(turn("ok"), request_id="r1")
    assert record.outcome == "ok", record.error
    assert record.prompt_tokens == 120 and record.cached_tokens == 96 and record.output_tokens == 5
    assert record.finish_reason == "stop"
    assert 0 < record.ttft_s <= record.e2e_s
    assert record.itl_max_s >= record.itl_p50_s > 0
    assert record.tpot_s == pytest.approx((record.e2e_s - record.ttft_s) / 4)
    assert record.bytes_sent == len(b'{"stream": true}') and record.bytes_received > 0
    assert record.ended_at >= record.started_at


@pytest.mark.parametrize(
    "mode, outcome",
    [("status", "http_status"), ("reset", "reset"), ("malformed", "malformed_stream"), ("no_done", "malformed_stream")],
)
async def test_failures_are_classified_and_the_client_goes_on(server_url, make_client, mode, outcome) -> None:
    client = await make_client(server_url)
    record = await client.send(turn(mode), request_id="r1")
    assert record.outcome == outcome, record.error
    if mode == "status":
        assert record.http_status == 503 and "model overloaded" in record.error
    again = await client.send(turn("ok"), request_id="r2")
    assert again.outcome == "ok"


@pytest.mark.parametrize("mode, timeouts, outcome", [
    ("stall", {"stall": 0.3}, "timeout_stall"),
    ("first_token", {"first_token": 0.3}, "timeout_first_token"),
    ("stall", {"total": 0.3}, "timeout_total"),
    # Keep-alive bytes are not progress: the stall and first-token clocks run on tokens.
    ("ping_stall", {"stall": 0.3}, "timeout_stall"),
    ("ping_only", {"first_token": 0.3}, "timeout_first_token"),
])
async def test_each_timeout_is_named(server_url, make_client, mode, timeouts, outcome) -> None:
    client = await make_client(server_url, **timeouts)
    record = await client.send(turn(mode), request_id="r1")
    assert record.outcome == outcome
    assert record.e2e_s is None
    assert (await client.send(turn("ok"), request_id="r2")).outcome == "ok"


async def test_refused_connection(make_client) -> None:
    client = await make_client(f"http://127.0.0.1:{free_port()}")  # a port no test listens on
    record = await client.send(turn("ok"), request_id="r1")
    assert record.outcome == "refused"


async def test_abort_in_flight_yields_aborted_records(server_url, make_client) -> None:
    client = await make_client(server_url)
    tasks = [asyncio.create_task(client.send(turn("stall"), request_id=f"r{i}")) for i in range(3)]
    while client._tracker.in_flight < 3 or client._tracker.tokens_total < 9:
        await asyncio.sleep(0.02)
    assert client.abort_in_flight("restart") == 3
    records = await asyncio.gather(*tasks)
    assert {r.outcome for r in records} == {"aborted"}
    assert client._tracker.in_flight == 0 and client._tracker.requests_done == 3


async def test_outer_cancellation_propagates(server_url, make_client) -> None:
    client = await make_client(server_url)
    task = asyncio.create_task(client.send(turn("stall"), request_id="r1"))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_progress_counts_the_servers_tokens_not_chunks(server_url, make_client) -> None:
    client = await make_client(server_url)
    # max_tokens 32: a server never generates past the request's max_tokens (chunks.counted_tokens).
    record = await client.send(Turn(path="/spec/v1/chat/completions", body=b'{"stream": true}', max_tokens=32),
                               request_id="r1")
    assert record.outcome == "ok" and record.output_tokens == 17 and not record.anomalies, record.anomaly_notes
    snapshot = client._tracker.snapshot(0.0)
    assert snapshot.tokens_total == 17 and snapshot.requests_done == 1


# -- any bytes on a stream are a recorded outcome -------------------------------
def _data(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


_OK = _data({"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]})
_DONE = b"data: [DONE]\n\n"
# name -> (raw body, expected outcome, expected anomalies > 0)
ODD_BODIES = {
    "delta_is_a_string": (_OK + _data({"choices": [{"delta": "oops"}]}) + _DONE, "malformed_stream", False),
    "choices_is_an_object": (_OK + _data({"choices": {"0": 1}}) + _DONE, "malformed_stream", False),
    "usage_is_a_number": (_OK + _data({"choices": [], "usage": 5}) + _DONE, "ok", True),
    "null_everywhere": (_OK + _data({"id": None, "choices": [{"delta": None, "finish_reason": None, "text": None}],
                                     "usage": None, "error": None}) + _DONE, "ok", False),
    "counts_as_strings": (_OK + _data({"choices": [], "usage": {"prompt_tokens": "10", "completion_tokens": "1"}})
                          + _DONE, "ok", True),
    "huge_ints": (_OK + _data({"choices": [], "usage": {"completion_tokens": 10**40}}) + _DONE, "ok", True),
    "int_with_5000_digits": (_OK + _data(b'{"usage": {"completion_tokens": ' + b"9" * 5000 + b"}}") + _DONE,
                             "malformed_stream", False),
    "deep_nesting": (_OK + _data(b"[" * 50_000 + b"]" * 50_000) + _DONE, "malformed_stream", False),
    "non_utf8_in_a_string": (_data(b'{"choices": [{"delta": {"content": "\xff\xfe\xc3"}}]}') + _DONE, "ok", False),
    "non_utf8_outside_json": (_OK + b"data: \xff\xfe{]\n\n" + _DONE, "malformed_stream", False),
    "missing_done": (_OK, "malformed_stream", False),
    "error_mid_stream": (_OK + _data({"error": {"message": "boom", "type": "BadRequestError", "code": 400}}) + _DONE,
                         "error", False),
    "error_not_an_object": (_OK + _data({"error": ["x", {"y": 1}]}) + _DONE, "error", False),
    "crlf_framing": ((_OK + _DONE).replace(b"\n", b"\r\n"), "ok", False),
    "cr_framing": ((_OK + _DONE).replace(b"\n", b"\r"), "ok", False),
    "comments_and_events": (b": hello\n\nevent: delta\nid: 3\nretry: 10\n" + _OK + b": bye\n" + _DONE, "ok", False),
    "multi_line_data": (b'data: {"choices":\ndata: [{"delta": {"content": "a"}}]}\n\n' + _DONE, "ok", False),
    "html_not_sse": (b"<html><body>502 Bad Gateway</body></html>", "malformed_stream", False),
    "data_after_done": (_OK + _DONE + _OK, "malformed_stream", False),
    "multi_megabyte_content": (_data({"choices": [{"delta": {"content": "x" * 3_000_000}}]}) + _DONE, "ok", False),
    "endless_line": (b"data: " + b"z" * 20_000_000, "malformed_stream", False),
}


# Usage objects as vLLM versions write them (read by the version-aware hook).
USAGE_BODIES = {
    "usage_without_details": _OK + _data({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 1}})
    + _DONE,
    "usage_with_bad_details": _OK + _data({"choices": [], "usage": {
        "prompt_tokens": 10, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": "7"}}}) + _DONE,
    "no_usage": _OK + _DONE,
}


async def odd_body(request: web.Request) -> web.StreamResponse:
    await request.read()
    name = request.match_info["name"]
    body = ODD_BODIES[name][0] if name in ODD_BODIES else USAGE_BODIES[name]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for i in range(0, len(body), 7919):  # odd-sized pieces, as a proxy might forward them
        await response.write(body[i : i + 7919])
    await response.write_eof()
    return response


@pytest.fixture
async def odd_url():
    app = web.Application()
    app.router.add_post("/{name}/v1/chat/completions", odd_body)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


@pytest.mark.parametrize("name", sorted(ODD_BODIES))
async def test_odd_stream_bytes_are_a_recorded_outcome(odd_url, make_client, name) -> None:
    _, outcome, anomalous = ODD_BODIES[name]
    client = await make_client(odd_url)
    record = await client.send(Turn(path=f"/{name}/v1/chat/completions", body=b"{}"), request_id="r1")
    assert record.outcome == outcome, (record.outcome, record.error)
    assert (record.anomalies > 0) == anomalous, record.anomaly_notes
    assert record.ended_at >= record.started_at
    # The client goes on: the next request on the same session is served.
    again = await client.send(Turn(path="/crlf_framing/v1/chat/completions", body=b"{}"), request_id="r2")
    assert again.outcome == "ok"


async def test_a_missing_cached_field_reads_as_the_version_says_and_an_unreadable_one_stays_unknown(
        odd_url, make_client) -> None:
    """vLLM 0.11.x leaves prompt_tokens_details out when nothing was cached: with
    the run's version-aware reader that is 0; an unreadable field stays unknown
    (an anomaly), and a stream with no usage at all has no cached count."""
    from soak.versions import cached_tokens, profile_for

    client = await make_client(odd_url)
    profile = profile_for("0.11.2")
    client.usage_cached_tokens = lambda usage: cached_tokens(usage, profile=profile, details_enabled=True)
    records = {}
    for name in ("usage_without_details", "usage_with_bad_details", "no_usage"):
        records[name] = await client.send(Turn(path=f"/{name}/v1/chat/completions", body=b"{}"), request_id=name)
    assert records["usage_without_details"].cached_tokens == 0
    assert records["usage_with_bad_details"].cached_tokens is None and records["usage_with_bad_details"].anomalies
    assert records["no_usage"].cached_tokens is None
    client.usage_cached_tokens = None  # no reader: a missing field is unknown
    again = await client.send(Turn(path="/usage_without_details/v1/chat/completions", body=b"{}"), request_id="x")
    assert again.cached_tokens is None
