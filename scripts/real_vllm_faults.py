"""soak's fault injector for vLLM's own worker path: the real-vLLM tier's tests only.

Installed into the `.real-vllm` venv by `scripts/real-vllm setup` (as
``soak_vllm_faults.py`` beside a ``.pth`` line that imports it), never part of
soak's wheel. It does nothing unless the server's environment names a fault:

    SOAK_VLLM_FAULT=skip_send:rank=0:step=40     (a) pipeline rank 0 skips its sends of
                                                     intermediate tensors from its 40th on: the
                                                     next stage blocks in the receive nobody
                                                     matches (the engine schedules at most one
                                                     more step behind it, so one or two sends
                                                     are skipped; why not one: docs/real-vllm.md)
    SOAK_VLLM_FAULT=lag_send:rank=0:step=40      (b) from its 40th send on, rank 0's payloads go
                                                     out one step late (a one-deep FIFO between the
                                                     stage and the wire): the receiver's step k
                                                     waits for the sender's step k+1, which the
                                                     engine schedules only while another batch is
                                                     in flight; with one batch left it never comes
    SOAK_VLLM_FAULT=extra_send:rank=0:step=40    rank 0 sends its 40th payload twice: a
                                                     misalignment that does NOT hang on vLLM 0.32
                                                     (docs/real-vllm.md), kept as that case; each
                                                     later step pairs with the payload before it,
                                                     and vLLM raises (a crash) at the first step
                                                     whose token count differs from the one before
    SOAK_VLLM_FAULT=extra_send:rank=0:step=40:fit=1
                                                     the same misalignment, shaped to fit: from
                                                     its 40th send on, rank 0 sends the previous
                                                     step's payload cut or padded (its last row
                                                     repeated) to this step's token count; one
                                                     payload a step, so nothing hangs or raises:
                                                     every request answers 200, with wrong text
    SOAK_VLLM_FAULT=spin_last:step=40            (c) the last stage, at its 40th receive, ignores
                                                     SIGTERM and spins on a core, never yielding
    SOAK_VLLM_FAULT=sigstop:step=40              the last stage stops itself (SIGSTOP) at its
                                                     40th receive: the earlier tiers' stopped stage

A PLAN puts one fault on each server launch, so one `soak run` with
``response.on_hang: restart`` meets several hangs without a cold start each:

    SOAK_VLLM_FAULTS=skip_send:rank=0:step=40,lag_send:rank=0:step=40,none
    SOAK_VLLM_FAULT_STATE=/some/dir              the launches seen so far (a file under a lock)

The n-th launch (counted from 0) gets the n-th entry; ``none`` and launches past
the end run healthy. A launch is one engine: its workers' parent (EngineCore)
PID and start time, registered by the first worker that touches the pipeline.
(SOAK_VLLM_FAULT alone applies its fault to every launch.)

A spec the injector cannot read stops every process of the venv that sees it
at start-up with one line on stderr and exit status 2: a server that refuses
to start, never a tier that runs unfaulted and passes.

The mechanism is the seed's: on the CPU build (V1 model runner: the V2 runner
needs Triton) the pipeline's per-step collective is the pipeline group's
``isend_tensor_dict`` (every stage but the last, ``Worker.execute_model``) and
``irecv_tensor_dict`` (every stage but the first). A step is one such call in
that process, counted from 1. The patch is applied when vLLM imports
``vllm.distributed.parallel_state`` (a post-import hook).

When the fault fires the process prints one line to stderr (server.log):

    SOAK_FAULT_INJECTED {"kind", "rank", "step", "pid", "engine_pid", "plan", "ts": <unix s>}

and, in plan mode, each worker says once which entry its launch got:

    SOAK_FAULT_PLAN {"plan": n, "fault": "<entry>", "pid", "engine_pid", "ts"}

``ts`` is the injector's own timestamp of the fault: what detection latency is
measured against (bench/real_vllm_hangs.py), not the harness's onset estimate.
``plan`` is the entry's index (null without a plan).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ENV = "SOAK_VLLM_FAULT"
PLAN_ENV = "SOAK_VLLM_FAULTS"
STATE_ENV = "SOAK_VLLM_FAULT_STATE"
SEND_KINDS = ("skip_send", "lag_send", "extra_send")  # act on a sending rank's sends
LAST_KINDS = ("spin_last", "sigstop")  # act on the last stage's receives
KINDS = SEND_KINDS + LAST_KINDS
HEALTHY = "none"
TARGET_MODULE = "vllm.distributed.parallel_state"
MARK = "SOAK_FAULT_INJECTED"
PLAN_MARK = "SOAK_FAULT_PLAN"
LAUNCHES_FILE = "launches"


class FaultSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int | None  # None: the last stage (spin_last, sigstop)
    fit: bool = False  # extra_send only: the stale payload shaped to this step's tokens

    def spec(self) -> str:
        rank = "" if self.rank is None else f":rank={self.rank}"
        return f"{self.kind}{rank}:step={self.step}" + (":fit=1" if self.fit else "")


def parse(spec: str, *, env: str = ENV) -> Fault:
    """``kind:key=value:...`` -> Fault; a bad spec raises FaultSpecError naming the part."""
    kind, *parts = spec.strip().split(":")
    if kind not in KINDS:
        raise FaultSpecError(f"{env}: unknown kind {kind!r}, known: {', '.join(KINDS)}")
    fields: dict[str, int] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if kind == "extra_send" and key == "fit" and value in ("0", "1"):
            pass
        elif not sep or key not in ("rank", "step") or not value.isdigit():
            raise FaultSpecError(f"{env}: {part!r} is not rank=N or step=N")
        if key in fields:
            raise FaultSpecError(f"{env}: {key} given twice in {spec.strip()!r}")
        fields[key] = int(value)
    step = fields.get("step", 1)
    if step < 1:
        raise FaultSpecError(f"{env}: step counts from 1")
    rank = fields.get("rank")
    if kind in SEND_KINDS and rank is None:
        raise FaultSpecError(f"{env}: {kind} needs rank=N (the sending pipeline rank)")
    if kind in LAST_KINDS and rank is not None:
        raise FaultSpecError(f"{env}: {kind} acts on the last stage; it takes no rank=")
    return Fault(kind=kind, step=step, rank=rank, fit=fields.get("fit") == 1)


def parse_plan(text: str) -> tuple[Fault | None, ...]:
    """``entry,entry,...`` -> one fault per launch (None: ``none``, a healthy launch)."""
    entries = text.split(",")
    plan: list[Fault | None] = []
    for i, entry in enumerate(entries):
        entry = entry.strip()
        if not entry:
            raise FaultSpecError(f"{PLAN_ENV}: entry {i} is empty (entries are comma-separated)")
        if entry == HEALTHY:
            plan.append(None)
            continue
        try:
            plan.append(parse(entry, env=PLAN_ENV))
        except FaultSpecError as exc:
            raise FaultSpecError(f"{exc} (entry {i})") from None
    return tuple(plan)


def launch_index(launches: Sequence[str], key: str) -> tuple[int, tuple[str, ...]]:
    """Where ``key`` stands among the launches seen (first sight order), and the
    registry after this launch has been seen."""
    if key in launches:
        return list(launches).index(key), tuple(launches)
    return len(launches), (*launches, key)


def entry_for(plan: Sequence[Fault | None], index: int) -> Fault | None:
    return plan[index] if index < len(plan) else None  # past the end: healthy


@dataclass(frozen=True)
class Settings:
    """What the environment asked for: one fault for every launch, or a plan."""

    single: Fault | None = None
    plan: tuple[Fault | None, ...] | None = None
    state_dir: str | None = None


def read_settings(environ: Any) -> Settings | None:
    single, plan, state = environ.get(ENV), environ.get(PLAN_ENV), environ.get(STATE_ENV)
    if single and plan:
        raise FaultSpecError(f"{ENV} and {PLAN_ENV} are both set: use one (a single fault, or a plan)")
    if plan:
        if not state:
            raise FaultSpecError(f"{PLAN_ENV} needs {STATE_ENV}=DIR (where the launches are counted)")
        return Settings(plan=parse_plan(plan), state_dir=state)
    if single:
        return Settings(single=parse(single))
    return None


def register(state_dir: str, key: str) -> int:
    """This launch's index, the same for every worker of one engine (a file lock)."""
    import fcntl

    os.makedirs(state_dir, exist_ok=True)
    with open(os.path.join(state_dir, "lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = os.path.join(state_dir, LAUNCHES_FILE)
        try:
            with open(path) as fh:
                seen = tuple(line.strip() for line in fh if line.strip())
        except FileNotFoundError:
            seen = ()
        index, after = launch_index(seen, key)
        if after != seen:
            with open(path, "a") as fh:
                fh.write(key + "\n")
        return index


def engine_key() -> tuple[int, str]:
    """The worker's parent (EngineCore) PID, and a key that a reused PID cannot repeat."""
    ppid = os.getppid()
    try:
        with open(f"/proc/{ppid}/stat") as fh:
            start = fh.read().rsplit(")", 1)[1].split()[19]  # field 22: start time in ticks
    except (OSError, IndexError):
        start = "?"
    return ppid, f"{ppid}:{start}"


def _say(mark: str, line: dict) -> None:
    print(f"{mark} {json.dumps(line)}", file=sys.stderr, flush=True)


class Launch:
    """This process's fault, decided at its first pipeline call (only workers make one)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._decided = False
        self.fault: Fault | None = None
        self.plan_index: int | None = None
        self.engine_pid: int | None = None

    def decide(self, rank: int) -> Fault | None:
        if self._decided:
            return self.fault
        self._decided = True
        self.engine_pid, key = engine_key()
        s = self._settings
        if s.plan is None:
            self.fault = s.single
            return self.fault
        self.plan_index = register(s.state_dir or ".", key)
        self.fault = entry_for(s.plan, self.plan_index)
        _say(PLAN_MARK, {"plan": self.plan_index, "fault": self.fault.spec() if self.fault else HEALTHY,
                         "rank": rank, "pid": os.getpid(), "engine_pid": self.engine_pid, "ts": time.time()})
        return self.fault

    def announce(self, fault: Fault, rank: int) -> None:
        _say(MARK, {"kind": fault.kind, "rank": rank, "step": fault.step, "pid": os.getpid(),
                    "engine_pid": self.engine_pid, "plan": self.plan_index, "ts": time.time()})


def _spin_forever() -> None:
    # The seed's last stage: busy, deaf to SIGTERM, never returning to the engine.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def _stop_self() -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


def _hold(tensor_dict: Any) -> Any:
    # The next forward pass reuses the buffers a payload points into: the held
    # payload is a copy, so the late send carries the step's own values.
    if not isinstance(tensor_dict, dict):
        return tensor_dict
    return {k: v.clone() if hasattr(v, "clone") else v for k, v in tensor_dict.items()}


def _fit(stale: Any, current: Any) -> Any:
    """``stale`` (the previous step's payload) in ``current``'s shape: each tensor cut, or
    padded with its last row, to this step's token count (dimension 0), so the receiver's
    size checks pass and it computes on the wrong step's values."""
    if not isinstance(stale, dict) or not isinstance(current, dict):
        return current
    out = {}
    for key, value in current.items():
        old = stale.get(key)
        shape, old_shape = getattr(value, "shape", None), getattr(old, "shape", None)
        if shape is None or old_shape is None or len(shape) < 1 or len(old_shape) != len(shape) \
                or tuple(old_shape[1:]) != tuple(shape[1:]) or old_shape[0] < 1:
            out[key] = value
            continue
        rows = shape[0]
        if old_shape[0] >= rows:
            out[key] = old[:rows].clone()
        else:
            import torch  # the server's venv has it; the fault runs only there

            out[key] = torch.cat([old, old[-1:].expand(rows - old_shape[0], *old_shape[1:])]).contiguous()
    return out


def patch(module: Any, launch: Launch | Fault) -> None:
    """Wrap the pipeline group's send/receive of intermediate tensors in ``module``
    (vllm.distributed.parallel_state)."""
    if isinstance(launch, Fault):
        launch = Launch(Settings(single=launch))
    coordinator = module.GroupCoordinator
    original_isend = coordinator.isend_tensor_dict
    original_irecv = coordinator.irecv_tensor_dict
    state: dict[str, Any] = {"send": 0, "recv": 0, "held": None}

    def is_pipeline(group: Any) -> bool:
        try:
            return module.get_pp_group() is group
        except Exception:  # the groups are not made yet
            return False

    def isend_tensor_dict(self: Any, tensor_dict: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_pipeline(self):
            return original_isend(self, tensor_dict, *args, **kwargs)
        fault = launch.decide(self.rank_in_group)
        if fault is None or fault.kind not in SEND_KINDS or self.rank_in_group != fault.rank:
            return original_isend(self, tensor_dict, *args, **kwargs)
        state["send"] += 1
        n = state["send"]
        if n < fault.step:
            return original_isend(self, tensor_dict, *args, **kwargs)
        if n > fault.step:
            if fault.kind == "skip_send":
                # A payload sent after the skipped one would be paired with the skipped
                # step (vLLM raises on the size, or computes on the wrong one): the
                # receiver must find nothing on the wire.
                return []
            if fault.kind == "lag_send":
                late, state["held"] = state["held"], _hold(tensor_dict)
                return original_isend(self, late, *args, **kwargs)
            if fault.fit:  # extra_send, shaped: the step before's values in this step's shape
                stale, state["held"] = _fit(state["held"], tensor_dict), _hold(tensor_dict)
                return original_isend(self, stale, *args, **kwargs)
            return original_isend(self, tensor_dict, *args, **kwargs)
        launch.announce(fault, self.rank_in_group)
        if fault.kind == "skip_send":
            return []  # nothing sent; the caller waits on no handle
        if fault.kind == "lag_send":
            state["held"] = _hold(tensor_dict)
            return []  # held: it goes out at this rank's next step
        if fault.fit:  # sent once; the misalignment starts at the next step
            state["held"] = _hold(tensor_dict)
            return original_isend(self, tensor_dict, *args, **kwargs)
        original_isend(self, tensor_dict, *args, **kwargs)
        return original_isend(self, tensor_dict, *args, **kwargs)

    def irecv_tensor_dict(self: Any, *args: Any, **kwargs: Any) -> Any:
        if is_pipeline(self) and self.is_last_rank:
            fault = launch.decide(self.rank_in_group)
            if fault is not None and fault.kind in LAST_KINDS:
                state["recv"] += 1
                if state["recv"] == fault.step:
                    launch.announce(fault, self.rank_in_group)
                    if fault.kind == "spin_last":
                        _spin_forever()
                    else:
                        _stop_self()
        return original_irecv(self, *args, **kwargs)

    coordinator.isend_tensor_dict = isend_tensor_dict
    coordinator.irecv_tensor_dict = irecv_tensor_dict


class _AfterImport(importlib.abc.MetaPathFinder):
    """Patches TARGET_MODULE once it has executed (the rest of sys.meta_path finds it)."""

    def __init__(self, launch: Launch) -> None:
        self._launch = launch

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != TARGET_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader, launch = spec.loader, self._launch
        exec_module = loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            patch(module, launch)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def install(environ: Any = os.environ) -> Settings | None:
    settings = read_settings(environ)
    if settings is None:
        return None
    if settings.state_dir is not None:
        try:
            os.makedirs(settings.state_dir, exist_ok=True)
        except OSError as exc:
            raise FaultSpecError(f"{STATE_ENV}: cannot make {settings.state_dir!r}: {exc.strerror}") from None
    sys.meta_path.insert(0, _AfterImport(Launch(settings)))
    return settings


def _install_or_refuse() -> None:
    try:
        install()
    except FaultSpecError as exc:
        # A typo must not leave a tier that runs unfaulted and passes: every process
        # of the venv that sees it stops here, the API server first, with this line.
        print(f"soak fault injector: {exc}; refusing to start", file=sys.stderr, flush=True)
        os._exit(2)


if __name__ != "__main__":
    _install_or_refuse()
