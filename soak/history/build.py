"""Which server build a run exercised: the vLLM version from ``/version``, a digest
of the launch command's model and flags, and the config's ``build:`` label.

The digest is over what changes the server's behaviour and nothing that changes
per night: a launched target's model and flags (in a canonical order, with the
address flags ``--host``/``--port`` and secrets left out) and its ``VLLM_*``,
``TORCH_*`` and ``NCCL_*`` environment; a simulated target's ``sim:`` section
(its faults are its "bugs"); an attached target's model name. Pure: the run reads
``/version`` once (``soak.run.target_facts``) and records the ``build`` event.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

from soak.records import TargetKind

# Flags whose values differ per run or are secret: not part of the build.
_NOT_BUILD_FLAGS = frozenset({"--host", "--port", "--api-key", "--hf-token", "--token", "--uvicorn-log-level",
                              "--disable-log-requests", "--disable-log-stats"})
_BUILD_ENV_PREFIXES = ("VLLM_", "TORCH_", "NCCL_", "CUDA_")
_NOT_BUILD_ENV = ("TORCH_NCCL_DEBUG_INFO", "TORCH_FR_", "TORCH_NCCL_TRACE", "TORCH_NCCL_DUMP")


def launch_signature(command: list[str]) -> dict[str, Any]:
    """Model and flags of a launch command, canonically ordered."""
    model = None
    flags: list[tuple[str, str | None]] = []
    args = list(command)
    # `vllm serve MODEL ...` / `python -m vllm.entrypoints.openai.api_server --model MODEL`
    if "serve" in args:
        i = args.index("serve")
        if i + 1 < len(args) and not args[i + 1].startswith("-"):
            model = args[i + 1]
        args = args[i + 2 if model else i + 1:]
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-"):
            name, eq, value = arg.partition("=")
            if not eq:
                value = None
                if i + 1 < len(args) and not args[i + 1].startswith("--"):
                    value = args[i + 1]
                    i += 1
            if name == "--model" and model is None:
                model = value
            elif name not in _NOT_BUILD_FLAGS:
                flags.append((name, value))
        i += 1
    return {"model": model, "flags": sorted(flags, key=lambda f: (f[0], f[1] or ""))}


def _digest(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def build_identity(config: Mapping[str, Any], *, vllm_version: str | None, served_model: str | None = None
                   ) -> dict[str, Any]:
    """The ``build`` event's fields from the redacted config and /version."""
    target = config.get("target") or {}
    kind = target.get("kind", TargetKind.SIMULATOR.value)
    if kind == TargetKind.LAUNCHED and isinstance(target.get("command"), list):
        basis: dict[str, Any] = launch_signature(target["command"])
        env = target.get("env") or {}
        basis["env"] = {k: v for k, v in sorted(env.items())
                        if k.startswith(_BUILD_ENV_PREFIXES) and not k.startswith(_NOT_BUILD_ENV)}
        model = basis["model"]
    elif kind == TargetKind.SIMULATOR:
        basis = {"sim": target.get("sim") or {}}
        model = target.get("model") or served_model
    else:
        model = target.get("model") or served_model
        basis = {"model": model}
    label = config.get("build")
    digest = _digest({"kind": kind, **basis})
    return {
        "label": label,
        "vllm_version": vllm_version,
        "launch_digest": digest,
        "model": model,
        # "build", not "key": the redactor reads a value after a word like "key" as a secret
        "build": build_key(label, vllm_version, digest),
    }


def build_key(label: str | None, vllm_version: str | None, digest: str | None) -> str:
    """How nights are grouped: the label when given, else version and digest."""
    if label:
        return str(label)
    return f"vllm {vllm_version or '?'} · {digest or 'unknown'}"


def reported_version(body: Any) -> str | None:
    """``GET /version``'s ``version`` as the build records it (vLLM's own
    endpoint, read once by ``soak.run.target_facts``); None when the answer has none."""
    version = body.get("version") if isinstance(body, dict) else None
    return str(version)[:100] if isinstance(version, (str, int, float)) else None
