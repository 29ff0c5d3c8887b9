"""A two-stage gloo pipeline shaped like vLLM's CPU workers, stalled on purpose (needs torch).

    python gloo_stall.py --mode skip|spin|stop --port P --state DIR

The parent (the "API server") starts one process per stage, each titled by its
argv ``VLLM::Worker_PP<rank>`` as vLLM titles its workers. Stage 0 sends each
step's payload to stage 1 with ``GroupCoordinator.isend_tensor_dict``; stage 1
receives it in ``irecv_tensor_dict`` -> ``recv_object`` -> ``torch.distributed.recv``
(vLLM's names, so py-spy shows the same shape). At step 3:

- skip: stage 0 skips its send and idles in ``MessageQueue.dequeue`` (form (a));
- spin: stage 0 runs a busy loop in ``execute_model`` instead of sending;
- stop: stage 0 idles like skip; the test SIGSTOPs it.

Stage 1 blocks in the receive nobody matches. Each stage writes
``DIR/rank<r>.pid`` at start and ``DIR/rank<r>.stuck`` just before it stalls.
The tree lives until it is killed (or --lifetime runs out).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

STALL_STEP = 3


class GroupCoordinator:
    def __init__(self, dist, rank: int) -> None:
        self.dist, self.rank = dist, rank

    def send_object(self, obj, dst: int) -> None:
        import torch

        self.dist.send(torch.tensor([obj], dtype=torch.long), dst=dst)

    def recv_object(self, src: int):
        import torch

        buf = torch.zeros(1, dtype=torch.long)
        self.dist.recv(buf, src=src)
        return int(buf[0])

    def isend_tensor_dict(self, step: int) -> None:
        self.send_object(step, dst=self.rank + 1)

    def irecv_tensor_dict(self) -> int:
        return self.recv_object(src=self.rank - 1)


class MessageQueue:
    def dequeue(self) -> None:
        threading.Event().wait()  # the next RPC, which never comes


def execute_model(pp: GroupCoordinator, step: int, mode: str, state: Path) -> None:
    if pp.rank == 0:
        if step == STALL_STEP and mode in ("skip", "stop"):
            (state / "rank0.stuck").write_text(str(step))
            MessageQueue().dequeue()
        if step == STALL_STEP and mode == "spin":
            (state / "rank0.stuck").write_text(str(step))
            x = 0
            while True:
                x = (x * 1103515245 + 12345) & 0xFFFFFFFF
        pp.isend_tensor_dict(step)
    else:
        if step == STALL_STEP:
            (state / "rank1.stuck").write_text(str(step))
        got = pp.irecv_tensor_dict()
        assert got == step, (got, step)


def worker(rank: int, args: argparse.Namespace) -> None:
    (args.state / f"rank{rank}.pid").write_text(str(os.getpid()))
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{args.port}",
                            timeout=datetime.timedelta(seconds=args.lifetime))
    pp = GroupCoordinator(dist, rank)
    for step in range(1, STALL_STEP + 1):
        execute_model(pp, step, args.mode, args.state)
    MessageQueue().dequeue()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("skip", "spin", "stop"), default="skip")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--state", type=Path, required=True)
    p.add_argument("--lifetime", type=float, default=300.0)
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("title", nargs="?", default="")
    args = p.parse_args()
    if args.rank is not None:
        worker(args.rank, args)
        return 0
    children = [subprocess.Popen([sys.executable, __file__, "--mode", args.mode, "--port", str(args.port),
                                  "--state", str(args.state), "--lifetime", str(args.lifetime),
                                  "--rank", str(r), f"VLLM::Worker_PP{r}"]) for r in (0, 1)]
    deadline = time.monotonic() + args.lifetime
    while time.monotonic() < deadline and all(c.poll() is None for c in children):
        time.sleep(0.2)
    for c in children:
        c.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
