"""A ``base_url`` ending in /v1 (what an OpenAI client wants) is refused when the
config is read, with a line that says to drop it; a base with some other path
whose /health is a 404 says the server's root is wanted, not just "404"."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from loopback_app import serve_any_path
from soak.clock import SystemClock
from soak.errors import TargetNotReady
from soak.run.readiness import wait_ready
from soak.target.config import AttachedTarget


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/", "https://h/V1"])
def test_a_v1_base_is_refused_with_the_root_to_give(url):
    with pytest.raises(ValueError, match=r"ends in /v1: drop it and give the server's root \('(http|https)://[^/']+'\)"):
        AttachedTarget(base_url=url)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://127.0.0.1:8000/", "http://h/proxy/vllm",
                                 "http://h:8000/v10"])
def test_other_bases_still_validate(url):
    assert AttachedTarget(base_url=url).base_url == url.rstrip("/")


def test_a_404_health_under_a_path_says_to_give_the_root():
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=404 if request.path.startswith("/openai/") else 200, text="{}")

    async def scenario() -> list[str]:
        runner, base = await serve_any_path(handler)
        heard: list[str] = []
        try:
            with pytest.raises(TargetNotReady) as info:
                await wait_ready(url=lambda: base + "/openai", timeout_s=0.5, interval_s=0.05, headers={},
                                 clock=SystemClock(), on_waiting=heard.append)
        finally:
            await runner.cleanup()
        return [*heard, str(info.value)]

    said = asyncio.run(scenario())
    assert "/health answered HTTP 404 (target.base_url has the path /openai: give the server's root)" in said[-1]
    assert said[0].endswith("give the server's root)")
