"""Is the target ready? ``wait_ready`` polls ``GET /health`` and ``GET /v1/models``
until both answer 200 (with a model list), saying why not while it waits. Never
ready within the start-up timeout, or the process exits first: ``TargetNotReady``
(exit 3).
"""

from __future__ import annotations

import asyncio
from typing import Callable, Mapping

from soak.bounds import InputRejected, fetch
from soak.clock import Clock
from soak.errors import TargetNotReady

SERVER_LOG = "server.log"


async def wait_ready(
    *,
    url: Callable[[], str | None],
    timeout_s: float,
    interval_s: float,
    headers: Mapping[str, str],
    clock: Clock,
    exited: Callable[[], int | None] = lambda: None,
    what: str = "the target",
    on_waiting: Callable[[str], None] | None = None,
) -> tuple[str, tuple[str, ...]]:
    """Poll until ``/health`` and ``/v1/models`` both answer; returns (base URL, models).

    ``url()`` gives the base URL or None while it is not known yet (a port file
    not written yet); ``exited()`` gives the exit code once the process is gone.
    ``on_waiting(reason)`` hears why the target is not ready, one line, after the
    first failed poll and again whenever the reason changes: a server that never
    comes up says why at once, not at the end of a 30-minute start-up timeout.
    An answer that waiting cannot change (a redirect, 401/403: the credentials)
    ends the wait at once.
    """
    import aiohttp

    from soak import net

    deadline = clock.monotonic() + timeout_s
    last = "no answer yet"
    said = None
    total = max(1.0, min(10.0, interval_s * 4))
    async with net.session(total_s=total, headers=headers) as session:
        while True:
            code = exited()
            if code is not None:
                raise TargetNotReady(f"{what} exited with code {code} before it was ready (see {SERVER_LOG})")
            base = url()
            if base is not None:
                where = what if base in what else f"{what} at {base}"
                try:
                    return base, await _ready_once(session, base, total_s=total)
                except _Refused as exc:
                    raise TargetNotReady(f"{where} {exc}") from None
                except _NotYet as exc:
                    last = str(exc)
                except net.RedirectRefused as exc:
                    raise TargetNotReady(f"{where} answers {exc}") from None
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError) as exc:
                    last = _why(exc)
                if on_waiting is not None and last != said:
                    said = last
                    on_waiting(f"{where} is not ready yet: {last}")
            if clock.monotonic() >= deadline:
                raise TargetNotReady(f"{what} not ready after {timeout_s:g}s at {base or '(no URL yet)'}: {last}")
            await asyncio.sleep(interval_s)


async def _ready_once(session, base: str, *, total_s: float) -> tuple[str, ...]:
    """The model names once /health and /v1/models answer 200; else why not.
    Each call is bounded in total time and bytes: a trickle is one failed probe, not a hang."""
    for path in ("/health", "/v1/models"):
        try:
            response = await fetch(session, base + path, total_s=total_s)
        except InputRejected as exc:  # a bound hit or not JSON: said with the endpoint that answered so
            raise _NotYet(f"{path}: {exc}") from None
        if response.status in (401, 403):
            raise _Refused(f"answers {path} with HTTP {response.status}: the credentials are refused "
                           "(target.api_key_env)")
        if response.status != 200:
            raise _NotYet(f"{path} answered HTTP {response.status}{_path_hint(base, response.status)}")
    try:
        body = response.json()
    except InputRejected as exc:
        raise _NotYet(f"/v1/models: {exc}") from None
    data = body.get("data") if isinstance(body, dict) else None
    names = tuple(m.get("id") for m in (data if isinstance(data, list) else []) if isinstance(m, dict))
    return tuple(n for n in names if isinstance(n, str) and n)


def _path_hint(base: str, status: int) -> str:
    """A 404 under a base URL with a path (a proxy prefix, a /v1 the config let
    through): say the server's root is what the harness wants."""
    from urllib.parse import urlsplit

    prefix = urlsplit(base).path.rstrip("/")
    return f" (target.base_url has the path {prefix}: give the server's root)" if status == 404 and prefix else ""


def _why(exc: BaseException) -> str:
    import aiohttp

    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"connection refused or unreachable ({exc.os_error.strerror or exc.os_error})" \
            if getattr(exc, "os_error", None) is not None else "connection refused or unreachable"
    if isinstance(exc, asyncio.TimeoutError):
        return "no answer within the probe timeout"
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


class _NotYet(Exception):
    pass


class _Refused(Exception):
    """An answer that no amount of waiting changes."""
