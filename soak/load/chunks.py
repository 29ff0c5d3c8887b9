"""What one SSE event of an OpenAI-style stream says, from any text a server sends.

``interpret(data)`` is pure and total over strings: it returns a ``Chunk`` or
raises ``MalformedStream`` (the event cannot be read as a completion chunk) or
``StreamErrorObject`` (the server put an ``error`` object in the stream). No
other exception leaves it, whatever the bytes: the client records either as the
request's outcome and the soak goes on.

What is refused and what is tolerated (a demanding reading of vLLM and OpenAI):
- refused (``malformed_stream``): not JSON, not a JSON object, ``choices`` that
  is not a list, a choice that is not an object, a ``delta`` that is not an
  object, a content field (``content``, ``reasoning_content``, ``reasoning``,
  ``text``) that is not a string, ``tool_calls`` that is not a list. A chunk we
  cannot read cannot be counted, so the stream is not trusted after it.
- tolerated, noted as an anomaly on the request: ``usage`` that is not an
  object, token counts that are not plain non-negative integers below 2**31
  (numbers as strings, floats, booleans, huge ints), a ``finish_reason`` that is
  not a string. The count falls back to what the client saw itself.
- ``null`` anywhere stands for "absent", as OpenAI's own chunks use it.

What is generated content (the one definition; ``measure``): a non-empty
content string (``content``, ``reasoning_content``, ``reasoning``, ``text``) or
a tool call carrying a non-empty function name or arguments. An empty tool-call
delta (``[{}]``, an id or a type alone) is not. Whitespace counts per chunk (it
is legitimate between words, and moves the stall clock), but each chunk also
says whether any of its text is not whitespace (``substantive``): a request
whose whole output is whitespace produced nothing, decided by the client at
the request's end. ``text_bytes`` (UTF-8 bytes of that text) bounds the token
count a server may claim for it (``counted_tokens``).

``ContentTemplate`` is the cheap path for the common chunk (issue 16): after a
content chunk has been read in full, later chunks that are byte-identical to it
except for a plain content string (no quote, backslash or control character)
are the same shape by construction and are counted without ``json.loads``.
Anything else, odd or not, takes the full path above.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from soak.bounds import loads_json
from soak.errors import MalformedStream, StreamErrorObject
from soak.printable import printable
from soak.redact import clip

# A token count past this is not a count any server produced.
MAX_COUNT = 2**31 - 1
_CONTENT_FIELDS = ("content", "reasoning_content", "reasoning")
_PREVIEW = 80
MODEL_CHARS = 200  # a model name past this is cut (printable's ellipsis marks it)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    # prompt_tokens_details was there but unreadable: unknown, whatever the version
    # says about a missing field (soak.versions.cached_tokens reads the absent case).
    cached_unreadable: bool = False


@dataclass(frozen=True, slots=True)
class Chunk:
    content: int = 0  # choices in this chunk that carry generated output
    finish_reason: str | None = None
    usage: Usage | None = None
    anomalies: tuple[str, ...] = ()
    text_bytes: int = 0  # UTF-8 bytes of the generated text in this chunk (names and arguments included)
    substantive: bool = False  # some of that text is not whitespace
    text: str = ""  # that text, joined (what soak.load.degenerate reads)
    model: str | None = None  # the chunk's ``model`` when it is a string, made printable and bounded


def measure(text: str) -> tuple[int, bool]:
    """One piece of generated text: its UTF-8 bytes, and whether it is more than
    whitespace. The ASCII case (nearly every chunk) without an encode."""
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    return size, bool(text) and not text.isspace()


def counted_tokens(claimed: int | None, *, chunks: int, text_bytes: int, events: int,
                   max_tokens: int | None) -> tuple[int, str | None]:
    """The output tokens a request is counted for, and why the server's claim was
    refused (None when it was not).

    ``claimed``: ``usage.completion_tokens`` (None: none sent); ``chunks``: the
    content chunks the client saw (a lower bound: speculative decoding puts
    several tokens in one); ``text_bytes``: UTF-8 bytes of generated text
    received; ``events``: data events received; ``max_tokens``: the request's
    (None or < 1: not set).

    The bound: every tokenizer vLLM serves is byte-level (BPE, or SentencePiece
    with byte fallback), so a token that decodes to text decodes to at least one
    byte of it. Tokens that decode to none (EOS, special tokens, a tool-call
    marker the server strips) are a few per request: one per event covers them
    (the finish chunk, the usage chunk and the role chunk alone give three); text
    a tool-call parser holds back comes out later as the call's name and
    arguments. No server generates past the request's ``max_tokens``. A claim
    above the bound is not a count: the client's own count, capped the same way,
    stands instead, an undercount at worst, never an inflation."""
    ceiling = text_bytes + events
    if max_tokens is not None and max_tokens >= 1:
        ceiling = min(ceiling, max_tokens)
    if claimed is None:
        if chunks > ceiling:
            return ceiling, f"{chunks} content chunks, more than the request's max_tokens {ceiling}"
        return chunks, None
    if claimed > ceiling:
        why = (f"usage.completion_tokens {claimed} refused: {text_bytes} byte(s) of generated text in {events} "
               f"event(s) hold at most {text_bytes + events} token(s)")
        if max_tokens is not None and max_tokens >= 1:
            why += f", and max_tokens is {max_tokens}"
        return min(chunks, ceiling), why
    return claimed, None


def preview(text: str) -> str:
    return repr(text[:_PREVIEW]) + ("..." if len(text) > _PREVIEW else "")


def _count(value: Any, where: str, anomalies: list[str]) -> int | None:
    if value is None:
        return None
    if type(value) is int and 0 <= value <= MAX_COUNT:
        return value
    anomalies.append(f"{where} is not a token count: {preview(json.dumps(value) if _dumpable(value) else repr(value))}")
    return None


def _dumpable(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool, type(None)))


def _usage(value: Any, anomalies: list[str]) -> Usage | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        anomalies.append(f"usage is not an object: {type(value).__name__}")
        return None
    details = value.get("prompt_tokens_details")
    cached = None
    unreadable = False
    if isinstance(details, dict):
        raw = details.get("cached_tokens")
        cached = _count(raw, "usage.prompt_tokens_details.cached_tokens", anomalies)
        unreadable = raw is not None and cached is None
    elif details is not None:
        anomalies.append("usage.prompt_tokens_details is not an object")
        unreadable = True
    return Usage(
        prompt_tokens=_count(value.get("prompt_tokens"), "usage.prompt_tokens", anomalies),
        completion_tokens=_count(value.get("completion_tokens"), "usage.completion_tokens", anomalies),
        cached_tokens=cached,
        cached_unreadable=unreadable,
    )


def _error_message(err: Any) -> str:
    if isinstance(err, dict):
        message = err.get("message")
        if message is None:
            message = err
    else:
        message = err
    text = message if isinstance(message, str) else json.dumps(message, default=str)[:4000]
    return clip(text, 200)


def _call_text(call: Any) -> list[str]:
    """The generated text of one tool-call delta: its function's name and
    arguments when they are strings. An id, a type or an index alone is none."""
    if not isinstance(call, dict):
        return []
    function = call.get("function")
    if not isinstance(function, dict):
        return []
    return [v for v in (function.get("name"), function.get("arguments")) if isinstance(v, str) and v]


def _has_content(choice: dict[str, Any], data: str, pieces: list[str]) -> tuple[bool, int, bool]:
    """Whether this choice carries generated content, its text's bytes, and
    whether any of that text is not whitespace (see ``measure``); the text
    itself goes to ``pieces``."""
    found = substantive = False
    size = 0

    def add(text: str) -> None:
        nonlocal found, substantive, size
        if text:
            found = True
            pieces.append(text)
            more, solid = measure(text)
            size += more
            substantive = substantive or solid

    delta = choice.get("delta")
    if delta is not None:
        if not isinstance(delta, dict):
            raise MalformedStream(f"choices[].delta is not an object: {preview(data)}")
        for name in _CONTENT_FIELDS:
            value = delta.get(name)
            if value is None:
                continue
            if not isinstance(value, str):
                raise MalformedStream(f"choices[].delta.{name} is not a string: {preview(data)}")
            add(value)
        calls = delta.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise MalformedStream(f"choices[].delta.tool_calls is not a list: {preview(data)}")
            # A tool call is output only by what it says: a name or arguments.
            for call in calls:
                for text in _call_text(call):
                    add(text)
    text = choice.get("text")
    if text is not None:
        if not isinstance(text, str):
            raise MalformedStream(f"choices[].text is not a string: {preview(data)}")
        add(text)
    return found, size, substantive


def interpret(data: str) -> Chunk:
    """One event's data (not ``[DONE]``) as a ``Chunk``; see the module docstring."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested past the parser's depth
        raise MalformedStream(f"chunk is not JSON: {preview(data)}") from None
    if not isinstance(obj, dict):
        raise MalformedStream(f"chunk is not a JSON object: {preview(data)}")
    err = obj.get("error")
    if err is not None:
        raise StreamErrorObject(f"server error in stream: {_error_message(err)}")
    anomalies: list[str] = []
    content = size = 0
    substantive = False
    pieces: list[str] = []
    finish: str | None = None
    choices = obj.get("choices")
    if choices is not None:
        if not isinstance(choices, list):
            raise MalformedStream(f"choices is not a list: {preview(data)}")
        for choice in choices:
            if not isinstance(choice, dict):
                raise MalformedStream(f"a choice is not an object: {preview(data)}")
            found, more, solid = _has_content(choice, data, pieces)
            if found:
                content += 1
                size += more
                substantive = substantive or solid
            reason = choice.get("finish_reason")
            if isinstance(reason, str):
                if reason:
                    finish = reason[:64]
            elif reason is not None:
                anomalies.append(f"finish_reason is not a string: {type(reason).__name__}")
    usage = _usage(obj.get("usage"), anomalies)
    model = obj.get("model")
    return Chunk(content=content, finish_reason=finish, usage=usage, anomalies=tuple(anomalies), text_bytes=size,
                 substantive=substantive, text="".join(pieces),
                 model=printable(model, limit=MODEL_CHARS) if isinstance(model, str) and model else None)


class ContentTemplate:
    """The raw text around the content string of the stream's plain content chunk.

    ``learn(data, chunk)`` after a full read; ``content_of(data)`` then returns,
    with string operations only, the content string when ``data`` is that chunk
    with another plain, non-empty content string (None otherwise): then it is one
    content choice, no finish reason and no usage, with that text (``measure``),
    exactly as the full read would have said. ``matches(data)``: whether it is.
    """

    __slots__ = ("_prefix", "_suffix", "_min_len")

    def __init__(self) -> None:
        self._prefix: str | None = None
        self._suffix = ""
        self._min_len = 0

    @property
    def learned(self) -> bool:
        return self._prefix is not None

    def learn(self, data: str, chunk: Chunk) -> None:
        if chunk.content != 1 or chunk.finish_reason is not None or chunk.usage is not None or chunk.anomalies:
            return
        # The raw text must be built the way a template can be checked: the one
        # content string, plain (so its raw form is itself), once in the text.
        for field in ('"content":"', '"text":"', '"content": "', '"text": "'):
            start = data.find(field)
            if start < 0 or data.find(field, start + 1) >= 0:
                continue
            begin = start + len(field)
            end = data.find('"', begin)
            if end <= begin:
                continue
            value = data[begin:end]
            if "\\" in value or not value.isprintable():
                continue
            # A later chunk equal to this one but for another plain string here
            # parses to the same choices, finish reason and usage.
            self._prefix, self._suffix = data[:begin], data[end:]
            self._min_len = len(self._prefix) + len(self._suffix) + 1
            return

    def content_of(self, data: str) -> str | None:
        prefix = self._prefix
        if prefix is None or len(data) < self._min_len:
            return None
        if not (data.startswith(prefix) and data.endswith(self._suffix)):
            return None
        middle = data[len(prefix) : len(data) - len(self._suffix)]
        return middle if '"' not in middle and "\\" not in middle and middle.isprintable() else None

    def matches(self, data: str) -> bool:
        return self.content_of(data) is not None


# A usage claim agrees with the tokens streamed within this: a factor for
# tokenizer edges, plus a few tokens that decode to no text (EOS, special tokens).
CLAIM_FACTOR = 1.1
CLAIM_SLACK = 2


def claim_disagrees(claimed: int, streamed: int) -> bool:
    """Whether a usage claim is outside the tolerance around ``streamed``:
    ``claimed > streamed * 1.1 + 2`` or ``claimed < streamed / 1.1 - 2``."""
    return claimed > streamed * CLAIM_FACTOR + CLAIM_SLACK or claimed < streamed / CLAIM_FACTOR - CLAIM_SLACK


def usage_disagreement(claimed: int | None, *, streamed: int | None, chunks: int) -> str | None:
    """The anomaly note for a usage claim that disagrees with what was streamed,
    with both figures; None when it agrees or there is no claim.

    ``streamed``: the tokens of the text received, counted by a tokenizer exact
    for the target (None: no such counter, or the text was too long to keep).
    Without it the client knows only a lower bound, ``chunks`` (each content
    chunk holds at least one token; several under speculative decoding or when
    the server merges deltas): then only a claim below it is a disagreement. An
    over-claim is then left to the judge, which holds the claims against the
    server's own counters."""
    if claimed is None:
        return None
    if streamed is not None:
        if claim_disagrees(claimed, streamed):
            return f"usage claims {claimed} completion tokens, {streamed} were streamed"
        return None
    if claimed < chunks / CLAIM_FACTOR - CLAIM_SLACK:
        return f"usage claims {claimed} completion tokens, at least {chunks} were streamed (content chunks)"
    return None


def error_body_message(body: bytes) -> str:
    """An HTTP error body (its first bytes) as one bounded line: the error's message when it is JSON."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        obj = loads_json(text)  # bounded nesting: an error body of "[[[[" is text, not a RecursionError
    except ValueError:
        return clip(text, 200)
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            return clip(str(err.get("message", err)), 200)
        return clip(str(obj.get("message", err)), 200)
    return clip(text, 200)
