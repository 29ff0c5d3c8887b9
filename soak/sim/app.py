"""The simulator's HTTP server: vLLM 0.11's OpenAI endpoints over the pure engine.

``create_app(config)`` builds an aiohttp application for in-process tests;
``soak sim`` runs the same app in the foreground with the process tree
(``spawn_processes=True``). The app owns one ``SimServer`` (``app[SIM_KEY]``):
the engine, its async driver, the metrics registry, the GPUs and the faults.

Times: the engine runs on simulated seconds, ``time_scale`` times faster than
the wall clock; histograms are in simulated seconds, while everything stamped
with a date (logs, ``onset_at``, ``created``) is unix wall time.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from soak.clock import Clock
from soak.sim.config import SimConfig
from soak.sim.gpus import dcgm_text
from soak.sim.logs import SimLog
from soak.sim.openai_api import (
    handle_chat,
    handle_completions,
    handle_detokenize,
    handle_models,
    handle_tokenize,
    json_body,
)
from soak.sim.server import SIM_KEY, ApiError, SimServer, bad_request, server_of


async def handle_health(request: web.Request) -> web.Response:
    server = server_of(request)
    return web.Response(status=200 if server.ready else 503)


async def handle_version(request: web.Request) -> web.Response:
    return web.json_response({"version": server_of(request).config.vllm_version})


async def handle_metrics(request: web.Request) -> web.Response:
    server = server_of(request)
    while server.metrics_stalled:  # the endpoint stops answering; the client's timeout ends this
        await asyncio.sleep(0.05)
    return web.Response(body=server.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def handle_sim_state(request: web.Request) -> web.Response:
    return web.json_response(server_of(request).state())


async def handle_sim_dcgm(request: web.Request) -> web.Response:
    server = server_of(request)
    gpus = server.gpus()
    return web.Response(text=dcgm_text(gpus, hostname=server.config.hostname, energy_mj=server.energy_mj(gpus)),
                        content_type="text/plain")


async def handle_sim_fault(request: web.Request) -> web.Response:
    server = server_of(request)
    try:
        body = await json_body(request)
    except ApiError as exc:
        return exc.response()
    try:
        described = server.faults.inject(body)
    except ValueError as exc:
        return bad_request(str(exc), "kind").response()
    return web.json_response(described)


@web.middleware
async def _errors_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response()


def create_app(config: SimConfig, *, clock: Clock | None = None, spawn_processes: bool = False, log: SimLog | None = None) -> web.Application:
    """The simulator as an aiohttp app; ``spawn_processes`` starts the engine-core/worker tree."""
    app = web.Application(middlewares=[_errors_middleware], client_max_size=64 * 1024 * 1024)
    holder: dict[str, Any] = {}

    tree = None
    if spawn_processes:
        from soak.sim.proctree import ProcessTree

        tree = ProcessTree(config, log=log)
    server = SimServer(config, clock=clock, log=log, tree=tree)
    app[SIM_KEY] = server
    holder["server"] = server

    async def on_startup(app: web.Application) -> None:
        if tree is not None:
            await tree.start()
        await server.start()

    async def on_cleanup(app: web.Application) -> None:
        await server.close()
        if tree is not None:
            await tree.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    r = app.router
    r.add_get("/health", handle_health)
    r.add_get("/version", handle_version)
    r.add_get("/v1/models", handle_models)
    r.add_get("/metrics", handle_metrics)
    r.add_post("/tokenize", handle_tokenize)
    r.add_post("/detokenize", handle_detokenize)
    r.add_post("/v1/completions", handle_completions)
    r.add_post("/v1/chat/completions", handle_chat)
    r.add_get("/sim/state", handle_sim_state)
    r.add_get("/sim/dcgm", handle_sim_dcgm)
    r.add_post("/sim/fault", handle_sim_fault)
    return app
