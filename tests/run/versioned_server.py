"""A tiny OpenAI-compatible server whose ``/version`` says whatever it is told:
``python versioned_server.py VERSION PORT_FILE``. It serves /health, /v1/models,
/version, /metrics and a short SSE /v1/chat/completions on 127.0.0.1 port 0 (the
bound port goes to PORT_FILE). For the tests of what a run does with a server's
self-description (a formula in history.csv)."""

from __future__ import annotations

import json
import os
import sys

from aiohttp import web


def main(version: str, port_file: str) -> None:
    tokens = {"n": 0}

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "vs", "object": "model", "max_model_len": 100000}]})

    async def ver(_: web.Request) -> web.Response:
        return web.json_response({"version": version})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="# TYPE vllm:generation_tokens_total counter\n"
                                 f'vllm:generation_tokens_total{{model_name="vs"}} {tokens["n"]}\n')

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in ("a", " b", " c"):
            chunk = {"id": "x", "object": "chat.completion.chunk",
                     "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            tokens["n"] += 1
        done = {"id": "x", "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}}
        await resp.write(f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode())
        return resp

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/version", ver)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/chat/completions", chat)

    async def started(app: web.Application) -> None:
        for site in runner.sites:
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            tmp = port_file + ".tmp"
            with open(tmp, "w") as fh:
                fh.write(str(port))
            os.replace(tmp, port_file)

    runner = web.AppRunner(app)

    async def serve() -> None:
        import asyncio

        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        await started(app)
        await asyncio.Event().wait()

    import asyncio

    asyncio.run(serve())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
