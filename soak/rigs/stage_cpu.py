"""A pipeline of CPU-only workers titled ``VLLM::Worker_PP<r>`` that spin or sleep
in the shapes a stuck or healthy pipeline shows through the stage-CPU source
(soak.probes.stage_cpu): for tests, bench and docs/detection.md.

    python -m soak.rigs.stage_cpu --stages 3 --shape deadlock --after 4

prints one JSON line ``{"root": PID, "workers": {stage: PID}, "fault_at": wall
time the shape began}`` once the workers are titled, runs ``--duration``
seconds at most, and takes its workers along on SIGTERM/SIGINT.

Shapes (after ``--after`` seconds of the healthy shape):
- ``healthy``: one stage busy at a time in turn (``--step`` seconds each), as
  a pipeline's stages take turns on one micro-batch;
- ``deadlock``: the seed's shape: stages 0..N-2 spin (busy-waiting in an
  unmatched collective), the last stage sleeps;
- ``stopped``: the last stage SIGSTOPs itself (state T, no CPU), the others spin;
- ``idle``: every stage sleeps (a gap between turns, no request; with requests in
  flight, the real CPU build's skipped send: gloo's receive sleeps);
- ``spin_last``: the last stage spins while the others sleep (the real CPU build's
  deaf last stage);
- ``cold``: stage 0 busy for ``--cold`` seconds while the others sleep (a long
  cold prefill or a first-time compile), then healthy again.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

SHAPES = ("healthy", "deadlock", "stopped", "idle", "cold", "spin_last")


def _title(text: str) -> None:
    from setproctitle import setproctitle  # a dependency: vLLM titles its workers this way

    setproctitle(text)


def _spin(until: float) -> None:
    while time.monotonic() < until:
        pass


def _busy(stage: int, stages: int, shape: str, t: float, *, step: float, cold: float) -> bool:
    """Whether ``stage`` works at ``t`` seconds into the fault shape (t < 0: before it)."""
    if t >= 0 and shape == "deadlock":
        return stage < stages - 1
    if t >= 0 and shape == "stopped":
        return stage < stages - 1
    if t >= 0 and shape == "idle":
        return False
    if t >= 0 and shape == "spin_last":
        return stage == stages - 1
    if t >= 0 and shape == "cold" and t < cold:
        return stage == 0
    return int((t + 1e6) / step) % stages == stage


def _worker(stage: int, args: argparse.Namespace, fault_at: float) -> None:
    _title(f"VLLM::Worker_PP{stage}")
    end = fault_at + args.duration
    stopped = False
    while (now := time.monotonic()) < end:
        t = now - fault_at
        if args.shape == "stopped" and t >= 0 and stage == args.stages - 1 and not stopped:
            stopped = True
            os.kill(os.getpid(), signal.SIGSTOP)
            continue
        if _busy(stage, args.stages, args.shape, t, step=args.step, cold=args.cold):
            _spin(min(now + 0.01, end))
        elif t >= 0 and args.shape in ("idle", "spin_last", "deadlock"):
            # a rank blocked in a receive sleeps in the kernel until the shape ends: waking
            # every 10 ms on a loaded box queued for a CPU each time and read 10-60% busy
            time.sleep(max(0.0, end - now))
        else:
            time.sleep(0.01)
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m soak.rigs.stage_cpu")
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--shape", choices=SHAPES, default="healthy")
    parser.add_argument("--after", type=float, default=0.0, help="seconds of the healthy shape first")
    parser.add_argument("--step", type=float, default=0.05, help="seconds a stage works per turn (healthy)")
    parser.add_argument("--cold", type=float, default=4.0, help="seconds stage 0 works alone (cold)")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds the shape lasts at most")
    args = parser.parse_args(argv)
    if args.stages < 1:
        parser.error("--stages must be at least 1")
    _title("VLLM::EngineCore")
    fault_mono = time.monotonic() + args.after
    fault_wall = time.time() + args.after
    workers: dict[int, int] = {}
    for stage in range(args.stages):
        pid = os.fork()
        if pid == 0:
            try:
                _worker(stage, args, fault_mono)
            finally:
                os._exit(0)
        workers[stage] = pid

    def _kill_all() -> None:
        for pid in workers.values():
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass

    def _stop(signum, frame):
        _kill_all()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    time.sleep(0.2)  # the children title themselves
    print(json.dumps({"root": os.getpid(), "workers": workers, "fault_at": fault_wall}), flush=True)
    deadline = time.monotonic() + args.after + args.duration + 5
    try:
        while workers and time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid:
                workers = {s: p for s, p in workers.items() if p != pid}
            time.sleep(0.1)
    finally:
        _kill_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
