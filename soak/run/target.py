"""Targets: the server a run drives. ``build_target`` makes one from the config.

- ``ProcessTarget`` (``soak.run.process_target``) runs a server as the harness's
  child, in its own session (so a Ctrl-C at the terminal reaches the harness,
  which then stops the server in order), output appended to ``server.log``. The
  simulator is one (``python -m soak sim --port 0 --port-file ...``), and so is
  a launched vLLM.
- ``AttachedTarget`` (``soak.run.attached_target``) is a server someone else
  runs; the harness only waits for it to answer, and knows its PID when the
  config gives one.

Ready means ``GET /health`` answers 200 and ``GET /v1/models`` answers 200 with
a model list (``soak.run.readiness``). Never ready within ``startup_timeout``,
or the process exits first: ``TargetNotReady`` (exit 3).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Protocol

import yaml

from soak.clock import Clock
from soak.redact import Redactor
from soak.proc.facts import Pin
from soak.run.attached_target import AttachedTarget
from soak.run.process_target import ProcessTarget
from soak.target.config import AttachedTarget as AttachedTargetConfig
from soak.target.config import LaunchedTarget, SimulatorTarget, server_env

if TYPE_CHECKING:
    from soak.run.guardian import Guardian


class Target(Protocol):
    base_url: str
    root_pid: int | None
    # The root process as checked when it started (None: not known, e.g. attached without a PID).
    identity: Pin | None
    log_path: Path | None
    flight_recorder_pipe_stem: str | None
    models: tuple[str, ...]

    async def start(self) -> None: ...

    async def restart(self) -> None: ...

    def returncode(self) -> int | None: ...

    async def aclose(self) -> None: ...


def api_key_from_env(name: str | None, environ: Mapping[str, str]) -> str | None:
    if name is None:
        return None
    value = environ.get(name)
    if not value:
        from soak.errors import EnvironmentProblem

        raise EnvironmentProblem(f"target.api_key_env: environment variable {name} is not set")
    return value


def sim_command(config: SimulatorTarget, run_dir: Path, *, port: int = 0) -> list[str]:
    """``python -m soak sim`` with the run's simulator settings in a file beside the run."""
    sim_file = Path(run_dir) / "sim_config.yaml"
    sim_file.write_text(yaml.safe_dump(config.sim.model_dump(mode="json"), sort_keys=False), encoding="utf-8")
    return [
        sys.executable,
        "-m",
        "soak",
        "sim",
        "--config",
        str(sim_file),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--port-file",
        str(Path(run_dir) / "sim.port"),
    ]


def build_target(
    config: SimulatorTarget | LaunchedTarget | AttachedTargetConfig,
    *,
    run_dir: Path,
    environ: Mapping[str, str],
    extra_env: Mapping[str, str] | None = None,
    flight_recorder_pipe_stem: str | None = None,
    clock: Clock | None = None,
    redactor: Redactor | None = None,
    guardian: Guardian | None = None,
    on_log_error: Callable[[BaseException], None] | None = None,
    on_waiting: Callable[[str], None] | None = None,
) -> Target:
    """The target the config names. A server the harness starts gets
    ``server_env(config)`` (the launch's ``env`` over the ring-buffer interval) and
    ``extra_env`` (flight recorder, ownership marker) on top; its output is redacted by
    ``redactor`` on its way to server.log, and ``guardian`` is told its PID."""
    api_key = api_key_from_env(config.api_key_env, environ)
    owned = {"redactor": redactor, "guardian": guardian, "on_log_error": on_log_error, "on_waiting": on_waiting}
    if isinstance(config, SimulatorTarget):
        return ProcessTarget(
            command=sim_command(config, run_dir),
            restart_command=lambda t: sim_command(config, run_dir, port=int(t.base_url.rsplit(":", 1)[1])),
            what="the simulator",
            run_dir=run_dir,
            env={**server_env(config), **(extra_env or {})},
            port_file=Path(run_dir) / "sim.port",
            startup_timeout_s=config.startup_timeout,
            poll_interval_s=min(config.ready_poll_interval, 0.1),
            stop_timeout_s=config.stop_timeout,
            api_key=api_key,
            flight_recorder_pipe_stem=flight_recorder_pipe_stem,
            clock=clock,
            **owned,
        )
    if isinstance(config, LaunchedTarget):
        return ProcessTarget(
            command=config.command,
            what=f"the launched server ({config.command[0]})",
            run_dir=run_dir,
            env={**server_env(config), **(extra_env or {})},
            cwd=config.cwd,
            base_url=config.base_url,
            startup_timeout_s=config.startup_timeout,
            poll_interval_s=config.ready_poll_interval,
            stop_timeout_s=config.stop_timeout,
            api_key=api_key,
            flight_recorder_pipe_stem=flight_recorder_pipe_stem,
            clock=clock,
            **owned,
        )
    return AttachedTarget(
        base_url=config.base_url,
        pid=config.pid,
        log_path=config.log_path,
        startup_timeout_s=config.startup_timeout,
        poll_interval_s=config.ready_poll_interval,
        api_key=api_key,
        flight_recorder_pipe_stem=flight_recorder_pipe_stem,
        clock=clock,
        on_waiting=on_waiting,
    )
