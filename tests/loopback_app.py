"""``runner, url = await serve_any_path(handler)``: an aiohttp app that sends every
method and path to ``handler``, on 127.0.0.1 port 0 (the kernel's choice, so no
race for a port under xdist), in the running loop. ``await runner.cleanup()``
stops it."""

from __future__ import annotations

from aiohttp import web


async def serve_any_path(handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    # A test's server need not wait out its clients' keep-alive connections.
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
