"""A simulated pipeline-stage worker (``VLLM::Worker_PP<rank>``): holds its GPU, costs no CPU.

Started by the engine core as
``python -m soak.sim.worker --rank R --pp-size N --gpu-index I [--ack-fd FD] [--title-prefix VLLM]``
(the CUDA-backed twin, ``python -m soak.rigs.cuda_worker``, takes the same arguments
and speaks the same protocol).

Protocol: newline-delimited JSON commands on stdin, one object a line:

    {"state": "busy", "util": 0.6}   running work at this utilization (0.0-1.0)
    {"state": "idle"}                no work; SIGTERM ends the worker
    {"state": "spin"}                hung in a collective, GPU reads 100%; ignores SIGTERM
    {"state": "hold"}                hung, holding the GPU at 0%; ignores SIGTERM
    {"state": "exit", "code": 0}     exit now with this code

With ``SOAK_SIM_BURN_CPU=1`` in its environment a worker also costs the CPU its
state says (``spin``: a whole core, ``busy``: ``util`` of one, the others none),
so the stage-CPU source (soak.probes.stage_cpu) reads the simulated pipeline's
shapes as it reads vLLM's CPU build.

A command may carry ``"ignore_sigterm": true|false`` to override the state's
default (hung states ignore SIGTERM, the others do not). Unknown keys are ignored; a line that is not JSON is logged and skipped. After
applying a command the worker writes ``"<rank> <state>\\n"`` to ``--ack-fd`` when
given, so the engine core can tell when, say, every rank ignores SIGTERM.

On stdin EOF (the engine core is gone) a healthy worker exits; a hung one
(spin/hold) stays, as real workers survive their parent, and gives up only
after ``--orphan-linger`` seconds (default 600) so a forgotten test leaves
nothing behind for long. Log lines go to stdout prefixed ``(Worker_PP3 pid=1234)``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

HUNG_STATES = ("spin", "hold")
STATES = ("busy", "idle", "spin", "hold", "exit")


def _log(prefix: str, message: str, level: str = "INFO") -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    # SOAK_SIM_LOG_COLOR=1 (set by the simulator as vLLM 0.11.x): the prefix in cyan
    who = f"({prefix} pid={os.getpid()})"
    if os.environ.get("SOAK_SIM_LOG_COLOR") == "1":
        who = f"\033[1;36m{who}\033[0;0m"
    sys.stdout.write(f"{who} {level} {stamp} [gpu_worker.py:1] {message}\n")
    sys.stdout.flush()


def run(rank: int, pp_size: int, gpu_index: int, *, ack_fd: int | None, title_prefix: str, orphan_linger: float, own_session: bool) -> int:
    if own_session:
        os.setsid()
    name = f"Worker_PP{rank}"
    from setproctitle import setproctitle  # a dependency: vLLM titles its workers, and stage_of reads titles

    setproctitle(f"{title_prefix}::{name}")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the API server, which shuts us down
    ack = os.fdopen(ack_fd, "w", buffering=1) if ack_fd is not None else None
    _log(name, f"simulated worker rank {rank}/{pp_size} holding GPU {gpu_index}")
    state = "idle"

    def acknowledge() -> None:
        if ack is not None:
            try:
                ack.write(f"{rank} {state}\n")
                ack.flush()
            except OSError:
                pass

    acknowledge()
    burn = {"util": 0.0}
    if os.environ.get("SOAK_SIM_BURN_CPU") == "1":
        _start_burner(burn)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            command = json.loads(line)
            new_state = command.get("state")
        except (json.JSONDecodeError, AttributeError):
            _log(name, f"ignoring a command that is not a JSON object: {line[:80]!r}", "WARNING")
            continue
        if new_state not in STATES:
            _log(name, f"ignoring unknown state {new_state!r}", "WARNING")
            continue
        if new_state == "exit":
            return int(command.get("code", 0))
        state = new_state
        util = command.get("util", 0.0) if state == "busy" else 1.0 if state == "spin" else 0.0
        burn["util"] = min(max(float(util), 0.0), 1.0) if isinstance(util, (int, float)) else 0.0
        ignore = command.get("ignore_sigterm")
        if not isinstance(ignore, bool):
            ignore = state in HUNG_STATES
        signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore else signal.SIG_DFL)
        acknowledge()
    if state in HUNG_STATES:  # orphaned while hung: stay, like the real thing
        deadline = time.monotonic() + orphan_linger
        while time.monotonic() < deadline:
            time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
    return 0


def _start_burner(burn: dict) -> None:
    """Spin ``burn["util"]`` of every 20 ms on a daemon thread (the GIL leaves the
    command loop its turns: it blocks on stdin, releasing it)."""
    import threading

    def loop() -> None:
        while True:
            start = time.monotonic()
            busy_until = start + 0.02 * burn["util"]
            while time.monotonic() < busy_until:
                pass
            time.sleep(max(0.0, start + 0.02 - time.monotonic()))

    threading.Thread(target=loop, daemon=True, name="burn-cpu").start()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m soak.sim.worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--pp-size", type=int, required=True)
    parser.add_argument("--gpu-index", type=int, required=True)
    parser.add_argument("--ack-fd", type=int)
    parser.add_argument("--title-prefix", default="VLLM")
    parser.add_argument("--orphan-linger", type=float, default=600.0)
    parser.add_argument("--own-session", action="store_true", help="setsid: its own process group (kill-path tests)")
    a = parser.parse_args(argv)
    return run(a.rank, a.pp_size, a.gpu_index, ack_fd=a.ack_fd, title_prefix=a.title_prefix,
               orphan_linger=a.orphan_linger, own_session=a.own_session)


if __name__ == "__main__":
    sys.exit(main())
