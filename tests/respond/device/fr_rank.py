"""A hung one-rank NCCL "server" for the device run of the flight-recorder path.

Started by fr_pipe.py with the environment of ``soak.respond.flight_recorder_env``
(nothing set here, so the test is of the variables the harness gives). Posts a
few broadcasts on a group named like vLLM's ``pp_broadcast``, then one more
queued behind a long kernel, and stays alive, SIGTERM ignored, printing
``ready`` once its pipe file exists.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

signal.signal(signal.SIGTERM, signal.SIG_IGN)
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1, store=dist.HashStore(), device_id=torch.device("cuda", 0))
pp = dist.new_group([0], timeout=timedelta(minutes=10), group_desc="pp_broadcast")
tokens = torch.zeros(6, dtype=torch.int64, device="cuda")
for step in range(8):
    tokens.fill_(step)
    dist.broadcast(tokens, src=0, group=pp)
torch.cuda.synchronize()
torch.cuda._sleep(40_000_000_000)  # ~20 s of spinning ahead of the next broadcast
dist.broadcast(tokens, src=0, group=pp, async_op=True)
pipe = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] + "0.pipe"
deadline = time.monotonic() + 30
while not os.path.exists(pipe) and time.monotonic() < deadline:
    time.sleep(0.05)
print("ready" if os.path.exists(pipe) else "no pipe", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 120)
