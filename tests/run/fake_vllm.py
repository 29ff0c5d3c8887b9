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
  counters_reset   /version 0.11.2; every 4th request is refused with HTTP 503 before any
                   streaming (the server counts none of its prompt); odd requests report
                   prompt_tokens_details (half the prompt cached), even ones leave them out
                   (0 cached, as 0.11.x with the flag on); at a /metrics scrape after 20
                   requests where each counter gained less than it held, every counter
                   restarts from what it gained since the scrape before (a reset that shows,
                   exactly reconstructible); GET /fake/truth gives what it really served
  counters_dip     as counters_reset, and the 2nd scrape after the reset reads 1 below the
                   one before (counters that go backwards without a restart), the next as before
  redirect_other   completions answer 307 to $FAKE_REDIRECT_TO (another server); the rest ok
  redirect_loop    completions answer 307 to themselves, numbered: ``?n=<this POST's number>``
  redirect_probes  completions ok; /metrics and /version answer 302 to $FAKE_REDIRECT_TO
  metrics_bomb  completions ok; /metrics answers a gzip of 512 MiB of zeros (half a MB on the wire)

Servers that answer but do no work (issue 32, "no evidence, no pass"); PACE
(optional third argument, seconds, default 20 as the issue's trickle) sets
their rhythm:

  never_answer  reads the request and never sends a status line
  trickle       200, then one real content chunk after another, one byte every PACE
                seconds: a token now and then, no request ever finishes
  all_slow      200 and a normal stream, but one content chunk every PACE seconds
                and 10,000 of them: every request is still streaming when cut
  zero_tokens   200 and a well-formed stream with no content: finish "stop",
                usage completion_tokens 0, [DONE]
  keepalive_only  200, then only SSE comments (``: ping``) every PACE seconds
"""

from __future__ import annotations

import asyncio
import json
import sys

from aiohttp import ClientConnectionResetError, web

MODEL = "fake-model"
MAX_MODEL_LEN = 1_000_000


class State:
    def __init__(self, mode: str, pace: float = 20.0) -> None:
        self.mode = mode
        self.pace = pace
        self.requests = 0
        self.prompt_tokens = 0
        self.generated = 0
        self.scrapes = 0
        self.cached = 0
        self.hits = 0
        self.base: dict[str, int] = {}  # counters_reset: what the reported counters lost at the reset
        self.last_true: dict[str, int] = {}
        self.reset_at: int | None = None  # the scrape the counters_* modes restarted their counters at
        self.last_reported: dict[str, int] = {}


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
    if mode in REDIRECT_MODES:
        return redirect(mode, number)
    if mode == "http500":
        return web.Response(status=500, body=b"")
    if mode == "http400":
        message = f"This model's maximum context length is 1024 tokens. However, you requested {prompt} tokens."
        return web.json_response({"object": "error", "message": message, "type": "BadRequestError", "param": None,
                                  "code": 400}, status=400)
    counters = mode in ("counters_reset", "counters_dip")
    if counters and number % 4 == 0:
        return web.Response(status=503, text="server overloaded, try again")
    if mode == "garbage":
        return web.Response(status=200, body=b"<html><body><h1>502 Bad Gateway</h1></body></html>",
                            content_type="text/html")
    if mode == "never_answer":
        await asyncio.Event().wait()  # holds the connection open, answers nothing
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if mode in IDLE_MODES:
        try:
            return await IDLE_MODES[mode](state, response)
        except (ConnectionError, ClientConnectionResetError):
            return response  # the harness gave up on it (its drain or a timeout): expected

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
    if counters:
        cached = prompt // 2 if number % 2 == 1 else 0
        state.cached += cached
        state.hits += cached
        if cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
    await response.write(chunk(usage=usage))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def _trickle(state: State, response: web.StreamResponse) -> web.StreamResponse:
    while True:
        for byte in chunk("t "):
            await response.write(bytes([byte]))
            await asyncio.sleep(state.pace)
        state.generated += 1


async def _all_slow(state: State, response: web.StreamResponse) -> web.StreamResponse:
    await response.write(chunk(""))
    for i in range(10_000):
        await response.write(chunk(f"t{i} "))
        state.generated += 1
        await asyncio.sleep(state.pace)
    await response.write(b"data: [DONE]\n\n")
    return response


async def _zero_tokens(state: State, response: web.StreamResponse) -> web.StreamResponse:
    await response.write(chunk(""))
    await response.write(chunk(finish="stop"))
    await response.write(chunk(usage={"prompt_tokens": 100, "completion_tokens": 0, "total_tokens": 100}))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def _keepalive_only(state: State, response: web.StreamResponse) -> web.StreamResponse:
    while True:
        await response.write(b": ping\n\n")
        await asyncio.sleep(state.pace)


IDLE_MODES = {"trickle": _trickle, "all_slow": _all_slow, "zero_tokens": _zero_tokens,
              "keepalive_only": _keepalive_only}


async def metrics(request: web.Request) -> web.Response:
    state: State = request.app["state"]
    state.scrapes += 1
    if state.mode == "redirect_probes":
        return redirect(state.mode, state.scrapes, path="/metrics")
    if state.mode == "metrics_garbage" and state.scrapes > 3:
        return web.Response(text="<html>this is not {prometheus} text\x00\n", content_type="text/plain")
    if state.mode == "metrics_bomb":
        return web.Response(body=gzip_bomb(), headers={"Content-Encoding": "gzip"}, content_type="text/plain")
    labels = f'{{model_name="{MODEL}",engine="0"}}'
    if state.mode in ("counters_reset", "counters_dip"):
        return web.Response(text=_reset_counters(state, labels), content_type="text/plain")
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


def _reset_counters(state: State, labels: str) -> str:
    true = {"prompt_tokens": state.prompt_tokens, "generation_tokens": state.generated,
            "prefix_cache_queries": state.prompt_tokens, "prefix_cache_hits": state.hits}
    last = state.last_true
    if state.reset_at is None and state.requests >= 20 and last \
            and all(0 <= true[k] - last[k] < last[k] for k in true):
        # The counters restarted just after the previous scrape, once the load is under way,
        # where the restart shows: every counter reads below its reading before.
        state.base, state.reset_at = dict(last), state.scrapes
    state.last_true = dict(true)
    reported = {k: v - state.base.get(k, 0) for k, v in true.items()}
    if state.mode == "counters_dip" and state.reset_at is not None and state.scrapes == state.reset_at + 2:
        reported = {k: max(0, state.last_reported.get(k, 0) - 1) for k in reported}  # back at the next
    state.last_reported = reported
    lines = ["# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{labels} 0",
             "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{labels} 0"]
    for key, value in reported.items():
        lines += [f"# TYPE vllm:{key} counter", f"vllm:{key}_total{labels} {value}"]
    return "\n".join(lines) + "\n"


async def version(request: web.Request) -> web.Response:
    """No /version (404) but in the counters_* modes (0.11.2) and redirect_probes (302)."""
    state: State = request.app["state"]
    if state.mode == "redirect_probes":
        return redirect("redirect_probes", 0, path="/version")
    if state.mode not in ("counters_reset", "counters_dip"):
        raise web.HTTPNotFound()
    return web.json_response({"version": "0.11.2"})


async def truth(request: web.Request) -> web.Response:
    state: State = request.app["state"]
    return web.json_response({"requests": state.requests, "prompt_tokens": state.prompt_tokens,
                              "generated": state.generated, "cached": state.cached, "hits": state.hits})


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


async def main(mode: str, port_file: str, pace: float = 20.0) -> None:
    app = web.Application()
    app["state"] = State(mode, pace)
    if mode == "metrics_bomb":
        gzip_bomb()  # made before the port is known: every scrape answers at once
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/version", version)
    app.router.add_get("/fake/truth", truth)
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


REDIRECT_MODES = ("redirect_other", "redirect_loop")


def redirect(mode: str, number: int, *, path: str = "/v1/chat/completions") -> web.Response:
    """A 307 (method and body kept: a client that follows re-sends the prompt); 302 for the probes."""
    import os

    if mode == "redirect_loop":
        location = f"{path}?n={number}"
    else:
        location = os.environ["FAKE_REDIRECT_TO"].rstrip("/") + f"{path}?n={number}"
    return web.Response(status=302 if mode == "redirect_probes" else 307, headers={"Location": location},
                        body=b"moved")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], *(float(a) for a in sys.argv[3:4])))
