"""A small independent fake of a vLLM OpenAI server that misbehaves in one way,
for the ways the simulator cannot: ``python fake_vllm.py MODE PORT_FILE``.

It serves /health, /v1/models (with ``max_model_len``), /metrics (vLLM names,
counters that follow what it served) and /v1/chat/completions, on 127.0.0.1,
port 0 (the bound port goes to PORT_FILE). MODE says how completions answer:

  ok            a normal stream: role chunk, three content chunks, finish, usage, [DONE]
  http500       HTTP 500 with an empty body (as a launcher in front of vLLM may answer)
  http400       HTTP 400 with vLLM's error object (prompt too long)
  garbage       HTTP 200 with an HTML page instead of SSE
  cut           two content chunks, then the connection is dropped
  odd_shape     one content chunk, then ``"delta": "oops"``
  slow_some     every third request streams slowly (40 chunks, 0.25 s apart), the rest ok
  metrics_garbage  completions ok; /metrics answers unparsable text after 3 scrapes
  metrics_bomb  completions ok; /metrics answers a gzip of 512 MiB of zeros (half a MB on the wire)
"""

from __future__ import annotations

import asyncio
import json
import sys

from aiohttp import web

MODEL = "fake-model"
MAX_MODEL_LEN = 1_000_000


class State:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.requests = 0
        self.prompt_tokens = 0
        self.generated = 0
        self.scrapes = 0


def chunk(content: str | None = None, *, finish: str | None = None, usage: dict | None = None) -> bytes:
    obj: dict = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": MODEL, "choices": []}
    if content is not None or finish is not None:
        delta = {"content": content} if content is not None else {}
        obj["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def completions(request: web.Request) -> web.StreamResponse:
    state: State = request.app["state"]
    body = await request.read()
    state.requests += 1
    number = state.requests
    prompt = max(1, len(body) // 4)
    mode = state.mode
    if mode == "http500":
        return web.Response(status=500, body=b"")
    if mode == "http400":
        message = f"This model's maximum context length is 1024 tokens. However, you requested {prompt} tokens."
        return web.json_response({"object": "error", "message": message, "type": "BadRequestError", "param": None,
                                  "code": 400}, status=400)
    if mode == "garbage":
        return web.Response(status=200, body=b"<html><body><h1>502 Bad Gateway</h1></body></html>",
                            content_type="text/html")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(chunk(""))
    pieces = 40 if mode == "slow_some" and number % 3 == 0 else 3
    for i in range(pieces):
        await response.write(chunk(f"t{i} "))
        state.generated += 1
        if mode == "slow_some" and pieces > 3:
            await asyncio.sleep(0.25)
        if mode == "cut" and i == 1:
            request.transport.abort()  # type: ignore[union-attr]
            return response
        if mode == "odd_shape":
            await response.write(b'data: {"choices":[{"index":0,"delta":"oops","finish_reason":null}]}\n\n')
            break
    state.prompt_tokens += prompt
    await response.write(chunk(finish="stop"))
    usage = {"prompt_tokens": prompt, "completion_tokens": pieces, "total_tokens": prompt + pieces}
    await response.write(chunk(usage=usage))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def metrics(request: web.Request) -> web.Response:
    state: State = request.app["state"]
    state.scrapes += 1
    if state.mode == "metrics_garbage" and state.scrapes > 3:
        return web.Response(text="<html>this is not {prometheus} text\x00\n", content_type="text/plain")
    if state.mode == "metrics_bomb":
        return web.Response(body=gzip_bomb(), headers={"Content-Encoding": "gzip"}, content_type="text/plain")
    labels = f'{{model_name="{MODEL}",engine="0"}}'
    lines = [
        "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{labels} 0",
        "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{labels} 0",
        "# TYPE vllm:kv_cache_usage_perc gauge", f"vllm:kv_cache_usage_perc{labels} 0.1",
        "# TYPE vllm:prompt_tokens counter", f"vllm:prompt_tokens_total{labels} {state.prompt_tokens}",
        "# TYPE vllm:generation_tokens counter", f"vllm:generation_tokens_total{labels} {state.generated}",
        "# TYPE vllm:prefix_cache_queries counter", f"vllm:prefix_cache_queries_total{labels} {state.prompt_tokens}",
        "# TYPE vllm:prefix_cache_hits counter", f"vllm:prefix_cache_hits_total{labels} {state.prompt_tokens // 2}",
    ]
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


_BOMB: list[bytes] = []


def gzip_bomb(size: int = 512 << 20) -> bytes:
    """``size`` zeros gzipped, made once (a MiB at a time: the fake stays small too)."""
    if not _BOMB:
        import zlib

        packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        block = bytes(1 << 20)
        _BOMB.append(b"".join(packer.compress(block) for _ in range(size >> 20)) + packer.flush())
    return _BOMB[0]


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [
        {"id": MODEL, "object": "model", "owned_by": "fake", "root": MODEL, "max_model_len": MAX_MODEL_LEN}]})


async def main(mode: str, port_file: str) -> None:
    app = web.Application()
    app["state"] = State(mode)
    if mode == "metrics_bomb":
        gzip_bomb()  # made before the port is known: every scrape answers at once
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    with open(port_file + ".tmp", "w") as fh:
        fh.write(str(port))
    import os

    os.replace(port_file + ".tmp", port_file)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
