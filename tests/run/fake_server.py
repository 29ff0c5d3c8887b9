"""A small OpenAI-compatible server with a vLLM-shaped process tree, independent
of the simulator, for the trust tests (identity, orphans, secrets).

    root     serves /health, /v1/models, /metrics, /v1/chat/completions (SSE) on --port
    ├─ worker 0   ignores SIGTERM, calls setsid()
    └─ worker 1   ignores SIGTERM, calls setsid(), starts a helper and exits: the
       └─ helper  orphan (reparents away, as vLLM's workers do after their parent dies)

Like vLLM it prints its non-default arguments (every unknown ``--flag value`` it
was given, secrets included) and logs the Authorization header of the first
request in two writes (a key split across buffered chunks). ``--crash-after S``:
the root exits with code 1 after S seconds, leaving its workers running.
Every process writes ``<state>/<role>.pid``; none lives past ``--lifetime``.
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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def write_pid(state: Path, role: str) -> None:
    tmp = state / f".{role}.pid"
    tmp.write_text(str(os.getpid()))
    os.replace(tmp, state / f"{role}.pid")


def spawn(args: argparse.Namespace, extra: list[str], role: str) -> subprocess.Popen:
    cmd = [sys.executable, os.path.abspath(__file__), "--role", role, "--state", str(args.state),
           "--lifetime", str(args.lifetime), *extra]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL)


def worker(args: argparse.Namespace, extra: list[str]) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.setsid()
    write_pid(args.state, args.role)
    if args.role == "worker1":
        spawn(args, extra, "helper")
        time.sleep(0.5)
        os._exit(0)  # the helper is orphaned
    time.sleep(args.lifetime)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-vllm"
    logged_auth = False
    tokens = 0

    def log_message(self, *a) -> None:
        pass

    def _json(self, status: int, obj: object) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "fake", "object": "model", "max_model_len": 1_000_000}]})
        elif self.path == "/metrics":
            text = (
                "# TYPE vllm:generation_tokens_total counter\n"
                f'vllm:generation_tokens_total{{engine="0",model_name="fake"}} {Handler.tokens}\n'
                "# TYPE vllm:num_requests_running gauge\n"
                'vllm:num_requests_running{engine="0",model_name="fake"} 0\n'
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        auth = self.headers.get("Authorization")
        if auth and not Handler.logged_auth:
            Handler.logged_auth = True
            half = len(auth) // 2
            sys.stdout.write(f"INFO request headers: authorization={auth[:half]}")
            sys.stdout.flush()
            time.sleep(0.05)
            sys.stdout.write(f"{auth[half:]} (echoed)\n")
            sys.stdout.flush()
        if not self.path.endswith("/chat/completions"):
            self._json(404, {"error": "not found"})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for word in ("ok", " fine", " done"):
            chunk = {"id": "x", "object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": {"content": word}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            Handler.tokens += 1
            time.sleep(0.01)
        usage = {"id": "x", "object": "chat.completion.chunk", "choices": [],
                 "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        self.wfile.flush()
        self.close_connection = True


def root(args: argparse.Namespace, extra: list[str]) -> None:
    write_pid(args.state, "root")
    given = {}
    i = 0
    while i < len(extra):
        flag, eq, value = extra[i].partition("=")
        if eq:
            given[flag.lstrip("-").replace("-", "_")] = value
        elif i + 1 < len(extra) and not extra[i + 1].startswith("-"):
            given[flag.lstrip("-").replace("-", "_")] = extra[i + 1]
            i += 1
        i += 1
    print(f"INFO non-default args: {given!r}", flush=True)
    secret_env = {k: v for k, v in os.environ.items() if any(w in k for w in ("TOKEN", "KEY", "SECRET"))}
    print("INFO environment: " + " ".join(f"{k}={v}" for k, v in sorted(secret_env.items())), flush=True)
    children = [spawn(args, extra, f"worker{n}") for n in range(args.workers)]
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"INFO listening on 127.0.0.1:{server.server_address[1]}", flush=True)
    deadline = time.monotonic() + args.lifetime
    crash_at = time.monotonic() + args.crash_after if args.crash_after else None
    while time.monotonic() < deadline:
        if crash_at is not None and time.monotonic() >= crash_at:
            print("ERROR EngineCore died (fake crash)", flush=True)
            os._exit(1)  # the workers stay behind
        for child in children:
            child.poll()
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", default="root")
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--crash-after", type=float, default=0.0)
    parser.add_argument("--lifetime", type=float, default=120.0)
    args, extra = parser.parse_known_args()
    args.state.mkdir(parents=True, exist_ok=True)
    if args.role == "root":
        root(args, extra)
    else:
        worker(args, extra)


if __name__ == "__main__":
    main()
