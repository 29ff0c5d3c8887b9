"""Targets (section ``target:``), tagged by ``kind``:

- ``simulator`` (the default when no target is given): the harness starts
  ``python -m soak sim`` as a subprocess with the ``sim:`` settings.
- ``launched``: the harness starts ``command`` (with ``env`` and ``cwd``),
  captures its output into the run directory's ``server.log``, and waits until
  ``/health`` and ``/v1/models`` answer at ``base_url``.
- ``attached``: a server someone else started, at ``base_url``; give ``pid``
  when the kill path should reach it.

API keys are never in the config: ``api_key_env`` names the environment
variable that holds one.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Discriminator, Field, Tag, field_validator

from soak.configbase import Duration, StrictModel
from soak.records import TargetKind, TargetLayout
from soak.sim.config import SimConfig

PositiveDuration = Annotated[Duration, Field(gt=0)]
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_url(value: str) -> str:
    """A base URL: scheme, host, port, path. Credentials go in a header, never in
    the URL (it is written to events, the live view and the report, and a proxy's
    log): userinfo is refused with one line, as is a query or fragment (the
    harness appends paths to the base, and a ``?token=`` would be lost or leak)."""
    from urllib.parse import urlsplit

    from soak.redact import Redactor

    if not re.match(r"^https?://[^/\s]+", value):
        raise ValueError(f"{Redactor().text(value)!r} is not a base URL such as http://127.0.0.1:8000")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - a bad port raises here, not at the first request
    except ValueError:
        raise ValueError(f"{Redactor().text(value)!r} is not a base URL such as http://127.0.0.1:8000") from None
    if "@" in parts.netloc:
        raise ValueError(
            "credentials in the URL (user:password@) are refused: give the key in an environment variable "
            "named by target.api_key_env (sent as an Authorization header), and the URL without them"
        )
    if parts.query or parts.fragment or value.endswith(("?", "#")):
        raise ValueError("a base URL has no query or fragment (scheme://host:port/path): credentials go in "
                         "target.api_key_env, never in the URL")
    base = value.rstrip("/")
    if base.lower().endswith("/v1"):
        # OpenAI clients want .../v1; the harness adds /v1/... itself and asks /health at
        # the root, which a /v1 base turns into /v1/health: 404, read as "not ready".
        raise ValueError(f"{Redactor().text(value)!r} ends in /v1: drop it and give the server's root "
                         f"({Redactor().text(base[:-3])!r}); the harness adds /v1/... and /health itself")
    return base


def _check_env_name(value: Optional[str]) -> Optional[str]:
    if value is not None and not _ENV_NAME.match(value):
        raise ValueError(f"{value!r} is not an environment variable name")
    return value


class _TargetBase(StrictModel):
    # The environment variable holding the API key (vLLM's --api-key); never the key itself.
    api_key_env: Optional[str] = None
    # The model name to send; None: the first one /v1/models lists.
    model: Optional[str] = None
    # How long /health and /v1/models may take to both answer after a (re)start.
    startup_timeout: PositiveDuration = 120.0
    ready_poll_interval: PositiveDuration = 0.5
    # The server's layout, for the detector's per-stage rules and the plan's block
    # arithmetic. None: read from a launch command's vLLM flags
    # (--pipeline-parallel-size, --tensor-parallel-size, --block-size), else 1, 1, 16.
    pp_size: Optional[int] = Field(default=None, ge=1, le=64)
    tp_size: Optional[int] = Field(default=None, ge=1, le=64)
    block_size: Optional[int] = Field(default=None, ge=1)

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: Optional[str]) -> Optional[str]:
        return _check_env_name(value)


RINGBUFFER_VARIABLE = "VLLM_RINGBUFFER_WARNING_INTERVAL"


def _whole_seconds(value: Optional[float]) -> Optional[float]:
    # vLLM reads the variable with int(): "2.5" would stop the server at start-up.
    if value is not None and value != int(value):
        raise ValueError(f"{value:g}s is not a whole number of seconds (vLLM reads {RINGBUFFER_VARIABLE} as an integer)")
    return value


class _StartedTarget(_TargetBase):
    # VLLM_RINGBUFFER_WARNING_INTERVAL for a server the harness starts: vLLM logs "No
    # available shared memory broadcast block found" this often while a step is stuck
    # (its default, 60 s, is far slower than the harness's rules). None: leave vLLM's own.
    # A value the launch's ``env`` sets (or, for the simulator, ``sim.ringbuffer_warning_interval``) wins.
    ringbuffer_warning_interval: Optional[PositiveDuration] = 5.0

    @field_validator("ringbuffer_warning_interval")
    @classmethod
    def _ringbuffer(cls, value: Optional[float]) -> Optional[float]:
        return _whole_seconds(value)


def server_env(config: "SimulatorTarget | LaunchedTarget") -> dict[str, str]:
    """The environment the harness gives a server it starts, on top of its own:
    the ring-buffer interval, under whatever the launch config sets itself."""
    given = dict(config.env) if isinstance(config, LaunchedTarget) else {}
    out: dict[str, str] = {}
    if config.ringbuffer_warning_interval is not None:
        out[RINGBUFFER_VARIABLE] = str(int(config.ringbuffer_warning_interval))
    return {**out, **given}


class SimulatorTarget(_StartedTarget):
    kind: Literal["simulator"] = "simulator"
    sim: SimConfig = SimConfig()
    startup_timeout: PositiveDuration = 60.0
    # How long the simulator may take to stop after SIGTERM before its tree is SIGKILLed.
    stop_timeout: PositiveDuration = 10.0


class LaunchedTarget(_StartedTarget):
    kind: Literal["launched"] = "launched"
    # A list of arguments, or one string split like a shell would (no shell runs).
    command: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    cwd: Optional[Path] = None
    base_url: str = "http://127.0.0.1:8000"
    # Loading a large model and capturing graphs on 8 GPUs takes a while.
    startup_timeout: PositiveDuration = 1800.0
    stop_timeout: PositiveDuration = 30.0
    # Give the launched server the PyTorch NCCL flight-recorder variables.
    flight_recorder: bool = True

    @field_validator("command", mode="before")
    @classmethod
    def _split(cls, value):
        if isinstance(value, str):
            value = shlex.split(value)
        if isinstance(value, list) and not value:
            raise ValueError("command must not be empty")
        return value

    @field_validator("env")
    @classmethod
    def _names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            _check_env_name(name)
        return value

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _check_url(value)


class AttachedTarget(_TargetBase):
    kind: Literal["attached"] = "attached"
    base_url: str
    # The server's root PID (the API server); None: the kill path cannot reach it.
    pid: Optional[int] = Field(default=None, ge=2)
    # The server's log file, when it writes one the log probe should follow.
    log_path: Optional[Path] = None

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _check_url(value)


def _target_kind(value: Any) -> Any:
    # A target section without ``kind`` is the simulator (the default target).
    if isinstance(value, dict):
        return value.get("kind", TargetKind.SIMULATOR.value)
    if isinstance(value, _TargetBase):  # pydantic's discriminator also sees model instances
        return value.kind
    return None


_FLAGS = {
    "pp_size": ("--pipeline-parallel-size", "-pp"),
    "tp_size": ("--tensor-parallel-size", "-tp"),
    "block_size": ("--block-size",),
}
_VLLM_DEFAULTS = {"pp_size": 1, "tp_size": 1, "block_size": 16}


def command_flag(command: list[str], names: tuple[str, ...]) -> Optional[str]:
    """The value of a ``--flag VALUE`` or ``--flag=VALUE`` argument, the last one given."""
    found = None
    for i, arg in enumerate(command):
        flag, eq, value = arg.partition("=")
        if flag in names:
            if eq:
                found = value
            elif i + 1 < len(command):
                found = command[i + 1]
    return found


def target_layout(config: SimulatorTarget | LaunchedTarget | AttachedTarget) -> TargetLayout:
    """The server's layout as the config gives it: pp_size, tp_size and block_size
    from the simulator's settings, the config's, or a launch command's vLLM flags;
    whether usage objects report cached tokens (--enable-prompt-tokens-details)."""
    kind = TargetKind(config.kind)
    if isinstance(config, SimulatorTarget):
        sim = config.sim
        return TargetLayout(kind=kind, pp_size=config.pp_size or sim.pp_size, tp_size=config.tp_size or 1,
                            block_size=config.block_size or sim.block_size, model=config.model,
                            prompt_tokens_details=sim.enable_prompt_tokens_details)
    sizes: dict[str, int] = {}
    given = {"pp_size": config.pp_size, "tp_size": config.tp_size, "block_size": config.block_size}
    for key, names in _FLAGS.items():
        value = given[key]
        if value is None and isinstance(config, LaunchedTarget):
            text = command_flag(config.command, names)
            value = int(text) if text is not None and text.isdigit() else None
        sizes[key] = value if value is not None else _VLLM_DEFAULTS[key]
    details = None
    if isinstance(config, LaunchedTarget) and "--enable-prompt-tokens-details" in config.command:
        details = True
    return TargetLayout(kind=kind, model=config.model, prompt_tokens_details=details, **sizes)


TargetConfig = Annotated[
    Union[
        Annotated[SimulatorTarget, Tag("simulator")],
        Annotated[LaunchedTarget, Tag("launched")],
        Annotated[AttachedTarget, Tag("attached")],
    ],
    Discriminator(_target_kind),
]


REDACTED = "***"


def redact_target(data: dict) -> dict:
    """The target section with secrets replaced by ``***``, by soak.redact's one
    rule: values of env variables whose names look secret or that hold a URL with
    credentials (``DB_URL``), the values of secret-looking flags and of flags that
    hold such a URL (``--db-url``), URL userinfo and credential query parameters."""
    from soak.redact import Redactor

    env = data.get("env") if isinstance(data.get("env"), dict) else None
    command = data.get("command") if isinstance(data.get("command"), list) else ()
    redactor = Redactor.for_run(environ={}, command=[str(a) for a in command],
                                env={str(k): str(v) for k, v in env.items()} if env else None)
    out = redactor.structure(dict(data))
    if command:
        out["command"] = redactor.argv([str(a) for a in command])  # by position too: ``--api-key k``
    if env:
        # A secret-named variable's value is hidden whatever it is (short, or trivial-looking).
        from soak.redact import holds_credential_url, secret_name

        out["env"] = {redactor.text(str(k)): (REDACTED if secret_name(str(k)) or holds_credential_url(str(v))
                                               else redactor.text(str(v))) for k, v in env.items()}
    return out
