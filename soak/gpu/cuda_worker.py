"""A simulator pipeline worker that is a real CUDA process.

``soak sim --worker-backend cuda`` starts one per pipeline stage::

    python -m soak.gpu.cuda_worker --rank R --pp-size N --gpu-index I

and drives it with newline-delimited JSON commands on stdin:

    {"state": "busy", "util": 0.7}   real kernels (bf16 matmuls) for 70% of every period
    {"state": "idle"}                nothing runs, memory kept
    {"state": "spin"}                one spinning kernel after another, no gap
                                     (``torch.cuda._sleep``), the way a rank waiting in
                                     an NCCL broadcast spins: NVML reads 100%
    {"state": "hold"}                memory kept, nothing runs: the last stage that
                                     skipped its broadcast
    {"state": "exit"}                release the GPU and leave, status 0

Any command may carry ``"ignore_sigterm": true|false``; ``--ignore-sigterm``
sets it from the start. Ignoring is done with ``SIG_IGN``, as a process stuck in
the driver behaves: only SIGKILL ends it. End of stdin (the engine core died)
does not end the worker: vLLM's workers outlive a killed parent and keep their
GPU memory (vllm#55510), and the kill path must find them anyway.

Stdout carries one JSON line per event: ``{"event": "ready", ...}`` once the
memory is held and a first kernel ran, then ``{"event": "state", ...}`` for each
command applied. Bad commands get ``{"event": "error", ...}`` and change nothing.

With one GPU every stage shares it (``--gpu-index`` is taken modulo the device
count); the per-stage signature is then read per process, see
``soak.gpu.process_source``. ``--device cpu`` runs the same protocol with CPU
matrix products and a CPU busy loop for "spin", so the protocol is tested where
no GPU exists.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

STATES = ("busy", "idle", "spin", "hold", "exit")
PERIOD_S = 0.1  # duty-cycle period of "busy"; NVML samples every ~167-200 ms
SPIN_CHUNK_S = 0.02  # one spinning kernel's length; two are kept in flight


@dataclass(frozen=True)
class Command:
    state: str | None
    util: float | None
    ignore_sigterm: bool | None


def parse_command(line: str) -> Command:
    """One stdin line to a Command; ValueError with a one-line reason otherwise."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg}") from None
    if not isinstance(obj, dict):
        raise ValueError("a command is a JSON object")
    state = obj.get("state")
    if state is not None and state not in STATES:
        raise ValueError(f"unknown state {state!r}, known: {', '.join(STATES)}")
    util = obj.get("util")
    if util is not None:
        if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0.0 <= util <= 1.0:
            raise ValueError("util must be a number from 0 to 1")
        util = float(util)
    ignore = obj.get("ignore_sigterm")
    if ignore is not None and not isinstance(ignore, bool):
        raise ValueError("ignore_sigterm must be true or false")
    if state is None and util is None and ignore is None:
        raise ValueError("a command needs state, util or ignore_sigterm")
    return Command(state=state, util=util, ignore_sigterm=ignore)


class Engine:
    """The kernels a worker runs: real work, a spin, nothing."""

    def __init__(self, *, device: str, gpu_index: int, mem_mib: int) -> None:
        import torch  # only here: torch is not a dependency of soak

        self._torch = torch
        if device == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("no CUDA device visible (torch.cuda.is_available() is False)")
            count = torch.cuda.device_count()
            self.index = gpu_index % count
            self.device = torch.device("cuda", self.index)
            torch.cuda.set_device(self.device)
            size, dtype = 4096, torch.bfloat16
        else:
            self.index = None
            self.device = torch.device("cpu")
            size, dtype = 128, torch.float32
        # The stage's "weights": held until exit, in every state.
        self._held = torch.empty(max(mem_mib, 1) * 2**20, dtype=torch.uint8, device=self.device)
        self._held.zero_()
        self._a = torch.randn(size, size, device=self.device, dtype=dtype)
        self._b = torch.randn(size, size, device=self.device, dtype=dtype)
        self._spin_cycles = self._calibrate_spin() if device == "cuda" else 0
        self._inflight: list[Any] = []
        self.work_once()
        self.sync()

    @property
    def mem_mib(self) -> int:
        return self._held.numel() // 2**20

    def sync(self) -> None:
        if self.device.type == "cuda":
            self._torch.cuda.synchronize(self.device)

    def work_once(self) -> None:
        for _ in range(8):
            self._a @ self._b

    def busy_period(self, util: float, period_s: float = PERIOD_S) -> None:
        """Real kernels for ``util`` of the period, then nothing for the rest."""
        start = time.monotonic()
        work_until = start + util * period_s
        while util > 0 and time.monotonic() < work_until:
            self.work_once()
            self.sync()
        rest = start + period_s - time.monotonic()
        if rest > 0:
            time.sleep(rest)

    def spin_chunk(self) -> None:
        """Keep a spinning kernel queued behind the running one, so the GPU never idles."""
        if self.device.type != "cuda":
            end = time.monotonic() + SPIN_CHUNK_S
            while time.monotonic() < end:
                pass
            return
        torch = self._torch
        self._torch.cuda._sleep(self._spin_cycles)
        event = torch.cuda.Event()
        event.record()
        self._inflight.append(event)
        if len(self._inflight) >= 2:
            self._inflight.pop(0).synchronize()

    def drain(self) -> None:
        while self._inflight:
            self._inflight.pop(0).synchronize()

    def release(self) -> None:
        self.drain()
        self.sync()
        del self._held, self._a, self._b

    def _calibrate_spin(self) -> int:
        torch = self._torch
        cycles = 1_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        elapsed_s = max(start.elapsed_time(end) / 1000.0, 1e-6)
        return max(int(cycles * SPIN_CHUNK_S / elapsed_s), 1000)


class Worker:
    """Applies commands and runs the engine in the main thread (signals land there)."""

    def __init__(self, engine: Engine, *, emit: Callable[[dict[str, Any]], None], ignore_sigterm: bool) -> None:
        self._engine = engine
        self._emit = emit
        self._commands: queue.Queue[str | None] = queue.Queue(maxsize=1024)
        self.state = "idle"
        self.util = 0.0
        self.ignore_sigterm = False
        self._set_sigterm(ignore_sigterm)

    def feed(self, line: str | None) -> None:
        self._commands.put(line)

    def _set_sigterm(self, ignore: bool) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore else signal.SIG_DFL)
        self.ignore_sigterm = ignore

    def _apply(self, line: str) -> None:
        try:
            cmd = parse_command(line)
        except ValueError as exc:
            self._emit({"event": "error", "error": str(exc), "line": line[:200]})
            return
        if cmd.ignore_sigterm is not None:
            self._set_sigterm(cmd.ignore_sigterm)
        if cmd.util is not None:
            self.util = cmd.util
        if cmd.state is not None:
            if self.state == "spin" and cmd.state != "spin":
                self._engine.drain()
            self.state = cmd.state
        self._emit(
            {"event": "state", "state": self.state, "util": self.util, "ignore_sigterm": self.ignore_sigterm}
        )

    def run(self) -> int:
        while self.state != "exit":
            running = self.state == "spin" or (self.state == "busy" and self.util > 0)
            try:
                line = self._commands.get_nowait() if running else self._commands.get(timeout=0.5)
            except queue.Empty:
                line = None
            else:
                if line is not None:
                    self._apply(line)
                    continue
            if self.state == "spin":
                self._engine.spin_chunk()
            elif self.state == "busy" and self.util > 0:
                self._engine.busy_period(self.util)
        self._engine.release()
        return 0


def _read_stdin(worker: Worker, stream) -> None:
    for line in stream:
        line = line.strip()
        if line:
            worker.feed(line)
    # End of input: keep running in the current state, as an orphaned vLLM worker does.


def _emitter(stream) -> Callable[[dict[str, Any]], None]:
    lock = threading.Lock()

    def emit(obj: dict[str, Any]) -> None:
        with lock:
            stream.write(json.dumps(obj) + "\n")
            stream.flush()

    return emit


def _set_title(rank: int) -> None:
    try:
        from setproctitle import setproctitle
    except ImportError:  # the title is cosmetic; the kill path goes by PID
        return
    from soak.metric_names import worker_title

    setproctitle(worker_title(rank, prefix=os.environ.get("VLLM_PROCESS_NAME_PREFIX", "VLLM")))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m soak.gpu.cuda_worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--pp-size", type=int, required=True)
    parser.add_argument("--gpu-index", type=int, default=None, help="default: the rank; taken modulo the GPU count")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--mem-mib", type=int, default=1024, help="GPU memory the stage holds (its weights)")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--state", choices=("busy", "idle"), default="idle", help="state before the first command")
    parser.add_argument("--util", type=float, default=0.0)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 0 <= args.rank < args.pp_size:
        print(f"cuda_worker: --rank {args.rank} is outside 0..{args.pp_size - 1}", file=sys.stderr)
        return 2
    _set_title(args.rank)
    emit = _emitter(sys.stdout)
    try:
        engine = Engine(
            device=args.device,
            gpu_index=args.rank if args.gpu_index is None else args.gpu_index,
            mem_mib=args.mem_mib,
        )
    except ImportError:
        print("cuda_worker: torch is not installed; the cuda worker backend needs it", file=sys.stderr)
        return 3
    except RuntimeError as exc:
        print(f"cuda_worker: {exc}", file=sys.stderr)
        return 3
    worker = Worker(engine, emit=emit, ignore_sigterm=args.ignore_sigterm)
    worker.state, worker.util = args.state, args.util
    threading.Thread(target=_read_stdin, args=(worker, sys.stdin), daemon=True, name="stdin").start()
    emit(
        {
            "event": "ready",
            "pid": os.getpid(),
            "rank": args.rank,
            "pp_size": args.pp_size,
            "device": str(engine.device),
            "gpu_index": engine.index,
            "mem_mib": engine.mem_mib,
        }
    )
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
