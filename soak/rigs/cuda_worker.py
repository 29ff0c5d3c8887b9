"""A simulator pipeline worker that is a real CUDA process.

``soak sim --worker-backend cuda`` has the engine core start one per stage::

    python -m soak.rigs.cuda_worker --rank R --pp-size N --gpu-index I [--ack-fd FD] [--title-prefix VLLM]

with the arguments and protocol of ``soak.sim.worker`` (its docstring is the
reference): newline-delimited JSON commands on stdin,

    {"state": "busy", "util": 0.7}   real kernels (bf16 matmuls) for 70% of every 100 ms
    {"state": "idle"}                nothing runs, memory kept; SIGTERM ends the worker
    {"state": "spin"}                one spinning kernel after another with no gap
                                     (``torch.cuda._sleep``), the way a rank waiting in
                                     an NCCL broadcast spins: NVML reads 100%; SIGTERM ignored
    {"state": "hold"}                memory kept, nothing runs: the last stage that
                                     skipped its broadcast; SIGTERM ignored
    {"state": "exit", "code": 0}     release the GPU and exit with this code

A command may also carry ``"ignore_sigterm": true|false`` to override the
state's default. Ignoring is ``SIG_IGN``, as a process stuck in the driver
behaves: only SIGKILL ends it. After each command the worker writes
``"<rank> <state>\\n"`` to ``--ack-fd`` (first once the GPU memory is held and a
kernel ran: the worker is ready). On stdin EOF a healthy worker exits; a hung
one stays, as vLLM's workers outlive a killed parent and keep their GPU memory
(vllm#55510), for at most ``--orphan-linger`` seconds. Log lines go to stdout
prefixed ``(Worker_PP3 pid=1234)`` as vLLM's do.

With one GPU every stage shares it (``--gpu-index`` is taken modulo the device
count); the per-stage signature is then read per process, see
``soak.probes.process_source``. ``--device cpu`` runs the same protocol with CPU
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
    code: int = 0


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
    code = obj.get("code", 0)
    if isinstance(code, bool) or not isinstance(code, int):
        raise ValueError("code must be an integer")
    if state is None and util is None and ignore is None:
        raise ValueError("a command needs state, util or ignore_sigterm")
    return Command(state=state, util=util, ignore_sigterm=ignore, code=code)


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


HUNG_STATES = ("spin", "hold")


class Worker:
    """Applies commands and runs the engine in the main thread (signals land there)."""

    def __init__(
        self,
        engine: Engine,
        *,
        rank: int,
        log: Callable[[str, str], None],
        ack: Callable[[str], None],
        ignore_sigterm: bool = False,
        orphan_linger_s: float = 600.0,
    ) -> None:
        self._engine = engine
        self._rank = rank
        self._log = log
        self._ack = ack
        self._orphan_linger_s = orphan_linger_s
        self._commands: queue.Queue[str | None] = queue.Queue(maxsize=1024)
        self.state = "idle"
        self.util = 0.0
        self.exit_code = 0
        self.ignore_sigterm = False
        self._orphaned_at: float | None = None
        self._set_sigterm(ignore_sigterm)

    def feed(self, line: str | None) -> None:
        """A command line, or None for end of input."""
        self._commands.put(line)

    def _set_sigterm(self, ignore: bool) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore else signal.SIG_DFL)
        self.ignore_sigterm = ignore

    def _apply(self, line: str) -> None:
        try:
            cmd = parse_command(line)
        except ValueError as exc:
            self._log(f"ignoring command {line[:80]!r}: {exc}", "WARNING")
            return
        if cmd.state == "exit":
            self.exit_code = cmd.code
        if cmd.util is not None:
            self.util = cmd.util
        if cmd.state is not None:
            if self.state == "spin" and cmd.state != "spin":
                self._engine.drain()
            self.state = cmd.state
            if cmd.ignore_sigterm is None and cmd.state != "exit":
                self._set_sigterm(cmd.state in HUNG_STATES)
        if cmd.ignore_sigterm is not None:
            self._set_sigterm(cmd.ignore_sigterm)
        if self.state != "exit":
            self._ack(self.state)

    def _end_of_input(self) -> None:
        if self.state in HUNG_STATES:  # orphaned while hung: stay, like the real thing
            self._orphaned_at = time.monotonic()
            self._log(f"engine core gone; staying {self.state} for at most {self._orphan_linger_s:g}s")
        else:
            self.state, self.exit_code = "exit", 0

    def run(self) -> int:
        while self.state != "exit":
            if self._orphaned_at is not None and time.monotonic() - self._orphaned_at > self._orphan_linger_s:
                break
            running = self.state == "spin" or (self.state == "busy" and self.util > 0)
            try:
                line = self._commands.get_nowait() if running else self._commands.get(timeout=0.5)
            except queue.Empty:
                pass
            else:
                if line is None:
                    self._end_of_input()
                else:
                    self._apply(line)
                continue
            if self.state == "spin":
                self._engine.spin_chunk()
            elif self.state == "busy" and self.util > 0:
                self._engine.busy_period(self.util)
        self._engine.release()
        return self.exit_code


def _read_stdin(worker: Worker, stream) -> None:
    for line in stream:
        line = line.strip()
        if line:
            worker.feed(line)
    worker.feed(None)


def _logger(name: str, stream) -> Callable[[str, str], None]:
    lock = threading.Lock()
    pid = os.getpid()

    def log(message: str, level: str = "INFO") -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        with lock:
            stream.write(f"({name} pid={pid}) {level} {stamp} [cuda_worker.py:1] {message}\n")
            stream.flush()

    return log


def _acker(rank: int, ack_fd: int | None) -> Callable[[str], None]:
    stream = os.fdopen(ack_fd, "w", buffering=1) if ack_fd is not None else None

    def ack(state: str) -> None:
        if stream is not None:
            try:
                stream.write(f"{rank} {state}\n")
                stream.flush()
            except OSError:  # the engine core is gone; the state still applies
                pass

    return ack


def _set_title(title: str) -> None:
    try:
        from setproctitle import setproctitle
    except ImportError:  # the title is cosmetic; the kill path goes by PID
        return
    setproctitle(title)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m soak.rigs.cuda_worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--pp-size", type=int, required=True)
    parser.add_argument("--gpu-index", type=int, default=None, help="default: the rank; taken modulo the GPU count")
    parser.add_argument("--ack-fd", type=int)
    parser.add_argument("--title-prefix", default="VLLM")
    parser.add_argument("--orphan-linger", type=float, default=600.0)
    parser.add_argument("--own-session", action="store_true", help="setsid: its own process group (kill-path tests)")
    # The environment variable lets a whole `soak sim --worker-backend cuda` tree run on CPU (dry runs).
    parser.add_argument("--device", choices=("cuda", "cpu"), default=os.environ.get("SOAK_CUDA_WORKER_DEVICE", "cuda"))
    parser.add_argument("--mem-mib", type=int, default=1024, help="GPU memory the stage holds (its weights)")
    parser.add_argument("--ignore-sigterm", action="store_true", help="from the start, whatever the state")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 0 <= args.rank < args.pp_size:
        print(f"cuda_worker: --rank {args.rank} is outside 0..{args.pp_size - 1}", file=sys.stderr)
        return 2
    if args.own_session:
        os.setsid()
    name = f"Worker_PP{args.rank}"
    _set_title(f"{args.title_prefix}::{name}")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the API server, which shuts us down
    log = _logger(name, sys.stdout)
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
    worker = Worker(
        engine,
        rank=args.rank,
        log=log,
        ack=_acker(args.rank, args.ack_fd),
        ignore_sigterm=args.ignore_sigterm,
        orphan_linger_s=args.orphan_linger,
    )
    threading.Thread(target=_read_stdin, args=(worker, sys.stdin), daemon=True, name="stdin").start()
    log(f"CUDA worker rank {args.rank}/{args.pp_size} on {engine.device}, holding {engine.mem_mib} MiB")
    worker._ack(worker.state)  # ready: memory held, a first kernel ran
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
