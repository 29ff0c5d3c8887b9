"""One rank of ``soak.rigs.pp_nccl``'s pipeline (``--worker``, started by the front):
its stage's layers over torch.distributed, the point-to-point ``pp`` group and
the ``pp_broadcast`` group the last rank samples over, the injected skip of the
bug, and over gloo the pipe-file flight-recorder dumps. torch is imported only here,
only when a worker runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import Any

VOCAB = 32000


def set_title(title: str) -> None:
    try:
        from setproctitle import setproctitle
    except ImportError:
        return
    setproctitle(title)


def _serve_gloo_pipe(rank: int, pipe_stem: str, dump_prefix: str) -> None:
    """NCCL's pipe-file dump, for gloo: a byte on ``<stem><rank>.pipe`` writes a dump."""
    import torch._C._distributed_c10d as c10d

    dump = getattr(c10d, "_dump_fr_trace", None)
    if dump is None:
        return
    pipe = f"{pipe_stem}{rank}.pipe"
    try:
        if not os.path.exists(pipe):
            os.mkfifo(pipe)
    except OSError:
        return
    while True:
        try:
            with open(pipe, "rb") as reader:  # blocks until a writer opens it
                data = reader.read(1)
        except OSError:
            return
        if not data:
            continue
        target = f"{dump_prefix}{rank}"
        try:
            payload = dump(True, True, False)
            with open(target + ".tmp", "wb") as out:
                out.write(payload)
            os.replace(target + ".tmp", target)
            print(f"[rank{rank}] flight recorder dumped to {target}", file=sys.stderr, flush=True)
        except Exception as exc:  # the worker keeps serving; the harness notes the missing dump
            print(f"[rank{rank}] flight recorder dump failed: {exc}", file=sys.stderr, flush=True)


def run_worker(args: argparse.Namespace) -> int:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank, world, last = args.rank, args.pp_size, args.pp_size - 1
    set_title(f"{args.title_prefix}::Worker_PP{rank}")

    # The front stops the workers with an exit command; a SIGTERM to a rank ends
    # nothing, as with the hung server of the bug report (only SIGKILL does).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    nccl = args.backend == "nccl"
    if nccl:
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dtype = torch.bfloat16
    else:
        device, dtype = torch.device("cpu"), torch.float32
        stem, prefix = os.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE"), os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
        if stem and prefix:
            threading.Thread(target=_serve_gloo_pipe, args=(rank, stem, prefix), daemon=True).start()
    dist.init_process_group(
        args.backend,
        init_method=f"tcp://127.0.0.1:{args.master_port}",
        rank=rank,
        world_size=world,
        device_id=device if nccl else None,
    )
    pp = dist.new_group(list(range(world)), group_desc="pp")
    pp_broadcast = dist.new_group(
        list(range(world)), timeout=timedelta(seconds=args.pp_timeout), group_desc="pp_broadcast"
    )
    gen = torch.Generator().manual_seed(1234 + rank)
    hidden = args.hidden
    weights = [
        (torch.randn(hidden, hidden, generator=gen) / hidden**0.5).to(device=device, dtype=dtype)
        for _ in range(args.layers)
    ]
    embed = torch.randn(VOCAB, hidden, generator=gen).to(device=device, dtype=dtype) if rank == 0 else None
    head = torch.randn(hidden, 512, generator=gen).to(device=device, dtype=dtype) if rank == last else None
    results = os.fdopen(args.result_fd, "w", buffering=1) if rank == 0 and args.result_fd is not None else None

    def step(cmd: dict[str, Any]) -> None:
        n = int(cmd["n"])
        if rank == 0:
            ids = torch.tensor([t % VOCAB for t in cmd["tokens"]], dtype=torch.int64, device=device)
            x = embed[ids]
        else:
            x = torch.empty(n, hidden, device=device, dtype=dtype)
            dist.recv(x, src=rank - 1, group=pp)
        for w in weights:
            x = torch.tanh(x @ w)
        if rank < last:
            dist.send(x, dst=rank + 1, group=pp)
        sampled = torch.empty(n, dtype=torch.int64, device=device)
        if args.spec_tokens:
            spec_step(cmd, x, n)
            return
        if rank == last:
            sampled.copy_((x.float() @ head.float()).argmax(dim=-1) * 61 + int(cmd["step"]))
            if cmd.get("skip_broadcast"):
                # The bug: this rank's broadcast is gated on data the others do not see.
                print(f"[rank{rank}] skipping the sampled-token broadcast of step {cmd['step']}",
                      file=sys.stderr, flush=True)
                return
        dist.broadcast(sampled, src=last, group=pp_broadcast)
        if results is not None and cmd["step"] >= 0:
            results.write(json.dumps({"step": cmd["step"], "tokens": sampled.tolist()}) + "\n")

    def spec_broadcasts(n: int, x=None, step_no: int = 0, gated_skip: bool = False) -> Any:
        """One step's payloads over pp_broadcast with speculative decoding, as the seed's
        protocol: drafts [n, k] int64, sampled tokens [n] int64, acceptance mask [2, n] int32."""
        k = args.spec_tokens
        drafts = torch.zeros(n, k, dtype=torch.int64, device=device)
        sampled = torch.zeros(n, dtype=torch.int64, device=device)
        mask = torch.zeros(2, n, dtype=torch.int32, device=device)
        if rank == last and x is not None:
            sampled.copy_((x.float() @ head.float()).argmax(dim=-1) * 61 + step_no)
            drafts.copy_(sampled.unsqueeze(1) + torch.arange(1, k + 1, device=device))
            mask.fill_(1)
        if rank == last and gated_skip:
            # The bug: the draft broadcast is gated on data only this rank sees (mask is None).
            print(f"[rank{rank}] mask is None: not broadcasting the drafts of step {step_no}", file=sys.stderr, flush=True)
        else:
            dist.broadcast(drafts, src=last, group=pp_broadcast)
        dist.broadcast(sampled, src=last, group=pp_broadcast)
        dist.broadcast(mask, src=last, group=pp_broadcast)
        return sampled

    def spec_step(cmd: dict[str, Any], x, n: int) -> None:
        ahead = cmd.get("ahead_n")
        if ahead and rank < last:
            # The pp_size+1 race: the extra in-flight batch's sample step runs here
            # before this step's, while the last rank is still on this step.
            print(f"[rank{rank}] sampling in-flight batch {cmd['step'] + 1} ahead of the last rank",
                  file=sys.stderr, flush=True)
            spec_broadcasts(int(ahead))
        sampled = spec_broadcasts(n, x, int(cmd["step"]), gated_skip=bool(cmd.get("mask_none")))
        if rank == last and cmd.get("mask_none"):
            return
        if results is not None and cmd["step"] >= 0:
            results.write(json.dumps({"step": cmd["step"], "tokens": sampled.tolist()}) + "\n")

    step({"step": -1, "n": 1, "tokens": [1]})  # warm-up: every rank and group is up
    if results is not None:
        results.write(json.dumps({"ready": True, "device": str(device), "backend": args.backend}) + "\n")
    for line in sys.stdin:
        try:
            cmd = json.loads(line)
        except json.JSONDecodeError:
            continue
        if cmd.get("exit"):
            break
        step(cmd)
    dist.destroy_process_group()
    return 0
