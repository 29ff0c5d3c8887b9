"""The target's facts, read once when it answers: ``GET /version`` (one read, with
the API key, feeding both the version profile and the build identity),
``GET /v1/models`` (``max_model_len``), and whether the workload's largest
request fits (decided on the typed ``Plan``).

The reads go through the run's ``OutboundSession`` (a 3xx is never followed) and
are bounded (``soak.bounds.fetch``); the decisions on what came back are pure.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from enum import Enum
from typing import Any

import aiohttp

from soak.bounds import fetch
from soak.errors import WorkloadDoesNotFit
from soak.events import Emit, EventType
from soak.history.build import reported_version
from soak.net import OutboundSession, RedirectRefused
from soak.records import TargetFacts, TargetLayout
from soak.versions import profile_for, version_from_body
from soak.workload import Plan

# /version is small and answered at once; the build identity always waited this long for it.
VERSION_TIMEOUT_S = 5.0
MODELS_TIMEOUT_S = 10.0



@dataclass(frozen=True)
class VersionAnswer:
    """What ``GET /version`` gave: its JSON (None: no usable answer), and the one
    line of a redirect that was refused (said as a warning)."""

    body: Any = None
    refused: str | None = None


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def read_version(session: OutboundSession, base_url: str, *, api_key: str | None,
                       timeout_s: float = VERSION_TIMEOUT_S) -> VersionAnswer:
    """``GET /version`` once, bounded; never raises for the server's sake."""
    try:
        resp = await fetch(session, base_url.rstrip("/") + "/version", headers=_auth(api_key), total_s=timeout_s)
        return VersionAnswer(body=resp.json() if resp.status == 200 else None)
    except RedirectRefused as exc:  # not followed (soak.net): said, with where it pointed
        return VersionAnswer(refused=str(exc))
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):  # a bound hit is a ValueError too
        return VersionAnswer()


def max_model_len_of(body: Any, model: str | None) -> int | None:
    """``max_model_len`` of ``model`` (else the first model) in a /v1/models answer.
    The server's JSON, read defensively: any shape may come back."""
    models = body.get("data") if isinstance(body, dict) else None
    if not isinstance(models, list):
        return None
    entries = [m for m in models if isinstance(m, dict)]
    chosen = next((m for m in entries if m.get("id") == model), entries[0] if entries else None)
    limit = chosen.get("max_model_len") if chosen is not None else None
    return limit if type(limit) is int and limit > 0 else None


async def read_max_model_len(session: OutboundSession, base_url: str, model: str | None, *,
                             api_key: str | None) -> int | None:
    try:
        resp = await fetch(session, base_url.rstrip("/") + "/v1/models", headers=_auth(api_key),
                           total_s=MODELS_TIMEOUT_S)
        if resp.status != 200:
            return None
        body = resp.json()
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError):  # bounds too (ValueError)
        return None
    return max_model_len_of(body, model)


async def read_target_facts(layout: TargetLayout, *, base_url: str, models: tuple[str, ...],
                            session: OutboundSession, api_key: str | None, emit: Emit,
                            version_timeout_s: float = VERSION_TIMEOUT_S) -> TargetFacts:
    """The facts of a target that answered, each read once; says the version
    (``server_version``, and a warning where soak has no facts for it)."""
    answer = await read_version(session, base_url, api_key=api_key, timeout_s=version_timeout_s)
    if answer.refused is not None:
        emit(EventType.WARNING, message=f"GET /version: {answer.refused}")
    profile = profile_for(version_from_body(answer.body))
    emit(EventType.SERVER_VERSION, **profile.to_json())
    if profile.warning:
        emit(EventType.WARNING, message=profile.warning)
    # The model the requests name: the config's, else the first the server lists.
    model = layout.model or (models[0] if models else None)
    return TargetFacts(
        layout=layout,
        base_url=base_url,
        model=model,
        models=tuple(models),
        max_model_len=await read_max_model_len(session, base_url, model, api_key=api_key),
        version_profile=profile,
        reported_version=reported_version(answer.body),
    )


# -- does the workload fit? ---------------------------------------------------------------


class Fit(str, Enum):
    NOT_CHECKED = "not_checked"  # the plan has no prompt to measure
    UNKNOWN = "unknown"  # /v1/models lists no max_model_len
    FITS = "fits"
    MAY_NOT_FIT = "may_not_fit"  # over the limit by estimated token counts: the error rate judges
    DOES_NOT_FIT = "does_not_fit"  # over the limit by exact counts: every such request is an HTTP 400


@dataclass(frozen=True)
class FitCheck:
    fit: Fit
    max_model_len: int | None = None
    prompt: int = 0
    max_tokens: int = 0
    counter: str = ""
    message: str = ""


def check_fit(plan: Plan, max_model_len: int | None) -> FitCheck:
    """Whether the plan's largest request (prompt + max_tokens: vLLM refuses a
    request whose sum passes max_model_len) fits the target."""
    prompt, max_tokens = plan.largest_request
    prompt, max_tokens = prompt or 0, max_tokens or 0
    if not prompt:
        return FitCheck(Fit.NOT_CHECKED)
    if max_model_len is None:
        return FitCheck(Fit.UNKNOWN, prompt=prompt, max_tokens=max_tokens)
    counter = str(plan.counter or "")
    said = dict(max_model_len=max_model_len, prompt=prompt, max_tokens=max_tokens, counter=counter)
    if prompt + max_tokens <= max_model_len:
        return FitCheck(Fit.FITS, **said)
    if prompt > max_model_len:
        message = (f"the workload's largest prompt is {prompt:,} tokens, above the target's max_model_len "
                   f"{max_model_len:,} (from /v1/models)")
    else:
        message = (f"the workload's largest request needs {prompt + max_tokens:,} tokens ({prompt:,} prompt + "
                   f"{max_tokens:,} max_tokens), above the target's max_model_len {max_model_len:,} "
                   "(from /v1/models)")
    # Token counts that are an estimate only warn: the error-rate criterion judges.
    fit = Fit.DOES_NOT_FIT if counter.startswith("exact") else Fit.MAY_NOT_FIT
    return FitCheck(fit, message=message, **said)


def say_fit(check: FitCheck, emit: Emit) -> None:
    """The fit's event; a workload that cannot fit raises ``WorkloadDoesNotFit`` (exit 2)."""
    if check.fit is Fit.UNKNOWN:
        emit(EventType.MAX_MODEL_LEN_UNKNOWN, note="/v1/models lists no max_model_len: the fit is not checked")
    elif check.fit is Fit.FITS:
        emit(EventType.WORKLOAD_FITS, max_model_len=check.max_model_len, largest_prompt=check.prompt,
             max_tokens=check.max_tokens)
    elif check.fit is Fit.MAY_NOT_FIT:
        emit(EventType.WORKLOAD_MAY_NOT_FIT, max_model_len=check.max_model_len, largest_prompt=check.prompt,
             max_tokens=check.max_tokens, counter=check.counter, message=check.message)
    elif check.fit is Fit.DOES_NOT_FIT:
        raise WorkloadDoesNotFit(check.message + ": the server would refuse those requests (HTTP 400)")
