"""soak's fault injector for vLLM's own worker path: the real-vLLM tier's tests only.

Installed into the `.real-vllm` venv by `scripts/real-vllm setup` (as
``soak_vllm_faults.py`` beside a ``.pth`` line that imports it), never part of
soak's wheel. It does nothing unless the server's environment names a fault:

    SOAK_VLLM_FAULT=skip_send:rank=0:step=40     (a) pipeline rank 0 skips its 40th send of
                                                     intermediate tensors: the next stage blocks
                                                     in the receive nobody matches, and every
                                                     later payload pairs with the wrong step
    SOAK_VLLM_FAULT=extra_send:rank=0:step=40    (b) rank 0 sends its 40th payload twice: the
                                                     FIFO pairs each later step with the one before
    SOAK_VLLM_FAULT=spin_last:step=40            (c) the last stage, at its 40th receive, ignores
                                                     SIGTERM and spins on a core, never yielding

The mechanism is the seed's: on the CPU build (V1 model runner: the V2 runner
needs Triton) the pipeline's per-step collective is the pipeline group's
``isend_tensor_dict`` (every stage but the last, ``Worker.execute_model``) and
``irecv_tensor_dict`` (every stage but the first). A step is one such call in
that process, counted from 1. The patch is applied when vLLM imports
``vllm.distributed.parallel_state`` (a post-import hook), so a process that
never imports it (the API server) is untouched.

When the fault fires the process prints one line to stderr (vLLM's workers
write there, so it lands in server.log):

    SOAK_FAULT_INJECTED {"kind": ..., "rank": ..., "step": ..., "pid": ..., "ts": <unix s>}

``ts`` is the injector's own timestamp of the fault: what detection latency is
measured against (bench/real_vllm_hangs.py), not the harness's onset estimate.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any

ENV = "SOAK_VLLM_FAULT"
KINDS = ("skip_send", "extra_send", "spin_last")
TARGET_MODULE = "vllm.distributed.parallel_state"
MARK = "SOAK_FAULT_INJECTED"


class FaultSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int | None  # None: the last stage (spin_last)


def parse(spec: str) -> Fault:
    """``kind:key=value:...`` -> Fault; a bad spec raises FaultSpecError naming the part."""
    kind, *parts = spec.strip().split(":")
    if kind not in KINDS:
        raise FaultSpecError(f"{ENV}: unknown kind {kind!r}, known: {', '.join(KINDS)}")
    fields: dict[str, int] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or key not in ("rank", "step") or not value.isdigit():
            raise FaultSpecError(f"{ENV}: {part!r} is not rank=N or step=N")
        fields[key] = int(value)
    step = fields.get("step", 1)
    if step < 1:
        raise FaultSpecError(f"{ENV}: step counts from 1")
    rank = fields.get("rank")
    if kind in ("skip_send", "extra_send") and rank is None:
        raise FaultSpecError(f"{ENV}: {kind} needs rank=N (the sending pipeline rank)")
    return Fault(kind=kind, step=step, rank=rank)


def _announce(fault: Fault, rank: int) -> None:
    line = {"kind": fault.kind, "rank": rank, "step": fault.step, "pid": os.getpid(), "ts": time.time()}
    print(f"{MARK} {json.dumps(line)}", file=sys.stderr, flush=True)


def _spin_forever() -> None:
    # The seed's last stage: busy, deaf to SIGTERM, never returning to the engine.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def patch(module: Any, fault: Fault) -> None:
    """Wrap the pipeline group's send/receive of intermediate tensors in ``module``
    (vllm.distributed.parallel_state)."""
    coordinator = module.GroupCoordinator
    original_isend = coordinator.isend_tensor_dict
    original_irecv = coordinator.irecv_tensor_dict
    calls = {"send": 0, "recv": 0}

    def is_pipeline(group: Any) -> bool:
        try:
            return module.get_pp_group() is group
        except Exception:  # the groups are not made yet
            return False

    def isend_tensor_dict(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_pipeline(self) or fault.kind not in ("skip_send", "extra_send") \
                or self.rank_in_group != fault.rank:
            return original_isend(self, *args, **kwargs)
        calls["send"] += 1
        if calls["send"] != fault.step:
            return original_isend(self, *args, **kwargs)
        _announce(fault, self.rank_in_group)
        if fault.kind == "skip_send":
            return []  # nothing sent; the caller waits on no handle
        original_isend(self, *args, **kwargs)
        return original_isend(self, *args, **kwargs)

    def irecv_tensor_dict(self: Any, *args: Any, **kwargs: Any) -> Any:
        if fault.kind == "spin_last" and is_pipeline(self) and self.is_last_rank:
            calls["recv"] += 1
            if calls["recv"] == fault.step:
                _announce(fault, self.rank_in_group)
                _spin_forever()
        return original_irecv(self, *args, **kwargs)

    coordinator.isend_tensor_dict = isend_tensor_dict
    coordinator.irecv_tensor_dict = irecv_tensor_dict


class _AfterImport(importlib.abc.MetaPathFinder):
    """Patches TARGET_MODULE once it has executed (the rest of sys.meta_path finds it)."""

    def __init__(self, fault: Fault) -> None:
        self._fault = fault

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != TARGET_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader, fault = spec.loader, self._fault
        exec_module = loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            patch(module, fault)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def install(environ: Any = os.environ) -> Fault | None:
    spec = environ.get(ENV)
    if not spec:
        return None
    fault = parse(spec)
    sys.meta_path.insert(0, _AfterImport(fault))
    return fault


try:
    install()
except FaultSpecError as exc:  # a wrong spec is said once, at start-up, and the server runs unfaulted
    print(f"soak fault injector: {exc}", file=sys.stderr)
