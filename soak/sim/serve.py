"""Running the simulator in the foreground: bind, write the port file, handle signals."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from soak.fsio import write_atomic
from soak.sim.config import SimConfig


def _write_port_file(path: Path, port: int) -> None:
    write_atomic(path, f"{port}\n")  # readers never see a half-written file


async def _serve(config: SimConfig, *, host: str, port: int, port_file: Path | None, spawn_processes: bool, argv) -> int:
    from aiohttp import web

    from soak.errors import PortInUse
    from soak.sim.app import create_app
    from soak.sim.server import SIM_KEY
    from soak.sim.logs import SimLog

    log = SimLog(pid=os.getpid(), ansi=config.profile.ansi_log_prefix)
    log.info("api_server.py:1839", f"vLLM API server version {config.vllm_version} (soak simulator)")
    log.info("utils.py:233", f"non-default args: {config.model_dump(exclude_defaults=True, mode='json')}")
    app = create_app(config, spawn_processes=spawn_processes, log=log)
    server = app[SIM_KEY]
    server.api_server_pid = os.getpid()
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        if config.startup_delay > 0:  # loading: vLLM binds its port only once the engine is up
            log.info("core.py:1", f"simulator: loading for {config.startup_delay:g} simulated seconds")
            await asyncio.sleep(config.startup_delay / config.time_scale)
        site = web.TCPSite(runner, host, port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            raise PortInUse(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        log.info("api_server.py:1912", f"Starting vLLM API server 0 on http://{host}:{bound}")
        log.info("launcher.py:37", "Available routes are: /health, /v1/models, /version, /metrics, /tokenize, "
                 "/detokenize, /v1/completions, /v1/chat/completions, /sim/state, /sim/dcgm, /sim/fault")
        log.info("server.py:1", "Application startup complete.")
        if port_file is not None:
            _write_port_file(port_file, bound)

        loop = asyncio.get_running_loop()

        def on_signal(signame: str) -> None:
            if server.faults.ignore_sigterm:
                return  # hung: SIGTERM does nothing, as on the real server
            log.info("launcher.py:110", "Shutting down FastAPI HTTP server.")
            server.request_exit(0)

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig.name)
        await server.stop_event.wait()
        return server.exit_code or 0
    finally:
        await runner.cleanup()


def serve(config: SimConfig, *, host: str, port: int, port_file: Path | None, spawn_processes: bool, argv=()) -> int:
    # One API server: vLLM leaves its title alone (only with --api-server-count > 1
    # is each titled VLLM::APIServer_<i>), so the process reads as its command line.
    code = asyncio.run(_serve(config, host=host, port=port, port_file=port_file, spawn_processes=spawn_processes, argv=argv))
    sys.stdout.flush()
    return code
