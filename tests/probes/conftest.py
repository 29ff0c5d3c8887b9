"""Factory fixtures for probe tests: small real HTTP servers on 127.0.0.1, port 0."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"


@pytest.fixture
async def serve():
    """``await serve({"/path": handler_or_text, ...}) -> base_url``; every server is closed at teardown."""
    servers: list[TestServer] = []

    async def start(routes: dict) -> str:
        app = web.Application()
        for path, handler in routes.items():
            if isinstance(handler, str):
                text = handler

                async def handler(request, _text=text):  # noqa: E306
                    return web.Response(text=_text, content_type="text/plain")

            app.router.add_get(path, handler)
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        servers.append(server)
        return str(server.make_url("")).rstrip("/")

    yield start
    for server in servers:
        await server.close()


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as s:
        yield s
