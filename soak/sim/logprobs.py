"""Logprobs in vLLM's two formats, whole and streamed, from the positions' states.

- chat (``logprobs: true``, ``top_logprobs: k``):
  ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}``;
  a streamed delta chunk carries ``{"content": [...]}`` for its own tokens.
- completions (``logprobs: k``): ``{"tokens", "token_logprobs", "top_logprobs":
  [{token: logprob}], "text_offset"}``; each ``top_logprobs`` entry holds the top
  k and the sampled token (k + 1 where it is not among them), as vLLM's does;
  ``text_offset`` counts characters from the start of the generated text.

Without the request fields an answer carries ``logprobs: null``. Bad values are
HTTP 400 as vLLM gives them (``top_logprobs`` without ``logprobs: true``, a
negative count, more than ``MAX_LOGPROBS``).
"""

from __future__ import annotations

from typing import Any

from soak.sim.greedy import MAX_TOP_LOGPROBS, WORDS, distribution, logprob_of
from soak.sim.server import bad_request

MAX_LOGPROBS = MAX_TOP_LOGPROBS  # vLLM's default --max-logprobs
_BYTES = tuple(list(w.encode()) for w in WORDS)


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"`{name}` must be an integer", name)
    if value < 0:
        raise bad_request(f"`{name}` must be a positive value.", name)
    if value > MAX_LOGPROBS:
        raise bad_request(f"Requested sample logprobs of {value}, which is greater than max allowed: {MAX_LOGPROBS}", name)
    return value


def requested(body: dict, *, chat_form: bool) -> int | None:
    """The top alternatives asked per position, or None (no logprobs)."""
    if chat_form:
        on = body.get("logprobs")
        if on is not None and not isinstance(on, bool):
            raise bad_request("`logprobs` must be a boolean", "logprobs")
        top = body.get("top_logprobs")
        k = 0 if top is None else _count(top, "top_logprobs")
        if k > 0 and not on:
            raise bad_request("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
        return k if on else None
    value = body.get("logprobs")
    return None if value is None else _count(value, "logprobs")


def _positions(req, start: int, n: int, k: int, threshold: int):
    for p in range(start, start + n):
        tok, s = req.tokens[p], req.dists[p]
        dist = distribution(s, k, threshold)
        yield tok, logprob_of(tok, dist, s, threshold), dist[:k]


def chat_content(req, start: int, n: int, k: int, threshold: int) -> list[dict[str, Any]]:
    return [
        {"token": WORDS[tok], "logprob": lp, "bytes": _BYTES[tok],
         "top_logprobs": [{"token": WORDS[t], "logprob": v, "bytes": _BYTES[t]} for t, v in top]}
        for tok, lp, top in _positions(req, start, n, k, threshold)
    ]


def completion_logprobs(req, start: int, n: int, k: int, threshold: int, offset: int) -> dict[str, Any]:
    """``offset``: characters of generated text before position ``start``."""
    tokens, lps, tops, offsets = [], [], [], []
    for tok, lp, top in _positions(req, start, n, k, threshold):
        tokens.append(WORDS[tok])
        lps.append(lp)
        entry = {WORDS[t]: v for t, v in top}
        entry.setdefault(WORDS[tok], lp)
        tops.append(entry)
        offsets.append(offset)
        offset += len(WORDS[tok])
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def text_chars(req, n: int) -> int:
    """Characters of the first ``n`` generated tokens."""
    return sum(len(WORDS[t]) for t in req.tokens[:n])
