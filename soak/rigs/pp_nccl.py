"""A small pipeline-parallel server over torch.distributed that deadlocks the
way vLLM #53402 does: one process per GPU over NCCL (gloo on CPU).

    python -m soak.rigs.pp_nccl --pp-size N [--backend nccl|gloo] [--port 0 --port-file F]
                               [--hang-after-steps K] [--model NAME]

The front process (titled ``VLLM::APIServer``) serves vLLM's endpoints on
127.0.0.1: ``/health``, ``/v1/models``, ``/version``, ``/metrics`` (vLLM's
names, from ``soak.metric_names``), ``/tokenize``, streaming and plain
``/v1/completions`` and ``/v1/chat/completions``; plus ``POST /sim/fault``
``{"kind": "pp_deadlock"}`` to trigger the hang now. It starts one worker
process per stage (``VLLM::Worker_PP<r>``) and schedules engine steps: each
step goes to every rank (as vLLM's scheduler output does); rank 0 embeds the
batch's tokens, each stage runs its layers and sends the activations to the
next stage (point-to-point, group ``pp``), and the last stage samples a token
per request and broadcasts them to every rank over a separate group named
like vLLM's, ``pp_broadcast``. Rank 0 hands the tokens back to the front.

On the trigger, the last rank skips one broadcast (the data-gated broadcast of
the bug). Ranks 0..N-2 then wait in theirs: over NCCL their GPUs spin at 100%;
the last rank waits on its CPU for a next step that never comes (its GPU reads
0%); the token counter freezes, streams stall, ``/health`` stays 200 and
SIGTERM ends nothing, until the watchdog timeout of ``pp_broadcast``
(``--pp-timeout``, 60 s as in the seed's setup).

Flight recorder: the ranks inherit ``TORCH_NCCL_*``/``TORCH_FR_*`` from the
environment (a launched target gets them from the harness); ``--dump-dir`` sets
them when absent. NCCL answers its pipe files itself; over gloo each rank
serves ``<TORCH_NCCL_DEBUG_INFO_PIPE_FILE><rank>.pipe`` the same way (any byte
written asks for a dump to ``<TORCH_FR_DUMP_TEMP_FILE><rank>``), so the
harness's evidence path is exercised on CPU too.

torch is imported only by the workers; the front needs aiohttp and
prometheus_client.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

from soak.rigs.pp_front import FAULT_KINDS, Front
from soak.rigs.pp_worker import run_worker, set_title


async def serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    front = Front(args)
    set_title(f"{args.title_prefix}::APIServer")
    front.start_workers()
    ready = await asyncio.wait_for(front.results.get(), args.startup_timeout)
    if not ready or not ready.get("ready"):
        front.log("the workers did not come up", "ERROR")
        await front.stop_workers()
        return 1
    front.log(f"pipeline of {args.pp_size} ranks up over {args.backend} on {ready.get('device')}")
    app = web.Application()
    app.add_routes(front.routes())
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = runner.addresses[0][1]
    if args.port_file:
        Path(args.port_file).write_text(f"{port}\n")
    front.log(f"serving {args.model} on http://{args.host}:{port}")
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_term() -> None:
        if front.hung_since is not None:  # hung: shutting down would wait on ranks that never answer
            front.log("SIGTERM received while a step is outstanding; waiting for it", "WARNING")
            return
        done.set()

    loop.add_signal_handler(signal.SIGTERM, on_term)
    loop.add_signal_handler(signal.SIGINT, on_term)
    loop.add_signal_handler(signal.SIGUSR1, done.set)  # the engine died
    tasks = [asyncio.create_task(front.schedule()), asyncio.create_task(front.watch_workers())]
    await done.wait()
    front.stopping = True
    for task in tasks:
        task.cancel()
    await runner.cleanup()
    await front.stop_workers()
    return 1 if front.dead else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m soak.rigs.pp_nccl", description=__doc__.split("\n\n")[0])
    p.add_argument("--pp-size", type=int, default=2)
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--port-file")
    p.add_argument("--model", default="pp-nccl")
    p.add_argument("--max-num-seqs", type=int, default=12)
    p.add_argument("--min-step-ms", type=float, default=20.0, help="engine steps are at least this long")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--pp-timeout", type=float, default=60.0, help="watchdog timeout of pp_broadcast, seconds")
    p.add_argument("--hang-after-steps", type=int, help="inject --fault at this step")
    p.add_argument("--fault", choices=FAULT_KINDS, default="pp_deadlock", help="what --hang-after-steps injects")
    p.add_argument("--spec-tokens", type=int, default=0,
                   help="speculative tokens: 0 = one sampled-token broadcast a step; K = drafts [n,K], tokens, mask [2,n]")
    p.add_argument("--dump-dir", type=Path, help="flight-recorder dumps here when the environment names none")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--title-prefix", default=os.environ.get("VLLM_PROCESS_NAME_PREFIX", "VLLM"))
    # worker mode (started by the front)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--master-port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--result-fd", type=int, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.pp_size < 1:
        print("pp_nccl: --pp-size must be at least 1", file=sys.stderr)
        return 2
    if args.worker:
        return run_worker(args)
    try:
        return asyncio.run(serve(args))
    except asyncio.TimeoutError:
        print("pp_nccl: the workers did not come up in time", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
