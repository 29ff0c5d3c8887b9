"""A chaos fake of a vLLM OpenAI server: every completion request, /metrics
scrape, /health, /version, /v1/models answer and log line is drawn from a
grammar of misbehaviours given as a JSON-able spec (tests/chaos/strategies.py
draws specs; docs/chaos.md describes the grammar). It records what it really
did (tokens per tenth of a second, requests finished with tokens, when and
with how many, redirects issued, bytes sent, requests the redirect sink received) to a ground-truth JSON file, so a
test can hold the harness's verdict against reality.

In-process::

    server = ChaosServer(spec, truth_path=path, log_path=log)
    base_url = await server.start()            # 127.0.0.1, port 0
    ...
    await server.close()                       # final ground truth written

As a process (the attached or launched target of a real ``soak run``)::

    python tests/chaos/server.py --spec SPEC.json --truth TRUTH.json \
        [--port 0 --port-file F] [--log FILE]
    python tests/chaos/server.py --forward-to PORT --port-file F   # a TCP proxy in front

Only the standard library and aiohttp: the harness under test is not imported,
so a bug in it cannot hide a bug in the fake's view of the world.

Spec (every key optional; ``phase()`` and ``spec()`` fill defaults)::

    {"seed": 0,
     "secret": "chaosS3CRET...",          # the string no run file may contain
     "phases": [{"duration_s": 2.0,       # null: to the end
                 "completions": [BEHAVIOUR, ...],   # request n of the phase: [n % len]
                 "metrics": {...}, "health": {...}}],
     "version": {...}, "models": {...}, "log": {...}}

Phase time starts at the first completion request (the harness's load start),
so a spec can say "work 2 s, then stall" whatever the harness's start-up took.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import zlib
from pathlib import Path
from typing import Any

from aiohttp import web

MODEL = "chaos-model"
MAX_MODEL_LEN = 1_000_000
TRUTH_EVERY_S = 0.2
SINK_KEEP = 50  # sink requests kept in the truth file (the count is exact)

# What the grammar knows; strategies.py draws from these and tests check them.
COMPLETION_KINDS = (
    "normal", "hang", "headers_then_hang", "trickle", "slow", "zero_tokens", "keepalive",
    "http_error", "no_done", "reset", "redirect", "wrong_types", "deep_nesting", "huge_line", "html_200",
)
WRONG_TYPES = (
    "content_int", "content_list", "delta_str", "choices_obj", "choices_null", "chunk_list", "chunk_number",
    "finish_int", "usage_str", "usage_negative", "usage_float", "usage_huge", "usage_null", "usage_bool",
    "usage_list", "prompt_details_str",
)
# The longest SSE line a reader is promised to read (soak.load.sse's 16 Mi
# characters): a content chunk under it is a token, one past it is not work.
READER_LINE_BOUND = 16 << 20
# Wrong types that leave the content readable: the request still did its work.
WORK_DESPITE = ("finish_int",)
METRICS_KINDS = (
    "normal", "no_kv", "reset", "backwards", "lying", "gzip_bomb", "deflate_bomb", "huge_line", "garbage", "hang",
    "trickle", "http_error", "empty", "redirect",
)
HEALTH_KINDS = ("ok", "fail", "hang", "flap", "redirect", "never_ready")
VERSION_KINDS = ("normal", "formula", "secret", "huge", "wrong_type", "deep", "missing", "http_404", "hang")
MODELS_KINDS = ("normal", "max_len_str", "max_len_negative", "deep", "extra_junk")
FORMULAS = ('=HYPERLINK("http://127.0.0.1/x","click")', "+cmd|' /C calc'!A0", "@SUM(1+1)*cmd|' /C calc'!A0",
            "-2+3+cmd|' /C calc'!A0", "=1+1", "\t=2+2")
SECRET_SHAPES = ("userinfo", "query", "flag", "bearer", "env")


def secret_shape(shape: str, secret: str) -> str:
    """``secret`` inside a string shaped like a credential by pattern (what a
    redactor that works by pattern is promised to catch)."""
    return {
        "userinfo": f"postgres://chaos:{secret}@127.0.0.1:5432/db",
        "query": f"http://127.0.0.1:9/hook?api_key={secret}&x=1",
        "flag": f"--api-key {secret}",
        "bearer": f"Authorization: Bearer {secret}",
        "env": f"HF_TOKEN={secret}",
    }[shape]


def phase(**kw: Any) -> dict[str, Any]:
    out = {"duration_s": None, "completions": [{"kind": "normal"}], "metrics": {"kind": "normal"},
           "health": {"kind": "ok"}}
    out.update(kw)
    return out


def spec(**kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"seed": 0, "secret": "chaosS3CRETdefault0000", "phases": [phase()],
                           "version": {"kind": "normal"}, "models": {"kind": "normal"}, "log": {}}
    out.update(kw)
    return out


def _bomb(encoding: str, inflated_mb: int) -> bytes:
    """``inflated_mb`` MiB of ``#`` (one comment line) compressed to a few KiB:
    one MiB compressed with a full flush resets the dictionary, so that piece
    repeated is a valid stream (no need to compress a GiB)."""
    piece_plain = b"#" * (1 << 20)
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    piece = comp.compress(piece_plain) + comp.flush(zlib.Z_FULL_FLUSH)
    tail = comp.flush(zlib.Z_FINISH)
    body = piece * inflated_mb + tail
    if encoding == "gzip":
        crc = 0
        for _ in range(inflated_mb):
            crc = zlib.crc32(piece_plain, crc)
        size = (inflated_mb << 20) & 0xFFFFFFFF
        return (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + body + crc.to_bytes(4, "little")
                + size.to_bytes(4, "little"))
    adler = 1
    for _ in range(inflated_mb):
        adler = zlib.adler32(piece_plain, adler)
    return b"\x78\xda" + body + adler.to_bytes(4, "big")


class Truth:
    """What the server actually did, rewritten atomically every TRUTH_EVERY_S."""

    def __init__(self, path: Path | None, spec: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {
            "pid": os.getpid(), "spec": spec, "started_wall": time.time(), "first_request_wall": None,
            "requests_received": 0, "requests_by_kind": {}, "completed_ok": 0, "completed_ok_walls": [],
            "completed_ok_tokens": [],
            "tokens_total": 0, "tokens_by_ds": {}, "malformed_chunks": 0, "redirects_issued": 0,
            "followed_redirects": 0, "sink_requests": 0, "sink_log": [], "bytes_sent": 0, "metrics_scrapes": 0,
            "health_probes": 0, "version_probes": 0, "models_probes": 0, "authorization_seen": 0,
            "phases_entered": [], "in_flight": 0, "updated_wall": None, "final": False,
        }
        self.dirty = True

    def bump(self, key: str, by: int = 1) -> None:
        self.data[key] += by
        self.dirty = True

    def token(self, n: int = 1) -> None:
        ds = str(int(time.time() * 10))
        bucket = self.data["tokens_by_ds"]
        bucket[ds] = bucket.get(ds, 0) + n
        self.data["tokens_total"] += n
        self.dirty = True

    def write(self, *, final: bool = False) -> None:
        if self.path is None or not (self.dirty or final):
            return
        self.data["updated_wall"] = time.time()
        self.data["final"] = final
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data), encoding="utf-8")
        os.replace(tmp, self.path)
        self.dirty = False


def _chunk(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _content(text: str | None, *, finish: str | None = None) -> dict[str, Any]:
    delta = {} if text is None else {"content": text}
    return {"id": "chatcmpl-chaos", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {"id": "chatcmpl-chaos", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
            "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                     "total_tokens": prompt + completion}}


class ChaosServer:
    def __init__(self, spec: dict[str, Any], *, truth_path: Path | None = None, log_path: Path | None = None,
                 log_stream: Any = None) -> None:
        self.spec = spec
        self.secret = spec.get("secret", "")
        self.truth = Truth(truth_path, spec)
        self.log_path = log_path
        self.log_stream = log_stream
        self._log_file = None
        self._runners: list[web.AppRunner] = []
        self._tasks: list[asyncio.Task] = []
        self.port = 0
        self.sink_port = 0
        self._t0: float | None = None  # monotonic time of the first completion request
        self._phase_index = -1
        self._phase_requests = 0
        self._phase_scrapes = 0
        self._counter_offset = (0, 0)  # (prompt, generated) at the start of a "reset" metrics phase
        self._prompt_total = 0
        self._gen_reported = 0
        self._bombs: dict[tuple[str, int], bytes] = {}
        self._stopping = asyncio.Event()

    # -- phases -------------------------------------------------------------
    def _phase(self) -> dict[str, Any]:
        phases = self.spec.get("phases") or [phase()]
        if self._t0 is None:
            index = 0
        else:
            elapsed = time.monotonic() - self._t0
            index, edge = len(phases) - 1, 0.0
            for i, p in enumerate(phases):
                d = p.get("duration_s")
                if d is None:
                    index = i
                    break
                edge += d
                if elapsed < edge:
                    index = i
                    break
        if index != self._phase_index:
            self._phase_index = index
            self._phase_requests = 0
            self._phase_scrapes = 0
            self._counter_offset = (self._prompt_total, self.truth.data["tokens_total"])
            self.truth.data["phases_entered"].append({"index": index, "wall": time.time()})
            self.truth.dirty = True
        return {**phase(), **phases[index]}

    # -- output -------------------------------------------------------------
    async def _write(self, response: web.StreamResponse, data: bytes) -> None:
        await response.write(data)
        self.truth.bump("bytes_sent", len(data))

    def _log(self, line: str) -> None:
        data = line + "\n"
        if self._log_file is not None:
            self._log_file.write(data)
            self._log_file.flush()
        if self.log_stream is not None:
            self.log_stream.write(data)
            self.log_stream.flush()

    # -- completions --------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        if "chaos_redirect" in request.query:
            self.truth.bump("followed_redirects")
        if request.headers.get("Authorization"):
            self.truth.bump("authorization_seen")
        body = await request.read()
        if self._t0 is None:
            self._t0 = time.monotonic()
            self.truth.data["first_request_wall"] = time.time()
        ph = self._phase()
        behaviours = ph["completions"] or [{"kind": "normal"}]
        b = behaviours[self._phase_requests % len(behaviours)]
        self._phase_requests += 1
        kind = b.get("kind", "normal")
        self.truth.bump("requests_received")
        by_kind = self.truth.data["requests_by_kind"]
        by_kind[kind] = by_kind.get(kind, 0) + 1
        prompt = max(1, len(body) // 4)
        self.truth.bump("in_flight")
        try:
            return await getattr(self, "_c_" + kind)(request, b, prompt)
        finally:
            self.truth.bump("in_flight", -1)

    async def _sse(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        return response

    async def _stream(self, request: web.Request, prompt: int, *, tokens: int, delay_s: float = 0.0,
                      usage: dict | None = None, done: bool = True, finish: str = "stop",
                      bad: bytes | None = None, bad_at: int = -1, bad_is_token: bool = False,
                      first_token_delay_s: float = 0.0) -> tuple[web.StreamResponse, int]:
        """A stream of ``tokens`` well-formed content chunks (each counted in the
        truth once fully written); ``bad`` replaces chunk ``bad_at`` (a token
        too when ``bad_is_token``). ``first_token_delay_s`` is a prefill: vLLM
        sends the headers at once and its first chunk only with the first token."""
        response = await self._sse(request)
        if first_token_delay_s:
            await asyncio.sleep(first_token_delay_s)
        await self._write(response, _chunk(_content("")))
        sent = 0
        for i in range(tokens):
            if delay_s:
                await asyncio.sleep(delay_s)
            if i == bad_at and bad is not None:
                await self._write(response, bad)
                if bad_is_token:
                    self.truth.token()
                    sent += 1
                else:
                    self.truth.bump("malformed_chunks")
                continue
            await self._write(response, _chunk(_content(f"t{i} ")))
            self.truth.token()
            sent += 1
        if bad_at >= tokens and bad is not None:
            await self._write(response, bad)
            self.truth.bump("malformed_chunks")
        await self._write(response, _chunk(_content(None, finish=finish)))
        await self._write(response, _chunk(usage if usage is not None else _usage(prompt, sent)))
        self._prompt_total += prompt
        if done:
            await self._write(response, b"data: [DONE]\n\n")
        return response, sent

    def _ok(self, sent: int) -> None:
        if sent > 0:
            self.truth.bump("completed_ok")
            walls = self.truth.data["completed_ok_walls"]
            if len(walls) < 5000:  # with the tokens each carried, for the per-window floor
                walls.append(round(time.time(), 2))
                self.truth.data["completed_ok_tokens"].append(sent)

    async def _c_normal(self, request, b, prompt):
        response, sent = await self._stream(request, prompt, tokens=int(b.get("tokens", 8)),
                                            delay_s=float(b.get("token_delay_s", 0.0)),
                                            first_token_delay_s=float(b.get("first_token_delay_s", 0.0)))
        await response.write_eof()
        self._ok(sent)
        return response

    async def _hold(self) -> None:
        # Until the server stops: the client gives up (or never does).
        await self._stopping.wait()

    async def _c_hang(self, request, b, prompt):
        await self._hold()
        return web.Response(status=503)

    async def _c_headers_then_hang(self, request, b, prompt):
        response = await self._sse(request)
        await self._hold()
        return response

    async def _c_trickle(self, request, b, prompt):
        interval = float(b.get("interval_s", 1.0))
        tokens = int(b.get("tokens", 8))
        response = await self._sse(request)
        pieces = [(_chunk(_content("")), False)] + [(_chunk(_content(f"t{i} ")), True) for i in range(tokens)]
        pieces += [(_chunk(_content(None, finish="stop")), False), (_chunk(_usage(prompt, tokens)), False),
                   (b"data: [DONE]\n\n", False)]
        sent = 0
        for data, is_token in pieces:
            for i in range(len(data)):
                await self._write(response, data[i:i + 1])
                await asyncio.sleep(interval)
            if is_token:
                self.truth.token()
                sent += 1
        await response.write_eof()
        self._ok(sent)
        return response

    async def _c_slow(self, request, b, prompt):
        response, sent = await self._stream(request, prompt, tokens=int(b.get("tokens", 40)),
                                            delay_s=float(b.get("token_interval_s", 1.0)))
        await response.write_eof()
        self._ok(sent)
        return response

    async def _c_zero_tokens(self, request, b, prompt):
        response, _ = await self._stream(request, prompt, tokens=0, finish=b.get("finish", "stop"))
        await response.write_eof()
        return response

    async def _c_keepalive(self, request, b, prompt):
        response = await self._sse(request)
        interval = float(b.get("interval_s", 0.5))
        while not self._stopping.is_set():
            await self._write(response, b": keep-alive\n\n")
            await asyncio.sleep(interval)
        return response

    async def _c_http_error(self, request, b, prompt):
        status = int(b.get("status", 500))
        shape = b.get("body", "empty")
        if shape == "html":
            body, ctype = b"<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html"
        elif shape == "error_object":
            body = json.dumps({"object": "error", "message": "chaos says no", "type": "BadRequestError",
                               "param": None, "code": status}).encode()
            ctype = "application/json"
        elif shape == "json_garbage":
            body, ctype = b'{"error": [1, 2', "application/json"
        else:
            body, ctype = b"", "text/plain"
        self.truth.bump("bytes_sent", len(body))
        return web.Response(status=status, body=body, content_type=ctype)

    async def _c_no_done(self, request, b, prompt):
        response, sent = await self._stream(request, prompt, tokens=int(b.get("tokens", 8)), done=False)
        if b.get("end", "eof") == "hold":
            await self._hold()
        else:
            await response.write_eof()
        return response

    async def _c_reset(self, request, b, prompt):
        response = await self._sse(request)
        await self._write(response, _chunk(_content("")))
        for i in range(int(b.get("after_tokens", 2))):
            await self._write(response, _chunk(_content(f"t{i} ")))
            self.truth.token()
        await asyncio.sleep(0.01)
        if request.transport is not None:
            request.transport.abort()
        return response

    def _redirect_to(self, b) -> str:
        path = "/v1/chat/completions"
        if b.get("to") == "self":
            return f"http://127.0.0.1:{self.port}{path}?chaos_redirect=1"
        return f"http://127.0.0.1:{self.sink_port}{path}?chaos_redirect=1"

    async def _c_redirect(self, request, b, prompt):
        self.truth.bump("redirects_issued")
        return web.Response(status=int(b.get("status", 307)), headers={"Location": self._redirect_to(b)})

    async def _c_wrong_types(self, request, b, prompt):
        where = b.get("where", "usage_str")
        tokens = int(b.get("tokens", 6))
        usage = _usage(prompt, tokens)
        u = usage["usage"]
        bad = None
        if where == "content_int":
            bad = _chunk({**_content(None), "choices": [{"index": 0, "delta": {"content": 5}, "finish_reason": None}]})
        elif where == "content_list":
            bad = _chunk({**_content(None), "choices": [{"index": 0, "delta": {"content": ["a"]},
                                                        "finish_reason": None}]})
        elif where == "delta_str":
            bad = _chunk({**_content(None), "choices": [{"index": 0, "delta": "oops", "finish_reason": None}]})
        elif where == "choices_obj":
            bad = _chunk({**_content(None), "choices": {"0": {"delta": {"content": "x"}}}})
        elif where == "choices_null":
            bad = _chunk({**_content(None), "choices": None})
        elif where == "chunk_list":
            bad = _chunk([1, 2, 3])
        elif where == "chunk_number":
            bad = b"data: 42\n\n"
        elif where == "finish_int":
            bad = _chunk({**_content(None), "choices": [{"index": 0, "delta": {}, "finish_reason": 7}]})
            u["completion_tokens"] = tokens - 1  # the odd chunk takes a token's place: usage tells what was sent
        elif where == "usage_str":
            u["completion_tokens"] = str(tokens)
        elif where == "usage_negative":
            u["completion_tokens"] = -tokens
            u["prompt_tokens"] = -prompt
        elif where == "usage_float":
            u["completion_tokens"] = 1e308
        elif where == "usage_huge":
            u["prompt_tokens"] = 10 ** 30
        elif where == "usage_null":
            usage["usage"] = None
        elif where == "usage_bool":
            u["completion_tokens"] = True
        elif where == "usage_list":
            usage["usage"] = [tokens]
        elif where == "prompt_details_str":
            u["prompt_tokens_details"] = "cached: lots"
        response, sent = await self._stream(request, prompt, tokens=tokens, usage=usage, bad=bad, bad_at=tokens // 2)
        await response.write_eof()
        # A finish_reason of the wrong type leaves every content chunk readable and the
        # stream finished ([DONE]): the tokens were generated and delivered, work done.
        # The other odd chunks hide content a reader cannot count: not work.
        if bad is None or where in WORK_DESPITE:
            self._ok(sent)
        return response

    async def _c_deep_nesting(self, request, b, prompt):
        depth = int(b.get("depth", 100_000))
        nest = "[" * depth + "]" * depth
        where = b.get("where", "chunk")
        if where == "usage":
            line = ('data: {"id":"x","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1,'
                    '"completion_tokens":1,"total_tokens":2,"prompt_tokens_details":' + nest + '}}\n\n').encode()
        else:
            line = ('data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a",'
                    '"extra":' + nest + '},"finish_reason":null}]}\n\n').encode()
        # A deep chunk still carries a token beside its nested extra field: work
        # done, in a shape a reader must survive (bounded), whatever it makes of it.
        response, sent = await self._stream(request, prompt, tokens=int(b.get("tokens", 4)), bad=line, bad_at=1,
                                            bad_is_token=where == "chunk")
        await response.write_eof()
        self._ok(sent)
        return response

    async def _c_huge_line(self, request, b, prompt):
        mb = int(b.get("mb", 16))
        response = await self._sse(request)
        await self._write(response, _chunk(_content("")))
        await self._write(response, b'data: {"choices":[{"index":0,"delta":{"content":"')
        block = b"a" * (1 << 16)
        for _ in range(mb * 16):
            await self._write(response, block)
        if b.get("newline", False):
            await self._write(response, b'"},"finish_reason":null}]}\n\ndata: [DONE]\n\n')
            await response.write_eof()
            if (mb << 20) < READER_LINE_BOUND:
                # One content chunk, odd only in size, and a finished stream: a token delivered.
                self.truth.token()
                self._ok(1)
                return response
        else:
            await self._hold()
        self.truth.bump("malformed_chunks")
        return response

    async def _c_html_200(self, request, b, prompt):
        body = b"<!doctype html><html><body>" + b"<p>chaos</p>" * 50 + b"</body></html>"
        self.truth.bump("bytes_sent", len(body))
        return web.Response(status=200, body=body, content_type="text/html")

    # -- /metrics -----------------------------------------------------------
    def _metrics_text(self, kind: str, extra: dict) -> str:
        prompt, gen = self._prompt_total, self.truth.data["tokens_total"]
        n = self._phase_scrapes
        if kind == "reset":
            prompt, gen = prompt - self._counter_offset[0], gen - self._counter_offset[1]
        elif kind == "backwards" and n % 2 == 1:
            prompt, gen = prompt // 3, gen // 3
        elif kind == "lying":
            # Counters that claim work nobody did: the client's view is the truth.
            gen = self._gen_reported = self._gen_reported + int(extra.get("per_scrape", 500))
            prompt = gen * 10
        lab = f'model_name="{MODEL}",engine="0"'
        lines = []
        gauges = [("num_requests_running", self.truth.data["in_flight"]), ("num_requests_waiting", 0)]
        if kind != "no_kv":  # a proxy's or an allowlisted page: vLLM's less what a prefill moves
            gauges.append(("kv_cache_usage_perc", 0.1))
        for name, value in gauges:
            lines += [f"# TYPE vllm:{name} gauge", f"vllm:{name}{{{lab}}} {value}"]
        for name, value in (("prompt_tokens", prompt), ("generation_tokens", gen),
                            ("prefix_cache_queries", prompt), ("prefix_cache_hits", prompt // 2),
                            ("num_preemptions", 0)):
            lines += [f"# TYPE vllm:{name}_total counter", f"vllm:{name}_total{{{lab}}} {value}"]
        lines += ["# TYPE vllm:request_success_total counter",
                  f'vllm:request_success_total{{{lab},finished_reason="stop"}} {self.truth.data["completed_ok"]}']
        for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "time_per_output_token_seconds",
                     "e2e_request_latency_seconds", "request_queue_time_seconds", "request_prefill_time_seconds",
                     "request_decode_time_seconds", "request_inference_time_seconds", "request_prompt_tokens",
                     "request_generation_tokens", "iteration_tokens_total"):
            count = self.truth.data["completed_ok"]
            lines += [f"# TYPE vllm:{name} histogram", f'vllm:{name}_bucket{{{lab},le="+Inf"}} {count}',
                      f"vllm:{name}_sum{{{lab}}} {count * 0.01}", f"vllm:{name}_count{{{lab}}} {count}"]
        return "\n".join(lines) + "\n"

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        self.truth.bump("metrics_scrapes")
        m = self._phase()["metrics"]
        self._phase_scrapes += 1
        kind = m.get("kind", "normal")
        if kind in ("gzip_bomb", "deflate_bomb"):
            enc = "gzip" if kind == "gzip_bomb" else "deflate"
            key = (enc, int(m.get("inflated_mb", 256)))
            if key not in self._bombs:
                self._bombs[key] = await asyncio.to_thread(_bomb, *key)
            body = self._bombs[key]
            self.truth.bump("bytes_sent", len(body))
            return web.Response(body=body, headers={"Content-Encoding": enc, "Content-Type": "text/plain"})
        if kind == "huge_line":
            response = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await response.prepare(request)
            block = b"a" * (1 << 16)
            for _ in range(int(m.get("mb", 16)) * 16):
                await self._write(response, block)
            await response.write_eof()
            return response
        if kind == "garbage":
            return web.Response(text="<html>{not prometheus}\x00\n" * 3, content_type="text/plain")
        if kind == "hang":
            await self._hold()
            return web.Response(status=503)
        if kind == "trickle":
            response = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await response.prepare(request)
            for ch in self._metrics_text("normal", m).encode()[:200]:
                await self._write(response, bytes([ch]))
                await asyncio.sleep(float(m.get("interval_s", 1.0)))
            return response
        if kind == "http_error":
            return web.Response(status=int(m.get("status", 500)), body=b"")
        if kind == "empty":
            return web.Response(body=b"", content_type="text/plain")
        if kind == "redirect":
            self.truth.bump("redirects_issued")
            return web.Response(status=int(m.get("status", 302)),
                                headers={"Location": f"http://127.0.0.1:{self.sink_port}/metrics?chaos_redirect=1"})
        text = self._metrics_text(kind, m)
        self.truth.bump("bytes_sent", len(text))
        return web.Response(text=text, content_type="text/plain")

    # -- /health, /version, /v1/models ---------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        self.truth.bump("health_probes")
        h = self._phase()["health"]
        kind = h.get("kind", "ok")
        if kind == "never_ready" or (kind == "fail" and self._t0 is not None):
            return web.Response(status=int(h.get("status", 503)))
        if kind == "hang" and self._t0 is not None:  # hangs once load started, else never ready
            await self._hold()
        if kind == "flap" and self.truth.data["health_probes"] % 2 == 0 and self._t0 is not None:
            return web.Response(status=503)
        if kind == "redirect" and self._t0 is not None:
            self.truth.bump("redirects_issued")
            return web.Response(status=307, headers={"Location": f"http://127.0.0.1:{self.sink_port}/health"})
        return web.Response(status=200)  # "ok" lies when completions stall: that is the point

    async def version(self, request: web.Request) -> web.Response:
        self.truth.bump("version_probes")
        v = self.spec.get("version") or {}
        kind = v.get("kind", "normal")
        if kind == "http_404":
            return web.Response(status=404)
        if kind == "hang":
            await self._hold()
            return web.Response(status=503)
        text = "0.11.0"
        if kind == "formula":
            text = FORMULAS[int(v.get("which", 0)) % len(FORMULAS)]
        elif kind == "secret":
            text = "0.11.0+" + secret_shape(v.get("shape", "userinfo"), self.secret)
        elif kind == "huge":
            text = "0.11.0" + "x" * int(v.get("chars", 1 << 20))
        body: Any = {"version": text}
        if kind == "wrong_type":
            body = {"version": v.get("value", [0, 11, 0])}
        elif kind == "deep":
            depth = int(v.get("depth", 100_000))
            return web.Response(text='{"version":' + "[" * depth + "]" * depth + "}", content_type="application/json")
        elif kind == "missing":
            body = {"name": "chaos"}
        return web.json_response(body)

    async def models(self, request: web.Request) -> web.Response:
        self.truth.bump("models_probes")
        m = self.spec.get("models") or {}
        kind = m.get("kind", "normal")
        entry: dict[str, Any] = {"id": MODEL, "object": "model", "owned_by": "chaos", "root": MODEL,
                                 "max_model_len": MAX_MODEL_LEN}
        if kind == "max_len_str":
            entry["max_model_len"] = str(MAX_MODEL_LEN)
        elif kind == "max_len_negative":
            entry["max_model_len"] = -1
        elif kind == "deep":
            depth = int(m.get("depth", 100_000))
            text = ('{"object":"list","data":[{"id":"' + MODEL + '","object":"model","max_model_len":1000000,'
                    '"permission":' + "[" * depth + "]" * depth + "}]}")
            return web.Response(text=text, content_type="application/json")
        elif kind == "extra_junk":
            entry["root"] = {"nested": [1, {"x": None}]}
            entry["owned_by"] = 12
        return web.json_response({"object": "list", "data": [entry]})

    async def sink(self, request: web.Request) -> web.Response:
        """The redirect destination: anything it receives is traffic that left the target."""
        body = await request.read()
        self.truth.bump("sink_requests")
        log = self.truth.data["sink_log"]
        if len(log) < SINK_KEEP:
            log.append({"method": request.method, "path": request.path_qs, "bytes": len(body), "wall": time.time()})
        return web.Response(status=200, text="sink")

    # -- the log --------------------------------------------------------------
    async def _log_loop(self) -> None:
        cfg = self.spec.get("log") or {}
        interval = float(cfg.get("interval_s", 0.5))
        shapes = cfg.get("secret_shapes") or []
        n = 0
        self._log(f"INFO chaos api_server.py:1 vLLM API server version 0.11.0, pid {os.getpid()}")
        self._log("INFO chaos launcher.py:37 Available routes are: /health, /v1/models, /version, /metrics")
        while not self._stopping.is_set():
            n += 1
            self._log(f"INFO chaos loggers.py:123 Engine 000: Avg generation throughput: "
                      f"{self.truth.data['tokens_total']} tokens/s, Running: {self.truth.data['in_flight']} reqs")
            for shape in shapes:
                self._log(f"INFO chaos connecting with {secret_shape(shape, self.secret)}")
            if cfg.get("signature") and self._t0 is not None and n >= int(cfg.get("signature_after", 4)):
                self._log({"engine_dead": "ERROR chaos core.py:1 EngineDeadError: EngineCore encountered an issue.",
                           "shm": "WARNING chaos shm_broadcast.py:1 No available shared memory broadcast block "
                                  "found in 60 seconds."}[cfg["signature"]])
            if cfg.get("huge_line_mb") and n == 2:
                self._log("x" * (int(cfg["huge_line_mb"]) << 20))
            try:
                await asyncio.wait_for(self._stopping.wait(), interval)
            except asyncio.TimeoutError:
                pass

    async def _truth_loop(self) -> None:
        while not self._stopping.is_set():
            self.truth.write()
            try:
                await asyncio.wait_for(self._stopping.wait(), TRUTH_EVERY_S)
            except asyncio.TimeoutError:
                pass

    # -- life -----------------------------------------------------------------
    async def start(self, *, host: str = "127.0.0.1", port: int = 0) -> str:
        if self.log_path is not None:
            self._log_file = open(self.log_path, "a", encoding="utf-8")
        sink = web.Application()
        sink.router.add_route("*", "/{tail:.*}", self.sink)
        app = web.Application(client_max_size=64 << 20)
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        # Any method: a followed 301/302/303 comes back as a GET, and must be seen.
        app.router.add_route("*", "/v1/chat/completions", self.completions)
        app.router.add_route("*", "/v1/completions", self.completions)
        for application, want in ((sink, 0), (app, port)):
            runner = web.AppRunner(application, shutdown_timeout=0.2, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, host, want)
            await site.start()
            self._runners.append(runner)
            bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            if application is sink:
                self.sink_port = bound
            else:
                self.port = bound
        self.truth.data.update(port=self.port, sink_port=self.sink_port)
        self._tasks = [asyncio.create_task(self._log_loop()), asyncio.create_task(self._truth_loop())]
        return f"http://127.0.0.1:{self.port}"

    async def close(self) -> None:
        self._stopping.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        for runner in reversed(self._runners):
            await runner.cleanup()
        self.truth.write(final=True)
        if self._log_file is not None:
            self._log_file.close()


async def forward(port: int, *, to_port: int) -> asyncio.AbstractServer:
    """A plain loopback TCP forwarder to ``to_port`` (a proxy in front of the
    target: the listener a harness finds on the URL's port, but not the server)."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", to_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return await asyncio.start_server(handle, "127.0.0.1", port)


def _write_port(port_file: str, port: int) -> None:
    tmp = port_file + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(str(port))
    os.replace(tmp, port_file)


async def _wait_for_signal() -> None:
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, done.set)
    await done.wait()


async def _main(args: argparse.Namespace) -> None:
    if args.forward_to:
        proxy = await forward(args.port, to_port=args.forward_to)
        if args.port_file:
            _write_port(args.port_file, proxy.sockets[0].getsockname()[1])
        await _wait_for_signal()
        return
    chaos_spec = json.loads(Path(args.spec).read_text(encoding="utf-8"))
    server = ChaosServer(chaos_spec, truth_path=Path(args.truth) if args.truth else None,
                         log_path=Path(args.log) if args.log else None,
                         log_stream=None if args.log else sys.stdout)
    await server.start(port=args.port)
    if args.port_file:
        _write_port(args.port_file, server.port)
    await _wait_for_signal()
    await server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec")
    parser.add_argument("--forward-to", type=int, help="be a TCP forwarder to this loopback port instead")
    parser.add_argument("--truth")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file")
    parser.add_argument("--log", help="write the log here (default: stdout)")
    # Unknown arguments are a launch command's own flags (--api-key, --db-url ...): accepted, unused.
    asyncio.run(_main(parser.parse_known_args()[0]))
