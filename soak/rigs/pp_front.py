"""The front process of ``soak.rigs.pp_nccl`` (``VLLM::APIServer``): it starts the
ranks, schedules engine steps over them, injects the faults and serves vLLM's
endpoints (aiohttp and prometheus_client, imported when it runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any

from soak.rigs.pp_worker import VOCAB

# pp_deadlock: the last rank skips its one broadcast. With --spec-tokens K (three
# broadcasts a step, as the seed's protocol): pp_gated_broadcast, the last rank
# skips the drafts when its mask is None, so later broadcasts pair with the wrong
# payloads, then the group hangs; pp_race, the ranks before the last sample an
# extra in-flight batch (one more request) a step ahead of the last rank.
FAULT_KINDS = ("pp_deadlock", "pp_gated_broadcast", "pp_race")
MAX_MODEL_LEN = 327680


def _words(text: str) -> list[int]:
    return [zlib.crc32(w.encode()) % VOCAB for w in text.split()]


def _chat_text(messages: Any) -> str:
    parts = []
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "\n".join(parts)


@dataclass
class Request:
    request_id: str
    prompt: list[int]
    max_tokens: int
    created: float
    tokens: asyncio.Queue = field(default_factory=asyncio.Queue)
    generated: int = 0
    last_token: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None


class Front:
    def __init__(self, args: argparse.Namespace) -> None:
        from prometheus_client import CollectorRegistry

        self.args = args
        self.model = args.model
        self.registry = CollectorRegistry()
        self.metrics = self._make_metrics()
        self.workers: list[subprocess.Popen] = []
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.wake = asyncio.Event()
        self.results: asyncio.Queue = asyncio.Queue()
        self.steps = 0
        self.hang_armed = False
        self.fault_kind = args.fault
        self.hung_since: float | None = None
        self.dead: str | None = None
        self.stopping = False

    def _make_metrics(self) -> dict[str, Any]:
        from prometheus_client import Counter, Gauge, Histogram

        from soak.metric_names import VLLM_METRICS, MetricType

        out: dict[str, Any] = {}
        for key in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens",
                    "generation_tokens", "request_success", "prefix_cache_queries", "prefix_cache_hits",
                    "num_preemptions", "time_to_first_token_seconds", "inter_token_latency_seconds",
                    "e2e_request_latency_seconds", "iteration_tokens_total"):
            spec = VLLM_METRICS[key]
            labels = ["model_name", "engine", *spec.extra_labels]
            name = spec.exposed
            if spec.type is MetricType.COUNTER:
                metric = Counter(name, spec.help, labels, registry=self.registry)
            elif spec.type is MetricType.GAUGE:
                metric = Gauge(name, spec.help, labels, registry=self.registry)
            else:
                metric = Histogram(name, spec.help, labels, buckets=spec.buckets, registry=self.registry)
            out[key] = metric
            if not spec.extra_labels:
                metric.labels(self.model, "0")  # exposed at 0 from the start, as vLLM does
        out["request_success"].labels(self.model, "0", "length")
        out["request_success"].labels(self.model, "0", "stop")
        return out

    def m(self, key: str, *extra: str):
        return self.metrics[key].labels(self.model, "0", *extra)

    # -- workers

    def start_workers(self) -> None:
        args = self.args
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            master_port = s.getsockname()[1]
        env = dict(os.environ)
        if args.dump_dir is not None:
            from soak.rigs.fr_dump import recorder_env

            args.dump_dir.mkdir(parents=True, exist_ok=True)
            for name, value in recorder_env(args.dump_dir.resolve()).items():
                env.setdefault(name, value)
        read_fd, write_fd = os.pipe()
        for rank in range(args.pp_size):
            argv = [sys.executable, "-m", "soak.rigs.pp_nccl", "--worker", "--rank", str(rank),
                    "--pp-size", str(args.pp_size), "--backend", args.backend, "--master-port", str(master_port),
                    "--hidden", str(args.hidden), "--layers", str(args.layers), "--pp-timeout", str(args.pp_timeout), "--spec-tokens", str(args.spec_tokens),
                    "--title-prefix", args.title_prefix]
            pass_fds: tuple[int, ...] = ()
            if rank == 0:
                argv += ["--result-fd", str(write_fd)]
                pass_fds = (write_fd,)
            self.workers.append(subprocess.Popen(argv, stdin=subprocess.PIPE, text=True, env=env, pass_fds=pass_fds))
        os.close(write_fd)
        loop = asyncio.get_running_loop()

        def relay() -> None:
            with os.fdopen(read_fd) as lines:
                for line in lines:
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    loop.call_soon_threadsafe(self.results.put_nowait, obj)
            loop.call_soon_threadsafe(self.results.put_nowait, None)

        threading.Thread(target=relay, daemon=True, name="rank0-results").start()

    def to_workers(self, cmd: dict[str, Any], *, last_extra: dict[str, Any] | None = None,
                   others_extra: dict[str, Any] | None = None) -> None:
        for rank, worker in enumerate(self.workers):
            last = rank == len(self.workers) - 1
            payload = {**cmd, **((last_extra if last else others_extra) or {})}
            try:
                worker.stdin.write(json.dumps(payload) + "\n")
                worker.stdin.flush()
            except (OSError, ValueError):
                pass

    def log(self, message: str, level: str = "INFO") -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        print(f"(APIServer pid={os.getpid()}) {level} {stamp} [pp_nccl.py:1] {message}", flush=True)

    async def watch_workers(self) -> None:
        while not self.stopping:
            for rank, worker in enumerate(self.workers):
                code = worker.poll()
                if code is not None and self.dead is None:
                    self.dead = f"Worker_PP{rank} exited with {code}"
                    self.log(f"EngineCore encountered an issue. See stack trace (above) for the root cause. ({self.dead})",
                             "ERROR")
                    self.log("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.", "ERROR")
                    for request in self.running + self.waiting:
                        request.tokens.put_nowait(None)
                    asyncio.get_running_loop().call_later(0.5, os.kill, os.getpid(), signal.SIGUSR1)
                    return
            await asyncio.sleep(0.5)

    async def schedule(self) -> None:
        args = self.args
        while not self.stopping and self.dead is None:
            if not self.running and not self.waiting:
                self.wake.clear()
                await self.wake.wait()
                continue
            while self.waiting and len(self.running) < args.max_num_seqs:
                self.running.append(self.waiting.pop(0))
            self.m("num_requests_running").set(len(self.running))
            self.m("num_requests_waiting").set(len(self.waiting))
            batch = list(self.running)
            started = time.monotonic()
            self.steps += 1
            fault = self.hang_armed or (args.hang_after_steps is not None and self.steps == args.hang_after_steps)
            kind = self.fault_kind if self.hang_armed else args.fault
            last_extra = others_extra = None
            if fault:
                self.hang_armed = False
                self.hung_since = time.time()
                if kind == "pp_race" and args.spec_tokens:
                    others_extra = {"ahead_n": len(batch) + 1}
                    self.log(f"pp_race: an extra in-flight batch samples ahead of the last rank at step {self.steps}",
                             "WARNING")
                elif kind == "pp_gated_broadcast" and args.spec_tokens:
                    last_extra = {"mask_none": True}
                    self.log(f"pp_gated_broadcast: the last rank's mask is None at step {self.steps}", "WARNING")
                else:
                    last_extra = {"skip_broadcast": True}
                    self.log(f"pp_deadlock: the last rank will skip the broadcast of step {self.steps}", "WARNING")
            tokens = [r.last_token if r.generated else (r.prompt[-1] if r.prompt else 0) for r in batch]
            self.to_workers({"step": self.steps, "n": len(batch), "tokens": tokens},
                            last_extra=last_extra, others_extra=others_extra)
            result = await self.results.get()
            if result is None:
                return  # rank 0 is gone; watch_workers reports it
            self.hung_since = None
            now = time.time()
            self.m("iteration_tokens_total").observe(len(batch))
            self.m("generation_tokens").inc(len(batch))
            for request, token in zip(batch, result["tokens"]):
                if request.generated == 0:
                    request.first_token_at = now
                    self.m("prompt_tokens").inc(len(request.prompt))
                    self.m("prefix_cache_queries").inc(len(request.prompt))
                    self.m("time_to_first_token_seconds").observe(now - request.created)
                elif request.last_token_at is not None:
                    self.m("inter_token_latency_seconds").observe(now - request.last_token_at)
                request.generated += 1
                request.last_token = int(token)
                request.last_token_at = now
                request.tokens.put_nowait(int(token))
                if request.generated >= request.max_tokens:
                    self.running.remove(request)
                    request.tokens.put_nowait(None)
                    self.m("request_success", "length").inc()
                    self.m("e2e_request_latency_seconds").observe(now - request.created)
            self.m("num_requests_running").set(len(self.running))
            self.m("kv_cache_usage_perc").set(min(1.0, sum(len(r.prompt) + r.generated for r in self.running) / 1e6))
            rest = args.min_step_ms / 1000.0 - (time.monotonic() - started)
            if rest > 0:
                await asyncio.sleep(rest)

    async def stop_workers(self) -> None:
        self.to_workers({"exit": True})
        deadline = time.monotonic() + 10.0
        for worker in self.workers:
            while worker.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if worker.poll() is None:
                worker.kill()
                worker.wait()

    # -- HTTP

    def routes(self):
        from aiohttp import web

        async def health(request):
            return web.Response(status=503 if self.dead else 200)

        async def models(request):
            return web.json_response({"object": "list", "data": [
                {"id": self.model, "object": "model", "owned_by": "soak", "max_model_len": MAX_MODEL_LEN}]})

        async def version(request):
            return web.json_response({"version": "0.11.2+soak.pp_nccl"})

        async def metrics(request):
            from prometheus_client import generate_latest

            return web.Response(body=generate_latest(self.registry), content_type="text/plain", charset="utf-8")

        async def tokenize(request):
            body = await _json(request)
            text = _chat_text(body.get("messages")) if "messages" in body else str(body.get("prompt", ""))
            ids = _words(text)
            return web.json_response({"count": len(ids), "max_model_len": MAX_MODEL_LEN, "tokens": ids})

        async def fault(request):
            body = await _json(request)
            if body.get("kind") not in FAULT_KINDS:
                return web.json_response({"error": f"unknown kind {body.get('kind')}, known: {', '.join(FAULT_KINDS)}"},
                                         status=400)
            self.fault_kind = body["kind"]
            self.hang_armed = True
            self.log("pp_deadlock armed: the next step's broadcast will be skipped by the last rank", "WARNING")
            return web.json_response({"kind": "pp_deadlock", "armed": True})

        async def state(request):
            return web.json_response({
                "processes": {"api_server": os.getpid(), "engine_core": None, "workers": [w.pid for w in self.workers]},
                "fault": {"kind": "pp_deadlock", "active": self.hung_since is not None, "onset_at": self.hung_since},
                "steps": self.steps, "backend": self.args.backend,
            })

        async def completions(request):
            return await self._generate(request, chat=False)

        async def chat(request):
            return await self._generate(request, chat=True)

        return [
            web.get("/health", health), web.get("/v1/models", models), web.get("/version", version),
            web.get("/metrics", metrics), web.post("/tokenize", tokenize), web.post("/sim/fault", fault),
            web.get("/sim/state", state), web.post("/v1/completions", completions),
            web.post("/v1/chat/completions", chat),
        ]

    async def _generate(self, http_request, *, chat: bool):
        from aiohttp import web

        body = await _json(http_request)
        if body.get("model") not in (None, self.model):
            return web.json_response({"object": "error", "message": f"The model `{body.get('model')}` does not exist.",
                                      "type": "NotFoundError", "param": None, "code": 404}, status=404)
        text = _chat_text(body.get("messages")) if chat else str(body.get("prompt", ""))
        prompt = _words(text)
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if len(prompt) + max_tokens > MAX_MODEL_LEN or self.dead:
            return web.json_response({"object": "error", "message": "prompt too long or engine dead",
                                      "type": "BadRequestError", "param": None, "code": 400}, status=400)
        request = Request(f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", prompt, max_tokens, time.time())
        self.waiting.append(request)
        self.wake.set()
        created = int(request.created)
        obj = "chat.completion.chunk" if chat else "text_completion"

        def choice(piece: str, finish: str | None):
            if chat:
                return {"index": 0, "delta": {"content": piece}, "logprobs": None, "finish_reason": finish}
            return {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish}

        usage = lambda: {"prompt_tokens": len(prompt), "completion_tokens": request.generated,  # noqa: E731
                         "total_tokens": len(prompt) + request.generated}
        if not body.get("stream"):
            pieces = []
            while (token := await request.tokens.get()) is not None:
                pieces.append(f" t{token}")
            message = {"role": "assistant", "content": "".join(pieces)}
            c = ({"index": 0, "message": message, "finish_reason": "length"} if chat
                 else {"index": 0, "text": "".join(pieces), "finish_reason": "length"})
            return web.json_response({"id": request.request_id, "object": "chat.completion" if chat else "text_completion",
                                      "created": created, "model": self.model, "choices": [c], "usage": usage()})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(http_request)

        async def send(payload: dict[str, Any]) -> None:
            await response.write(f"data: {json.dumps(payload)}\n\n".encode())

        try:
            sent = 0
            while (token := await request.tokens.get()) is not None:
                sent += 1
                finish = "length" if sent >= max_tokens else None
                await send({"id": request.request_id, "object": obj, "created": created, "model": self.model,
                            "choices": [choice(f" t{token}", finish)]})
            options = body.get("stream_options") or {}
            if options.get("include_usage"):
                await send({"id": request.request_id, "object": obj, "created": created, "model": self.model,
                            "choices": [], "usage": usage()})
            await response.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            if request in self.running:
                self.running.remove(request)
            if request in self.waiting:
                self.waiting.remove(request)
            raise
        return response


async def _json(request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return body if isinstance(body, dict) else {}
