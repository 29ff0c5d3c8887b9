"""The canaries' prompts, fixed for the night: ``oracle.short`` short texts chosen
by the run's seed, and ``oracle.long`` long ones built from the workload's own
first turns (the prefixes the load has the server cache, at the workload's own
context sizes) plus a fixed question.

Every prompt is one request body, serialized once: the same bytes every time,
so a healthy greedy server gives the same answer (near ties apart). Its
``digest`` names the request (messages, tools, max tokens, seed; not the model,
which a reference file names in its header), so a reference file's entry is
used only for the very request it was recorded from.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any, Iterable, Mapping

from soak.oracle.answer import CanaryPrompt
from soak.workload.types import CHAT_PATH

# The seed every canary asks for: greedy decoding needs none, but a server that
# samples anyway (a sampler bug, a proxy's default temperature) is then at least
# asked the same question the same way every time.
CANARY_SEED = 4049

SHORT_TEXTS: tuple[str, ...] = (
    "List the first ten prime numbers, separated by commas.",
    "Explain in two sentences what a hash table is.",
    "Write a Python function that reverses a string.",
    "What is the capital of France? Answer in one word, then give one fact about it.",
    "Translate 'the cache is warm' into German and Spanish.",
    "Count from one to twenty in words.",
    "Describe the water cycle in three short steps.",
    "Write a haiku about a server that never sleeps.",
    "Name the planets of the solar system in order from the sun.",
    "Give the SQL query that counts the rows of a table named requests.",
    "What does HTTP status 503 mean? One sentence.",
    "Summarize the rules of tic-tac-toe.",
    "Write the multiplication table of 7 up to 7 x 10.",
    "Explain what a pipeline-parallel model shard does, briefly.",
    "Spell the word 'deterministic' backwards.",
    "Convert 1024 to binary and to hexadecimal.",
)
# Asked after a long canary's cached prefix: it makes the model read that context.
LONG_QUESTION = ("Before you use any tool: in three sentences, say which file of the repository above "
                 "you would read first and why.")
# A workload in arrivals mode is scanned this far for chat requests to reuse.
MAX_ARRIVALS_SCANNED = 200


def request_body(*, model: str, messages: Iterable[Mapping[str, Any]], max_tokens: int, top_logprobs: int,
                 tools: Iterable[Mapping[str, Any]] = (), tool_choice: Any = None) -> dict[str, Any]:
    """One canary's request: non-streamed, greedy, with logprobs and alternatives."""
    body: dict[str, Any] = {"model": model, "messages": list(messages)}
    tools = list(tools)
    if tools:
        body["tools"] = tools
        if tool_choice is not None:
            body["tool_choice"] = tool_choice
    body.update({"temperature": 0, "seed": CANARY_SEED, "logprobs": True, "top_logprobs": top_logprobs,
                 "max_tokens": max_tokens, "stream": False})
    return body


def digest_of(messages: Iterable[Mapping[str, Any]], tools: Iterable[Mapping[str, Any]], *, max_tokens: int) -> str:
    canonical = json.dumps({"messages": list(messages), "tools": list(tools), "max_tokens": max_tokens,
                            "seed": CANARY_SEED}, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def short_prompts(*, count: int, seed: int, max_tokens: int) -> list[CanaryPrompt]:
    rng = random.Random(f"{seed}:canary-short")
    texts = rng.sample(SHORT_TEXTS, min(count, len(SHORT_TEXTS)))
    while len(texts) < count:  # more than the table: numbered variants, still fixed by the seed
        texts.append(f"{rng.choice(SHORT_TEXTS)} (variant {len(texts)})")
    out = []
    for i, text in enumerate(texts):
        messages = ({"role": "user", "content": text},)
        out.append(CanaryPrompt(canary_id=f"short-{i}", messages=messages, max_tokens=max_tokens, long=False,
                                digest=digest_of(messages, (), max_tokens=max_tokens)))
    return out


def _first_turn_bodies(workload: Any, count: int) -> list[tuple[dict[str, Any], int | None]]:
    """The bodies of the workload's first chat requests: each session's first turn
    (sessions mode), else its first chat arrivals. Our own bytes, parsed."""
    found: list[tuple[dict[str, Any], int | None]] = []
    if getattr(workload, "mode", None) == "sessions":
        for index in range(count):
            session = workload.new_session(index)
            turn = session.next_turn() if session is not None else None
            if turn is None:
                break
            if turn.path == CHAT_PATH:
                found.append((json.loads(turn.body), turn.planned_prompt_tokens))
        return found
    for n, arrival in enumerate(workload.arrivals()):
        if n >= MAX_ARRIVALS_SCANNED or len(found) >= count:
            break
        if arrival.request.path == CHAT_PATH:
            found.append((json.loads(arrival.request.body), arrival.request.planned_prompt_tokens))
    return found


def long_prompts(workload: Any, *, count: int, max_tokens: int
                 ) -> tuple[list[tuple[CanaryPrompt, Any]], str | None]:
    """The long canaries, each with the workload's ``tool_choice`` (None: not set),
    and a note when fewer than ``count`` could be built."""
    if count <= 0:
        return [], None
    try:
        bodies = _first_turn_bodies(workload, count)
    except Exception as exc:  # a workload that cannot say its first turns: short canaries only
        return [], f"no long canaries: the workload's first turns could not be read ({type(exc).__name__}: {exc})"
    out = []
    for i, (body, planned) in enumerate(bodies):
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            continue
        messages = (*messages, {"role": "user", "content": LONG_QUESTION})
        tools = tuple(body.get("tools") or ())
        prompt = CanaryPrompt(canary_id=f"long-{i}", messages=messages, max_tokens=max_tokens, long=True,
                              approx_prompt_tokens=planned, tools=tools,
                              digest=digest_of(messages, tools, max_tokens=max_tokens))
        out.append((prompt, body.get("tool_choice")))
    note = None if len(out) >= count else (
        f"{len(out)} of {count} long canaries: the workload has no more chat first turns to reuse")
    return out, note


def body_of(prompt: CanaryPrompt, *, model: str, top_logprobs: int, tool_choice: Any = None) -> bytes:
    return json.dumps(request_body(model=model, messages=prompt.messages, max_tokens=prompt.max_tokens,
                                   top_logprobs=top_logprobs, tools=prompt.tools, tool_choice=tool_choice),
                      ensure_ascii=False, separators=(",", ":")).encode("utf-8")
