"""Token counters: how the workload learns exact prompt sizes before load starts.

``TokenCounter`` implementations, best first:

- ``TargetCounter``: the target's ``POST /tokenize`` (chat form with the same
  messages and tools, completion form for text); exact for that server.
- ``SimCounter``: the simulator's tokenizer and chat template, in process; exact
  when the target is the simulator.
- ``LocalTokenizerCounter``: a ``tokenizers`` tokenizer.json; the text is exact,
  chat framing comes from the simulator's template (say so in the label).
- ``EstimateCounter``: characters / ``chars_per_token``, labelled an estimate.

Counters with ``in_process = True`` are cheap enough to count every corpus line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

from soak.bounds import LIMITS, MiB, InputRejected, fetch
from soak.errors import TransportError, WorkloadError

TOKENIZE_LIMITS = dataclasses.replace(LIMITS, body_bytes=64 * MiB)


class TokenCounter(Protocol):
    label: str
    in_process: bool

    async def count_chat(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None, *, add_generation_prompt: bool = True
    ) -> int: ...

    async def count_text(self, text: str) -> int: ...


class SimCounter:
    label = "exact (simulator tokenizer)"
    in_process = True
    additive = True  # count(a + b) == count(a) + count(b) whenever a ends with a newline

    def __init__(self) -> None:
        from soak.tokens import chat, tokenizer

        self._chat = chat
        self._tokenizer = tokenizer

    async def count_chat(self, messages, tools=None, *, add_generation_prompt: bool = True) -> int:
        return self._tokenizer.count(self._chat.render_chat(messages, tools, add_generation_prompt=add_generation_prompt))

    async def count_text(self, text: str) -> int:
        return self._tokenizer.count(text)

    def count_text_sync(self, text: str) -> int:
        return self._tokenizer.count(text)


class LocalTokenizerCounter:
    label = "exact (local tokenizer; chat framing from the simulator template)"
    in_process = True

    def __init__(self, path: str | Path, *, config_path: str | Path | None = None) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise WorkloadError("needs the tokenizers package (pip install soak[tokenizers])", path=config_path, field="tokenizer.path") from exc
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises plain Exception subclasses
            raise WorkloadError(f"cannot load tokenizer.json: {exc}", path=config_path, field="tokenizer.path") from exc
        from soak.tokens import chat

        self._chat = chat

    def count_text_sync(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    async def count_chat(self, messages, tools=None, *, add_generation_prompt: bool = True) -> int:
        return self.count_text_sync(self._chat.render_chat(messages, tools, add_generation_prompt=add_generation_prompt))

    async def count_text(self, text: str) -> int:
        return self.count_text_sync(text)


class EstimateCounter:
    in_process = True

    def __init__(self, chars_per_token: float = 4.0) -> None:
        self.chars_per_token = chars_per_token
        self.label = f"estimate ({chars_per_token:g} characters a token; not exact)"

    def count_text_sync(self, text: str) -> int:
        return max(0, round(len(text) / self.chars_per_token))

    async def count_chat(self, messages, tools=None, *, add_generation_prompt: bool = True) -> int:
        text = json.dumps(list(tools or []), ensure_ascii=False) if tools else ""
        total = self.count_text_sync(text)
        for message in messages:
            total += 4 + self.count_text_sync(json.dumps(message.get("content") or "", ensure_ascii=False))
            if message.get("tool_calls"):
                total += self.count_text_sync(json.dumps(message["tool_calls"], ensure_ascii=False))
        return total + (3 if add_generation_prompt else 0)

    async def count_text(self, text: str) -> int:
        return self.count_text_sync(text)


class TargetCounter:
    """The target's ``/tokenize`` over aiohttp; give it a session it does not own, or let it make one."""

    label = "exact (target /tokenize)"
    in_process = False

    def __init__(self, base_url: str, model: str, *, session: Any = None, headers: Mapping[str, str] | None = None, timeout_s: float = 60.0) -> None:
        self._url = base_url.rstrip("/") + "/tokenize"
        self._model = model
        self._session = session
        self._owns_session = session is None
        self._headers = dict(headers or {})
        self._timeout_s = timeout_s
        self.calls = 0

    async def _post(self, payload: dict[str, Any]) -> int:
        import aiohttp

        if self._session is None:
            from soak import net

            self._session = net.session(total_s=self._timeout_s)  # a 3xx fails the count, never followed
        self.calls += 1
        try:
            # The token list of a long prompt is megabytes: a wider body bound than a probe's.
            response = await fetch(self._session, self._url, method="POST", json=payload, headers=self._headers,
                                   total_s=self._timeout_s, limits=TOKENIZE_LIMITS)
            if response.status != 200:
                raise TransportError(f"/tokenize answered HTTP {response.status}: {response.text()[:200]}")
            return int(response.json()["count"])
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise TransportError(f"/tokenize failed: {exc}") from exc
        except InputRejected as exc:  # a bound hit (total time, bytes) or a body that is not JSON
            raise TransportError(f"/tokenize: {exc}") from exc
        except (ValueError, KeyError, TypeError, OverflowError) as exc:
            raise TransportError(f"/tokenize answered something without a count: {exc}") from exc

    async def count_chat(self, messages, tools=None, *, add_generation_prompt: bool = True) -> int:
        payload: dict[str, Any] = {"model": self._model, "messages": list(messages), "add_generation_prompt": add_generation_prompt}
        if tools:
            payload["tools"] = list(tools)
        return await self._post(payload)

    async def count_text(self, text: str) -> int:
        return await self._post({"model": self._model, "prompt": text, "add_special_tokens": False})

    async def aclose(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
        self._session = None


def make_counter(
    tokenizer_config: Any,
    *,
    target_is_simulator: bool,
    base_url: str | None = None,
    model: str = "",
    session: Any = None,
    headers: Mapping[str, str] | None = None,
    config_path: str | Path | None = None,
) -> TokenCounter:
    """The counter a workload's ``tokenizer:`` section asks for.

    ``auto``: the simulator's own tokenizer when the target is the simulator
    (exact, no server needed, so ``soak validate`` can use it), else the
    target's ``/tokenize`` when a base URL is known, else an estimate.
    ``headers`` (an Authorization header from the API key) go with /tokenize.
    """
    kind = getattr(tokenizer_config, "kind", "auto")
    if kind == "local":
        return LocalTokenizerCounter(tokenizer_config.path, config_path=config_path)
    if kind == "estimate":
        return EstimateCounter(tokenizer_config.chars_per_token)
    if kind == "target":
        if base_url is None:
            if target_is_simulator:
                return SimCounter()
            return EstimateCounter()
        return TargetCounter(base_url, model, session=session, headers=headers)
    if target_is_simulator:
        return SimCounter()
    if base_url is not None:
        return TargetCounter(base_url, model, session=session, headers=headers)
    return EstimateCounter()
