"""The client never reuses a connection idle as long as vLLM's uvicorn keeps one
(5 s): a request sent on a connection the server is closing fails "Server
disconnected" through no fault of the server."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiohttp import web

from soak.load.client import IDLE_CONNECTION_S, StreamingClient
from soak.load.config import TimeoutsConfig
from soak.load.progress import ProgressTracker

UVICORN_KEEP_ALIVE_S = 5.0


@dataclass(frozen=True)
class Turn:  # what the client reads of a planned turn
    path: str
    body: bytes
    session_id: str | None = "s1"
    turn: int | None = 0
    planned_prompt_tokens: int | None = 100
    max_tokens: int = 5
    think_time_s: float = 0.0  # vLLM's API server runs uvicorn with its default


async def test_a_connection_idle_near_the_servers_keep_alive_is_not_reused() -> None:
    peers: list[tuple] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"delta": {"content": "x"}, "finish_reason": "stop"}]}\n\n')
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    runner = web.AppRunner(app, shutdown_timeout=0.1)  # aiohttp keeps idle connections 75 s: only the client drops
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = StreamingClient(base_url=f"http://127.0.0.1:{port}",
                             timeouts=TimeoutsConfig(connect=2, first_token=5, stall=5, total=10),
                             tracker=ProgressTracker(), max_connections=4, sweep_interval_s=0.05)
    await client.start()
    try:
        turn = Turn(path="/v1/chat/completions", body=b'{"stream": true}')
        assert (await client.send(turn, request_id="r1")).outcome == "ok"
        assert (await client.send(turn, request_id="r2")).outcome == "ok"
        assert peers[0] == peers[1], "a connection used a moment ago is reused"
        await asyncio.sleep((IDLE_CONNECTION_S + UVICORN_KEEP_ALIVE_S) / 2)
        assert (await client.send(turn, request_id="r3")).outcome == "ok"
        assert peers[2] != peers[1], "a connection idle close to the server's keep-alive must not be reused"
    finally:
        await client.aclose()
        await runner.cleanup()
