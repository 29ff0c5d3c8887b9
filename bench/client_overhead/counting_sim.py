"""``soak sim`` with a count of the request bytes every client sent it.

Runs the simulator exactly as ``python -m soak sim ARGS`` does, with one aiohttp
middleware added: it adds up the body bytes of each POST to ``/v1/...``
(``Content-Length``, or the body read once when a client sends it chunked) and
``GET /bench/bytes`` answers ``{"requests": n, "body_bytes": b}``. The count is
taken on the server side so every client is measured the same way.

    python bench/client_overhead/counting_sim.py --port 0 --port-file F [soak sim flags]
"""

from __future__ import annotations

import sys


def _install_counter() -> None:
    from aiohttp import web

    import soak.sim.app as sim_app

    original = sim_app.create_app

    def create_app(*args, **kwargs):
        app = original(*args, **kwargs)
        counts = {"requests": 0, "body_bytes": 0}

        @web.middleware
        async def count_bodies(request: web.Request, handler):
            if request.method == "POST" and request.path.startswith("/v1/"):
                size = request.content_length
                if size is None:
                    size = len(await request.read())  # aiohttp keeps it for the handler
                counts["requests"] += 1
                counts["body_bytes"] += size
            return await handler(request)

        async def report(_request: web.Request) -> web.Response:
            return web.json_response(counts)

        app.middlewares.append(count_bodies)
        app.router.add_get("/bench/bytes", report)
        return app

    sim_app.create_app = create_app  # soak.sim.serve looks it up at call time


def main() -> int:
    _install_counter()
    from soak.cli import main as soak_main

    return soak_main(["sim", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
