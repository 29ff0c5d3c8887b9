"""One greedy answer as the oracle reads it: its tokens, each with the server's
logprob and top alternatives, read from vLLM's two logprob formats.

- chat (``logprobs: true, top_logprobs: k``):
  ``choices[0].logprobs.content = [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]``
- completions (``logprobs: k``):
  ``choices[0].logprobs = {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: logprob}, ...]}``

Readers are total: a body that is not one of these shapes reads as an
``Answer`` with ``malformed`` set, never an exception (the server's bytes are
hostile). A logprob that is not a finite number reads as None.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

# A token's text is bounded: a server that sends a megabyte "token" is malformed.
MAX_TOKEN_CHARS = 256
# Alternatives kept per position (vLLM caps top_logprobs at 20).
MAX_ALTERNATIVES = 20


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:  # an int past a float's range (JSON allows 1 followed by 400 zeros)
        return None
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class TokenChoice:
    """One generated position: the token chosen, its logprob, and the top
    alternatives the server listed there (the chosen one may be among them)."""

    token: str
    logprob: float | None = None
    top: tuple[tuple[str, float], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"token": self.token, "logprob": self.logprob, "top": [list(t) for t in self.top]}

    @classmethod
    def from_json(cls, obj: Any) -> "TokenChoice | None":
        if not isinstance(obj, Mapping) or not isinstance(obj.get("token"), str):
            return None
        top = []
        raw = obj.get("top")
        for item in raw if isinstance(raw, list) else ():
            if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str):
                lp = _finite(item[1])
                if lp is not None:
                    top.append((item[0][:MAX_TOKEN_CHARS], lp))
        return cls(obj["token"][:MAX_TOKEN_CHARS], _finite(obj.get("logprob")), tuple(top[:MAX_ALTERNATIVES]))


@dataclass(frozen=True)
class Answer:
    """A canary's answer: the positions, the text, how it finished and which
    model the server said it was. ``malformed`` names what could not be read
    (then ``tokens`` holds what could)."""

    tokens: tuple[TokenChoice, ...] = ()
    text: str = ""
    finish_reason: str | None = None
    model: str | None = None
    malformed: str | None = None

    @property
    def token_texts(self) -> tuple[str, ...]:
        return tuple(t.token for t in self.tokens)

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens": [t.to_json() for t in self.tokens],
            "text": self.text,
            "finish_reason": self.finish_reason,
            "model": self.model,
            "malformed": self.malformed,
        }

    @classmethod
    def from_json(cls, obj: Any) -> "Answer":
        if not isinstance(obj, Mapping):
            return cls(malformed="not an object")
        tokens = []
        raw = obj.get("tokens")
        for item in raw if isinstance(raw, list) else ():
            choice = TokenChoice.from_json(item)
            if choice is None:
                return cls(tuple(tokens), malformed="a token that is not a token")
            tokens.append(choice)
        text = obj.get("text")
        finish = obj.get("finish_reason")
        model = obj.get("model")
        malformed = obj.get("malformed")
        return cls(
            tuple(tokens),
            text if isinstance(text, str) else "",
            finish if isinstance(finish, str) else None,
            model if isinstance(model, str) else None,
            malformed if isinstance(malformed, str) else None,
        )


def _top_of_chat(items: Any) -> tuple[tuple[str, float], ...]:
    out: list[tuple[str, float]] = []
    for alt in items if isinstance(items, list) else ():
        if isinstance(alt, Mapping) and isinstance(alt.get("token"), str):
            lp = _finite(alt.get("logprob"))
            if lp is not None:
                out.append((alt["token"][:MAX_TOKEN_CHARS], lp))
    return tuple(out[:MAX_ALTERNATIVES])


def _top_of_completion(item: Any) -> tuple[tuple[str, float], ...]:
    out: list[tuple[str, float]] = []
    if isinstance(item, Mapping):
        for tok, lp in item.items():
            value = _finite(lp)
            if isinstance(tok, str) and value is not None:
                out.append((tok[:MAX_TOKEN_CHARS], value))
    out.sort(key=lambda t: -t[1])
    return tuple(out[:MAX_ALTERNATIVES])


def answer_from_body(body: Any) -> Answer:
    """A whole (non-streamed) chat or completions response body, parsed JSON, as an Answer."""
    if not isinstance(body, Mapping):
        return Answer(malformed="the body is not a JSON object")
    model = body.get("model") if isinstance(body.get("model"), str) else None
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return Answer(model=model, malformed="no choices")
    choice = choices[0]
    finish = choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None
    message = choice.get("message")
    if isinstance(message, Mapping):
        text = message.get("content") if isinstance(message.get("content"), str) else ""
    else:
        text = choice.get("text") if isinstance(choice.get("text"), str) else ""
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, Mapping):
        return Answer((), text, finish, model, malformed="no logprobs")
    tokens: list[TokenChoice] = []
    content = logprobs.get("content")
    if isinstance(content, list):  # chat
        for item in content:
            if not isinstance(item, Mapping) or not isinstance(item.get("token"), str):
                return Answer(tuple(tokens), text, finish, model, malformed="a logprobs entry without a token")
            tokens.append(TokenChoice(item["token"][:MAX_TOKEN_CHARS], _finite(item.get("logprob")),
                                      _top_of_chat(item.get("top_logprobs"))))
        return Answer(tuple(tokens), text, finish, model)
    toks, lps, tops = logprobs.get("tokens"), logprobs.get("token_logprobs"), logprobs.get("top_logprobs")
    if isinstance(toks, list):  # completions
        lps = lps if isinstance(lps, list) else []
        tops = tops if isinstance(tops, list) else []
        for i, tok in enumerate(toks):
            if not isinstance(tok, str):
                return Answer(tuple(tokens), text, finish, model, malformed="a token that is not a string")
            tokens.append(TokenChoice(tok[:MAX_TOKEN_CHARS], _finite(lps[i]) if i < len(lps) else None,
                                      _top_of_completion(tops[i]) if i < len(tops) else ()))
        return Answer(tuple(tokens), text, finish, model)
    return Answer((), text, finish, model, malformed="logprobs of an unknown shape")


@dataclass(frozen=True)
class CanaryPrompt:
    """What a canary asks, fixed for the night: the same request every time, so
    every answer of a healthy greedy server is the reference (near ties apart).

    ``messages`` is a chat conversation (the workload's own prefix for a long
    canary); ``digest`` identifies the prompt in a reference file."""

    canary_id: str
    messages: tuple[Mapping[str, Any], ...]
    max_tokens: int
    long: bool = False
    approx_prompt_tokens: int | None = None
    tools: tuple[Mapping[str, Any], ...] = field(default=())
    digest: str = ""
