"""The simulator's OpenAI endpoints: /v1/models, /v1/completions, /v1/chat/completions
(whole and streamed as SSE), /tokenize and /detokenize, as vLLM 0.11 serves them."""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from soak.tokens import chat, tokenizer
from soak.sim import logprobs as lp_format
from soak.sim.engine import SimRequest
from soak.sim.greedy import prompt_digest
from soak.sim.prefix_cache import block_hashes, text_block_hashes
from soak.sim.server import ApiError, RequestStream, SimServer, bad_request, server_of

_STREAM_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


async def json_body(request: web.Request) -> dict:
    try:
        body = await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    return body


def _check_model(server: SimServer, body: dict) -> str:
    model = body.get("model", server.config.model)
    if model != server.config.model:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    return model


def _check_alive(server: SimServer) -> None:
    if server.dead:
        raise ApiError(500, "EngineCore encountered an issue. See stack trace (above) for the root cause.", "InternalServerError")


def _int_field(body: dict, name: str, default: int | None = None, minimum: int = 0) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise bad_request(f"{name} must be an integer >= {minimum}", name)
    return value


def _chat_sections(body: dict, *, add_generation_prompt: bool = True) -> list[str]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise bad_request("messages must be a list of objects", "messages")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request("tools must be a list", "tools")
    return chat.render_sections(messages, tools, add_generation_prompt=body.get("add_generation_prompt", add_generation_prompt))


def _completion_prompt(body: dict) -> list[str]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.pieces(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        try:
            return [tokenizer.decode([t]) for t in prompt]
        except ValueError as exc:
            raise bad_request(str(exc), "prompt") from exc
    raise bad_request("prompt must be a string, a list of token ids, or a list with one of them", "prompt")


def _usage(server: SimServer, req: SimRequest) -> dict:
    """vLLM's UsageInfo as serialized (unset fields left out). 0.11.x writes
    ``prompt_tokens_details`` only with --enable-prompt-tokens-details and only
    when some token was cached; 0.33 writes it whenever the flag is on."""
    claimed = server.claims.completion_claim(req.output_tokens)  # fault lying_usage: not what was streamed
    usage: dict[str, Any] = {
        "prompt_tokens": req.prompt_tokens,
        "total_tokens": req.prompt_tokens + claimed,
        "completion_tokens": claimed,
    }
    if server.config.enable_prompt_tokens_details and (
        req.cached_tokens > 0 or not server.config.profile.cached_tokens_omitted_when_zero
    ):
        usage["prompt_tokens_details"] = {"cached_tokens": req.cached_tokens}
    return usage


async def handle_models(request: web.Request) -> web.Response:
    c = server_of(request).config
    created = int(server_of(request).started_wall)
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": c.model,
                    "object": "model",
                    "created": created,
                    "owned_by": "vllm",
                    "root": c.model,
                    "parent": None,
                    "max_model_len": c.max_model_len,
                    "permission": [],
                }
            ],
        }
    )


async def handle_tokenize(request: web.Request) -> web.Response:
    server = server_of(request)
    try:
        body = await json_body(request)
        _check_model(server, body)
        if "messages" in body:
            text = "".join(_chat_sections(body))
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            raise bad_request("give prompt (a string) or messages", "prompt")
    except ApiError as exc:
        return exc.response()
    tokens = tokenizer.encode(text)
    return web.json_response(
        {"count": len(tokens), "max_model_len": server.config.max_model_len, "tokens": tokens, "token_strs": None}
    )


async def handle_detokenize(request: web.Request) -> web.Response:
    server = server_of(request)
    try:
        body = await json_body(request)
        _check_model(server, body)
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise bad_request("tokens must be a list of token ids", "tokens")
        try:
            text = tokenizer.decode(tokens)
        except (ValueError, TypeError) as exc:
            raise bad_request(str(exc), "tokens") from exc
    except ApiError as exc:
        return exc.response()
    return web.json_response({"prompt": text})


async def handle_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat_form=False)


async def handle_chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat_form=True)


async def _generate(request: web.Request, *, chat_form: bool) -> web.StreamResponse:
    server = server_of(request)
    try:
        body = await json_body(request)
        model = _check_model(server, body)
        _check_alive(server)
        top_k = lp_format.requested(body, chat_form=chat_form)
        streamed = bool(body.get("stream"))
        cached = server.claims.replayed(chat_form, streamed)
        if cached is not None:  # fault replay: the same bytes again, no work done
            return await _replay(request, cached, streamed)
        if chat_form:  # the memo: a turn's earlier messages are cut once, not at every turn
            prompt_tokens, text, bounds = server.section_memo.cut(_chat_sections(body), every=server.config.block_size)
            hashes = text_block_hashes(text, bounds)
        else:
            pieces = _completion_prompt(body)
            prompt_tokens, hashes = len(pieces), block_hashes(pieces, server.config.block_size)
            text = "".join(pieces)
        max_tokens = _int_field(body, "max_completion_tokens" if chat_form and "max_completion_tokens" in body else "max_tokens", None, 1)
        min_tokens = _int_field(body, "min_tokens", 0) or 0
        stream_opts = body.get("stream_options")
        # StreamOptions.include_usage defaults to true in 0.11.2 and false in 0.33,
        # when stream_options is given at all; without it there is no usage chunk.
        if isinstance(stream_opts, dict):
            include_usage = bool(stream_opts.get("include_usage", server.config.profile.include_usage_default))
        else:
            stream_opts, include_usage = {}, False
        stream = server.new_request(
            prompt_tokens=prompt_tokens,
            hashes=hashes,
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            ignore_eos=bool(body.get("ignore_eos", False)),
            prefix="chatcmpl" if chat_form else "cmpl",
            digest=prompt_digest(text),
            logprobs=top_k,
        )
    except ApiError as exc:
        return exc.response()
    model = server.claims.shown_model(model)  # fault other_model: the answers name another
    try:
        if streamed:
            return await _stream_response(
                request, server, stream, model, chat_form,
                include_usage=include_usage,
                continuous_usage=bool(include_usage and stream_opts.get("continuous_usage_stats")),
            )
        return await _full_response(server, stream, model, chat_form)
    finally:
        server.forget(stream)


async def _replay(request: web.Request, cached: bytes, streamed: bool) -> web.StreamResponse:
    if not streamed:
        return web.Response(body=cached, content_type="application/json", charset="utf-8")
    resp = web.StreamResponse(status=200, headers=_STREAM_HEADERS)
    await resp.prepare(request)
    await resp.write(cached)
    await resp.write_eof()
    return resp


async def _full_response(server: SimServer, stream: RequestStream, model: str, chat_form: bool) -> web.Response:
    req = stream.req
    while True:
        d = await stream.queue.get()
        if d is None:
            return ApiError(500, "EngineCore encountered an issue.", "InternalServerError").response()
        if d.finished:
            break
    text = req.output_text(0, req.output_tokens)
    created = int(time.time())
    k, tie = req.logprobs, server.engine.tie_threshold
    if chat_form:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": None, "tool_calls": [], "reasoning_content": None},
            "logprobs": None if k is None else {"content": lp_format.chat_content(req, 0, req.output_tokens, k, tie)},
            "finish_reason": req.finish_reason,
            "stop_reason": None,
        }
        obj = "chat.completion"
    else:
        logprobs = None if k is None else lp_format.completion_logprobs(req, 0, req.output_tokens, k, tie, 0)
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": req.finish_reason, "stop_reason": None}
        obj = "text_completion"
    data = json.dumps(
        {"id": req.request_id, "object": obj, "created": created, "model": model, "choices": [choice], "usage": _usage(server, req)}
    ).encode()
    server.claims.record(chat_form, False, data)
    return web.Response(body=data, content_type="application/json", charset="utf-8")


async def _stream_response(
    request: web.Request, server: SimServer, stream: RequestStream, model: str, chat_form: bool, *,
    include_usage: bool, continuous_usage: bool = False,
) -> web.StreamResponse:
    req = stream.req
    resp = web.StreamResponse(status=200, headers=_STREAM_HEADERS)
    await resp.prepare(request)
    created = int(time.time())
    obj = "chat.completion.chunk" if chat_form else "text_completion"
    head = f'{{"id":"{req.request_id}","object":"{obj}","created":{created},"model":{json.dumps(model)},"choices":['
    dumps = json.dumps
    sent = chars = 0
    k, tie = req.logprobs, server.engine.tie_threshold
    recorded: list[bytes] | None = [] if server.claims.recording(chat_form, True) else None
    while True:
        d = await stream.queue.get()
        if d is None:  # the engine died under us: vLLM ends the stream with an error event
            err = {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause.", "type": "InternalServerError", "param": None, "code": 500}}
            await resp.write(f"data: {dumps(err)}\n\ndata: [DONE]\n\n".encode())
            return resp
        text = req.output_text(sent, d.new_tokens)
        lps = "null"
        if k is not None:
            lps = dumps({"content": lp_format.chat_content(req, sent, d.new_tokens, k, tie)} if chat_form
                        else lp_format.completion_logprobs(req, sent, d.new_tokens, k, tie, chars))
            chars += len(text)
        sent += d.new_tokens
        finish = dumps(req.finish_reason) if d.finished else "null"
        tail = "]}\n\n"
        if continuous_usage:  # vLLM's continuous_usage_stats: running usage on every chunk
            claimed = server.claims.completion_claim(sent)
            running = {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens + claimed, "completion_tokens": claimed}
            tail = f'],"usage":{dumps(running)}}}\n\n'
        parts = []
        if chat_form:
            if d.first:
                parts.append(f'data: {head}{{"index":0,"delta":{{"role":"assistant","content":""}},"logprobs":null,"finish_reason":null}}{tail}')
            parts.append(f'data: {head}{{"index":0,"delta":{{"content":{dumps(text)}}},"logprobs":{lps},"finish_reason":{finish}}}{tail}')
        else:
            parts.append(f'data: {head}{{"index":0,"text":{dumps(text)},"logprobs":{lps},"finish_reason":{finish},"stop_reason":null}}{tail}')
        if d.finished:
            if include_usage:
                parts.append(f"data: {head}],\"usage\":{dumps(_usage(server, req))}}}\n\n")
            parts.append("data: [DONE]\n\n")
        data = "".join(parts).encode()
        if recorded is not None:
            recorded.append(data)
        await resp.write(data)
        if d.finished:
            if recorded is not None:
                server.claims.record(chat_form, True, b"".join(recorded))
            await resp.write_eof()
            return resp
