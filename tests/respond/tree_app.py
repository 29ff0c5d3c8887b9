"""A process tree shaped like vLLM's (PP, mp executor), for the kill-path tests.

    api      VLLM::APIServer   serves /health and /metrics on 127.0.0.1:0, ignores SIGTERM
    └─ engine VLLM::EngineCore ignores SIGTERM
       ├─ worker 0  VLLM::Worker_PP0  ignores SIGTERM, answers its flight-recorder pipe
       ├─ worker 1  VLLM::Worker_PP1  os.setsid(): its own session and process group
       └─ worker 2  VLLM::Worker_PP2  starts a helper, then exits when told to,
          └─ helper VLLM::Worker_PP2  orphaned: reparents away (vllm#55510)

Every process writes ``<state>/<role>.pid`` once it is up. ``<state>/release``
appearing makes worker 2 exit, orphaning its helper. No process exits on its own
within ``--lifetime`` seconds (a bound, so a failed test leaves nothing forever).
"""

from __future__ import annotations

import argparse
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 1234.0
"""


def title(name: str) -> None:
    import setproctitle

    setproctitle.setproctitle(name)


def write_pid(state: Path, role: str) -> None:
    tmp = state / f".{role}.pid"
    tmp.write_text(str(os.getpid()))
    os.replace(tmp, state / f"{role}.pid")


def spawn(args: argparse.Namespace, role: str, **kw) -> subprocess.Popen:
    cmd = [sys.executable, os.path.abspath(__file__), "--role", role, "--state", str(args.state),
           "--lifetime", str(args.lifetime)]
    if args.pipe_stem:
        cmd += ["--pipe-stem", args.pipe_stem, "--dump-prefix", args.dump_prefix]
    return subprocess.Popen(cmd, **kw)


def serve_pipe(stem: str, dump_prefix: str, rank: int) -> None:
    """What PyTorch does with TORCH_NCCL_DEBUG_INFO_PIPE_FILE: a byte on the FIFO, a dump."""
    pipe = f"{stem}{rank}.pipe"
    os.mkfifo(pipe)

    def loop() -> None:
        while True:
            with open(pipe, "rb") as fh:
                if not fh.read(1):
                    continue
            dump = {
                "version": "2.4",
                "pg_status": {"0": {"last_enqueued_collective": 40432, "last_started_collective": -1,
                                    "last_completed_collective": 40426}},
                "entries": [{"collective_seq_id": 40427, "profiling_name": "nccl:broadcast",
                             "input_sizes": [[6]], "state": "scheduled", "timeout_ms": 60000}],
            }
            tmp = f"{dump_prefix}{rank}.tmp"
            with open(tmp, "wb") as out:
                pickle.dump(dump, out)
            os.replace(tmp, f"{dump_prefix}{rank}")

    threading.Thread(target=loop, daemon=True).start()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = METRICS.encode() if self.path == "/metrics" else b"{}"
        self.send_response(200 if self.path in ("/metrics", "/health") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", default="api")
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--lifetime", type=float, default=60.0)
    parser.add_argument("--pipe-stem", default=None)
    parser.add_argument("--dump-prefix", default=None)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    children: list[subprocess.Popen] = []
    if args.role == "api":
        title("VLLM::APIServer")
        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        (args.state / "port").write_text(str(server.server_address[1]))
        print("INFO api server up", flush=True)
        print("[PG ID 8 PG GUID 85(pp_broadcast) Rank 3] failure detected by watchdog at work sequence id: 40427",
              flush=True)
        children.append(spawn(args, "engine"))
    elif args.role == "engine":
        title("VLLM::EngineCore")
        for rank in range(3):
            children.append(spawn(args, f"worker{rank}"))
    elif args.role.startswith("worker"):
        rank = int(args.role[len("worker"):])
        title(f"VLLM::Worker_PP{rank}")
        if rank == 1:
            os.setsid()
        if args.pipe_stem:
            serve_pipe(args.pipe_stem, args.dump_prefix, rank)
        if rank == 2:
            children.append(spawn(args, "helper"))
    elif args.role == "helper":
        title("VLLM::Worker_PP2")
    write_pid(args.state, args.role)
    deadline = time.monotonic() + args.lifetime
    while time.monotonic() < deadline:
        if args.role == "worker2" and (args.state / "release").exists():
            os._exit(0)  # leave the helper behind, as a SIGKILLed parent would
        for child in children:
            child.poll()  # reap, so a dead child is not a zombie
        time.sleep(0.05)


if __name__ == "__main__":
    main()
