"""Sending workload requests to the simulator over real HTTP, reading usage from the stream."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = REPO / "workloads"
SHARED_MOONCAKE = REPO.parent / "shared" / "data" / "mooncake" / "conversation_trace.jsonl"


async def send(session: aiohttp.ClientSession, base_url: str, turn) -> dict:
    """POST one TurnRequest, read the SSE stream to [DONE]; returns the final usage object."""
    usage = None
    async with session.post(base_url + turn.path, data=turn.body, headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                usage = chunk["usage"]
    assert usage is not None, "the stream carried no usage chunk"
    return usage


def cached_of(usage: dict) -> int:
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


async def tokenize_chat(session: aiohttp.ClientSession, base_url: str, body: bytes) -> int:
    request = json.loads(body)
    payload = {"model": request["model"], "messages": request["messages"], "add_generation_prompt": True}
    if request.get("tools"):
        payload["tools"] = request["tools"]
    async with session.post(base_url + "/tokenize", json=payload) as resp:
        assert resp.status == 200, await resp.text()
        return (await resp.json())["count"]
