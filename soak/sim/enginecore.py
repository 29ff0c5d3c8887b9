"""The simulated engine-core process (``VLLM::EngineCore``): parent of the workers.

The API server keeps the engine model in-process; this process exists so the
tree looks like vLLM's (API server -> engine core -> one worker per stage) and
the kill path meets real processes. It starts the workers, reports their PIDs,
and relays commands:

stdin, newline-delimited JSON from the API server:
    {"workers": {...}}            send this worker command to every rank
    {"rank": R, "worker": {...}}  send it to one rank
    {"ignore_sigterm": true}      this process ignores SIGTERM from now on
    {"exit": CODE}                kill the workers (SIGKILL) and exit with CODE (a crash)
status, written to ``--status-fd``:
    {"workers": [pid, ...]}       once, after starting the workers
    {"ack": R, "state": S}        a worker applied a command
    {"ack": "engine", "ignore_sigterm": true}

On stdin EOF or SIGTERM (when not ignoring it) the workers get ``exit`` and the
process exits 0; when hung it stays (orphaned, as vLLM's do) for ``--orphan-linger``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time


def _log(message: str, level: str = "INFO") -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    who = f"(EngineCore_DP0 pid={os.getpid()})"
    if os.environ.get("SOAK_SIM_LOG_COLOR") == "1":  # as vLLM 0.11.x colours the prefix
        who = f"\033[1;36m{who}\033[0;0m"
    sys.stdout.write(f"{who} {level} {stamp} [core.py:1] {message}\n")
    sys.stdout.flush()


class _Core:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.status = os.fdopen(args.status_fd, "w", buffering=1)
        self.lock = threading.Lock()
        self.workers: list[subprocess.Popen] = []
        self.hung = False
        self.ack_r, self.ack_w = os.pipe()

    def send_status(self, obj) -> None:
        with self.lock:
            try:
                self.status.write(json.dumps(obj) + "\n")
                self.status.flush()
            except (OSError, ValueError):
                pass

    def start_workers(self) -> None:
        a = self.args
        module = "soak.sim.worker" if a.worker_backend == "cpu" else "soak.rigs.cuda_worker"
        for rank in range(a.pp_size):
            cmd = [sys.executable, "-m", module, "--rank", str(rank), "--pp-size", str(a.pp_size),
                   "--gpu-index", str(rank), "--ack-fd", str(self.ack_w), "--title-prefix", a.title_prefix,
                   "--orphan-linger", str(a.orphan_linger)]
            if a.worker_own_session == rank:
                cmd.append("--own-session")
            self.workers.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, pass_fds=(self.ack_w,), text=True))
        os.close(self.ack_w)
        threading.Thread(target=self._relay_acks, daemon=True).start()
        self.send_status({"workers": [w.pid for w in self.workers]})

    def _relay_acks(self) -> None:
        with os.fdopen(self.ack_r, "r") as acks:
            for line in acks:
                rank, _, state = line.strip().partition(" ")
                if rank.isdigit():
                    self.send_status({"ack": int(rank), "state": state})

    def to_worker(self, rank: int, command: dict) -> None:
        w = self.workers[rank]
        try:
            w.stdin.write(json.dumps(command) + "\n")
            w.stdin.flush()
        except (OSError, ValueError):
            pass

    def stop_workers(self, kill: bool = False) -> None:
        for w in self.workers:
            if kill:
                try:
                    w.kill()
                except OSError:
                    pass
            else:
                try:
                    w.stdin.write('{"state": "exit"}\n')
                    w.stdin.close()
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + 5.0
        for w in self.workers:
            try:
                w.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()

    def run(self) -> int:
        def on_term(signum, frame):
            if not self.hung:
                self.stop_workers()
                os._exit(0)

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.start_workers()
        _log(f"started {len(self.workers)} workers (pipeline parallel {self.args.pp_size})")
        for line in sys.stdin:
            try:
                cmd = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(cmd, dict):
                continue
            if "workers" in cmd:
                for rank in range(len(self.workers)):
                    self.to_worker(rank, cmd["workers"])
            if "rank" in cmd and "worker" in cmd:
                self.to_worker(int(cmd["rank"]), cmd["worker"])
            if cmd.get("ignore_sigterm"):
                self.hung = True
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                self.send_status({"ack": "engine", "ignore_sigterm": True})
            if "exit" in cmd:
                self.stop_workers(kill=True)
                return int(cmd["exit"])
        if self.hung:
            deadline = time.monotonic() + self.args.orphan_linger
            while time.monotonic() < deadline:
                time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
            return 0
        self.stop_workers()
        return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m soak.sim.enginecore")
    p.add_argument("--pp-size", type=int, required=True)
    p.add_argument("--status-fd", type=int, required=True)
    p.add_argument("--worker-backend", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--worker-own-session", type=int)
    p.add_argument("--title-prefix", default="VLLM")
    p.add_argument("--orphan-linger", type=float, default=600.0)
    args = p.parse_args(argv)
    from setproctitle import setproctitle  # a dependency, as vLLM titles its engine core

    setproctitle(f"{args.title_prefix}::EngineCore")
    return _Core(args).run()


if __name__ == "__main__":
    sys.exit(main())
