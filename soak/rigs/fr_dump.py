"""Make a real PyTorch flight-recorder dump from a one-rank process group.

    python -m soak.rigs.fr_dump --out DIR --mode pipe|timeout|direct [--backend nccl|gloo]

A process group of one rank (world size 1) with a subgroup named like vLLM's
``pp_broadcast`` posts broadcasts of 6 elements (``NumelIn=6``, as in the bug
report), then one more broadcast queued behind a long kernel, so it is still
pending when the dump is taken. Then:

- ``pipe``: the dump is asked for through the pipe file
  (``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``), as the harness asks a live server;
  it lands in ``DIR/nccl_trace_rank_0``.
- ``timeout``: the pending broadcast has a short timeout, so NCCL's watchdog
  catches it, logs its real lines, and dumps on timeout
  (``TORCH_NCCL_DUMP_ON_TIMEOUT``); the process then tears itself down.
- ``direct``: ``_dump_fr_trace`` in-process, to ``DIR/direct_rank_0`` (gloo too).

The environment is set here, before torch creates any process group, as the
variables must be (FACTS.md). Output: one JSON line saying what was written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path


def recorder_env(dump_dir: Path, *, buffer_size: int = 2000) -> dict[str, str]:
    """Both spellings of the flight-recorder variables (older and newer PyTorch)."""
    temp = str(dump_dir / "nccl_trace_rank_")
    pipe = str(dump_dir / "pipe_rank_")
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": str(buffer_size),
        "TORCH_FR_BUFFER_SIZE": str(buffer_size),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": temp,
        "TORCH_FR_DUMP_TEMP_FILE": temp,
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": pipe,
        "TORCH_NCCL_ENABLE_TIMING": "1",
    }


def _wait_for(path: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > 0:
            time.sleep(0.2)  # let the writer finish
            return True
        time.sleep(0.1)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m soak.rigs.fr_dump", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--mode", choices=("pipe", "timeout", "direct"), default="pipe")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--broadcasts", type=int, default=12)
    parser.add_argument("--pending-s", type=float, default=8.0, help="how long the last broadcast stays queued")
    parser.add_argument("--timeout-s", type=float, default=3.0, help="pp_broadcast timeout in --mode timeout")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.update(recorder_env(args.out.resolve()))

    import torch
    import torch.distributed as dist

    cuda = args.backend == "nccl"
    if cuda:
        torch.cuda.set_device(0)
    store = dist.HashStore()
    dist.init_process_group(args.backend, rank=0, world_size=1, store=store, device_id=torch.device("cuda", 0) if cuda else None)
    timeout = timedelta(seconds=args.timeout_s) if args.mode == "timeout" else timedelta(minutes=10)
    pp = dist.new_group([0], timeout=timeout, group_desc="pp_broadcast")
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    tokens = torch.zeros(6, dtype=torch.int64, device=device)
    hidden = torch.randn(16, 64, device=device)
    for step in range(args.broadcasts):
        tokens.fill_(step)
        dist.broadcast(tokens, src=0, group=pp)
        if step % 4 == 0:
            dist.all_reduce(hidden)  # the default group moves too, as TP/world collectives do
    if cuda:
        torch.cuda.synchronize()
        # A long kernel ahead of the next broadcast on the stream NCCL waits on:
        # the broadcast is enqueued but cannot start, like a rank whose peer
        # never posted its half.
        probe = torch.cuda.Event(enable_timing=True)
        probe_end = torch.cuda.Event(enable_timing=True)
        probe.record()
        torch.cuda._sleep(1_000_000)
        probe_end.record()
        probe_end.synchronize()
        cycles = int(1_000_000 * args.pending_s / max(probe.elapsed_time(probe_end) / 1000.0, 1e-6))
        torch.cuda._sleep(cycles)
    dist.broadcast(tokens, src=0, group=pp, async_op=True)
    written: dict[str, str] = {}
    dump_file = args.out / "nccl_trace_rank_0"
    if args.mode == "direct" or not cuda:
        import torch._C._distributed_c10d as c10d

        dump = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace")
        target = args.out / "direct_rank_0"
        target.write_bytes(dump(True, True, False))
        written["direct"] = str(target)
    elif args.mode == "pipe":
        pipe = args.out / "pipe_rank_0.pipe"
        if _wait_for_fifo(pipe, 10.0):
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"1")
            os.close(fd)
            if _wait_for(dump_file, 20.0):
                written["pipe"] = str(dump_file)
        else:
            written["pipe_missing"] = str(pipe)
    else:  # timeout: the watchdog dumps, then tears the process down
        if _wait_for(dump_file, args.pending_s + 30.0):
            written["timeout"] = str(dump_file)
    print(json.dumps({"event": "dump", "mode": args.mode, "backend": args.backend, "written": written}), flush=True)
    if cuda:
        torch.cuda.synchronize()
    dist.destroy_process_group()
    return 0 if written and not any(k.endswith("missing") for k in written) else 1


def _wait_for_fifo(path: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.1)
    return False


if __name__ == "__main__":
    sys.exit(main())
