"""Every input from outside is bounded, here: bytes, decompressed bytes, lines,
nesting, whole files, and the total time of an outbound call.

Invariant: whatever a server, a file or a device sends, a reader either returns
data that lies within ``Limits`` or raises ``InputRejected`` (``BoundExceeded``
when a bound was hit, naming it). It never holds more than the bound in memory,
never recurses past it, and never waits past its total time.

Callers turn the error into their own recorded outcome: a line of a run
directory skipped and counted, a ``ConfigError`` naming the file and line, a
failed sample naming the bound. Nothing here reads the clock for logic other
than the deadline it is asked to hold, nor any setting from the environment.
"""

from __future__ import annotations

import asyncio
import json
import re
import zlib
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import IO, Any, Awaitable, Iterator, Mapping, TypeVar

from soak.errors import SoakError

T = TypeVar("T")

KiB = 1024
MiB = 1024 * KiB


class Bound(str, Enum):
    LINE_BYTES = "line_bytes"
    BODY_BYTES = "body_bytes"
    NESTING = "nesting_depth"
    FILE_BYTES = "file_bytes"
    YAML_ALIASES = "yaml_aliases"
    TOTAL_TIME = "total_time"


@dataclass(frozen=True)
class Limits:
    """The bounds, passed to every reader (``LIMITS`` unless a caller needs others)."""

    # One JSONL line: a replayed request with a long history is a few hundred KB.
    line_bytes: int = 16 * MiB
    # One HTTP body after decompression (and on the wire): a vLLM /metrics is
    # tens to hundreds of KB; parsing much more would stall the event loop.
    body_bytes: int = 4 * MiB
    # JSON and YAML nesting: real records nest under 20; Python's parsers
    # recurse, and so does everything that walks what they return.
    depth: int = 128
    # A file read whole (summary.json, incident.json, a flight-recorder dump).
    file_bytes: int = 256 * MiB
    # A YAML file (a config, a workload): PyYAML parses a few MB a second.
    yaml_bytes: int = 4 * MiB
    # YAML aliases in one document: a "billion laughs" expands on every walk.
    yaml_aliases: int = 1000
    # gzip members in one body: each restarts the inflater.
    gzip_members: int = 64


LIMITS = Limits()


def _size(n: float) -> str:
    if n >= MiB and n % MiB == 0:
        return f"{n // MiB:g} MiB"
    if n >= KiB and n % KiB == 0:
        return f"{n // KiB:g} KiB"
    return f"{n:g} bytes"


_SAY = {
    Bound.LINE_BYTES: lambda limit: f"a line longer than {_size(limit)} (bound line_bytes)",
    Bound.BODY_BYTES: lambda limit: f"a body larger than {_size(limit)} once decompressed (bound body_bytes)",
    Bound.NESTING: lambda limit: f"nested deeper than {limit:g} levels (bound nesting_depth)",
    Bound.FILE_BYTES: lambda limit: f"a file larger than {_size(limit)} (bound file_bytes)",
    Bound.YAML_ALIASES: lambda limit: f"more than {limit:g} YAML aliases (bound yaml_aliases)",
    Bound.TOTAL_TIME: lambda limit: f"no complete answer within {limit:g}s in total (bound total_time)",
}


class InputRejected(SoakError, ValueError):
    """Input from outside that cannot be read (not JSON, not YAML, bad compressed
    data) or that passed a bound. ``line`` is the line where known. A ValueError
    too, so a reader that skips unparseable input skips this as well."""

    exit_code = 2

    def __init__(self, message: str, *, line: int | None = None) -> None:
        self.message = message
        self.line = line
        super().__init__(message)


class BoundExceeded(InputRejected):
    """A bound was hit: ``bound`` names it, ``limit`` is its value."""

    def __init__(self, bound: Bound, limit: float, *, line: int | None = None, what: str = "") -> None:
        self.bound = bound
        self.limit = limit
        said = _SAY[bound](limit)
        super().__init__(f"{what}: {said}" if what else said, line=line)


# ---------------------------------------------------------------- lines


class OverlongLine(bytes):
    """What ``iter_lines`` yields in place of a line past the bound: empty bytes
    carrying the ``BoundExceeded`` to raise or count."""

    error: BoundExceeded


def overlong(limit: int, number: int) -> OverlongLine:
    marker = OverlongLine(b"")
    marker.error = BoundExceeded(Bound.LINE_BYTES, limit, line=number)
    return marker


def iter_lines(handle: IO[bytes], *, limit: int = LIMITS.line_bytes, skip_limit: int = LIMITS.file_bytes,
               chunk: int = 1 * MiB) -> Iterator[tuple[int, bytes]]:
    """``(line number, raw line with its newline)`` for every line of a binary
    handle, holding at most ``limit`` bytes: a longer line is yielded as an
    ``OverlongLine`` (before any more of it is read, so a caller that raises
    never reads on, e.g. into /dev/zero) and the rest of it discarded. A line
    that goes on past ``skip_limit`` ends the reading: nothing follows it that
    could be reached in bounded time (a device, a FIFO that never ends a line)."""
    readline = handle.readline
    number = 0
    while True:
        raw = readline(limit + 1)
        if not raw:
            return
        number += 1
        if len(raw) <= limit or raw.endswith(b"\n"):
            yield number, raw
            continue
        yield number, overlong(limit, number)
        skipped = len(raw)
        while True:  # the rest of the long line, a chunk at a time
            rest = readline(chunk)
            skipped += len(rest)
            if not rest or rest.endswith(b"\n"):
                break
            if skipped > skip_limit:
                return


def read_file(path: str | Path, *, limit: int = LIMITS.file_bytes) -> bytes:
    """A whole file, at most ``limit`` bytes (a device such as /dev/zero
    included); ``OSError`` as ``open`` raises it, for the caller to name."""
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise BoundExceeded(Bound.FILE_BYTES, limit)
    return data


# ---------------------------------------------------------------- JSON

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")


def json_depth(data: bytes) -> int:
    """The deepest nesting of brackets outside strings in ``data`` (a JSON text);
    linear, no recursion."""
    brackets = _NOT_BRACKET.sub(b"", _STRING.sub(b"", data))
    depth = deepest = 0
    for byte in brackets:
        if byte in b"[{":
            depth += 1
            if depth > deepest:
                deepest = depth
        else:
            depth -= 1
    return deepest


def loads_json(data: bytes | str, *, max_depth: int = LIMITS.depth) -> Any:
    """``json.loads`` that never recurses past ``max_depth``; anything that is
    not JSON (or not UTF-8) is ``InputRejected``, deeper nesting ``BoundExceeded``."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    # No value nests deeper than it has brackets: most lines never need the scan.
    if raw.count(b"[") + raw.count(b"{") > max_depth and json_depth(raw) > max_depth:
        raise BoundExceeded(Bound.NESTING, max_depth)
    try:
        # Decoded here, not by json.loads: its encoding sniffing costs a fifth of a parse.
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputRejected(f"not UTF-8 text: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise InputRejected(f"invalid JSON: {exc.msg}", line=exc.lineno) from exc
    except RecursionError as exc:  # the scan's count is exact; this is the last resort
        raise BoundExceeded(Bound.NESTING, max_depth) from exc
    except ValueError as exc:  # e.g. an integer too long to convert
        raise InputRejected(f"invalid JSON: {exc}") from exc


def read_json_file(path: str | Path, *, limits: Limits = LIMITS) -> Any:
    """A whole JSON file under the file and nesting bounds; ``OSError`` or ``InputRejected``."""
    return loads_json(read_file(path, limit=limits.file_bytes), max_depth=limits.depth)


def value_depth(value: Any, *, stop: int) -> int:
    """The nesting depth of a parsed value (lists, tuples, dicts), counted
    without recursion and given up past ``stop``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (list, tuple, dict)):
            if depth > deepest:
                deepest = depth
                if deepest > stop:
                    return deepest
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


# ---------------------------------------------------------------- YAML

_BOUNDED_LOADERS: dict[type, type] = {}


def _bounded_loader(base: type) -> type:
    """``base`` (a PyYAML loader class) whose composer counts depth and aliases."""
    found = _BOUNDED_LOADERS.get(base)
    if found is not None:
        return found
    import yaml

    class Bounded(base):  # type: ignore[misc, valid-type]
        max_depth = LIMITS.depth
        max_aliases = LIMITS.yaml_aliases
        _depth = 0
        _aliases = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                self._aliases += 1
                if self._aliases > self.max_aliases:
                    mark = self.peek_event().start_mark
                    raise BoundExceeded(Bound.YAML_ALIASES, self.max_aliases, line=mark.line + 1)
            self._depth += 1
            try:
                if self._depth > self.max_depth:
                    mark = self.peek_event().start_mark
                    raise BoundExceeded(Bound.NESTING, self.max_depth, line=mark.line + 1)
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

    Bounded.__name__ = f"Bounded{base.__name__}"
    _BOUNDED_LOADERS[base] = Bounded
    return Bounded


def load_yaml(text: str | bytes, *, loader: type | None = None, limits: Limits = LIMITS) -> Any:
    """One YAML document, composed no deeper than ``limits.depth`` and with at
    most ``limits.yaml_aliases`` aliases. ``loader``: a SafeLoader or a subclass
    (the default). Anything else wrong is ``InputRejected`` with the line."""
    import yaml

    if len(text) > limits.yaml_bytes:
        raise BoundExceeded(Bound.FILE_BYTES, limits.yaml_bytes)
    cls = _bounded_loader(loader or yaml.SafeLoader)
    instance = None
    try:
        instance = cls(text)  # the reader checks the characters here already
        instance.max_depth = limits.depth
        instance.max_aliases = limits.yaml_aliases
        return instance.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise InputRejected(f"invalid YAML: {exc.problem or exc.context}",
                            line=mark.line + 1 if mark else None) from exc
    except yaml.YAMLError as exc:
        raise InputRejected(f"invalid YAML: {exc}") from exc
    except RecursionError as exc:  # the composer's count holds first; this is the last resort
        raise BoundExceeded(Bound.NESTING, limits.depth) from exc
    except (ValueError, TypeError, OverflowError) as exc:
        if isinstance(exc, InputRejected):
            raise
        raise InputRejected(f"invalid YAML: {type(exc).__name__}: {exc}") from exc
    finally:
        if instance is not None:
            instance.dispose()


# ---------------------------------------------------------------- HTTP bodies

_IDENTITY = {"", "identity"}
_GZIP = {"gzip", "x-gzip"}


def content_codings(header: str | None) -> tuple[str, ...]:
    """The codings of a Content-Encoding header, in the order they were applied."""
    if not header:
        return ()
    return tuple(c for c in (part.strip().lower() for part in header.split(",")) if c not in _IDENTITY)


class BodyDecoder:
    """Undoes a Content-Encoding chunk by chunk, producing at most ``limit``
    bytes (and reading at most ``limit`` from the wire): a bomb stops at the
    bound, having inflated no more than it. Pure: bytes in, bytes out."""

    def __init__(self, content_encoding: str | None, *, limit: int = LIMITS.body_bytes,
                 max_members: int = LIMITS.gzip_members) -> None:
        codings = content_codings(content_encoding)
        if len(codings) > 1 or (codings and codings[0] not in _GZIP | {"deflate"}):
            raise InputRejected(f"unsupported Content-Encoding {content_encoding!r} (the harness reads "
                                "identity, gzip or deflate)")
        self.coding = codings[0] if codings else ""
        self.limit = limit
        self.max_members = max_members
        self.produced = 0
        self.received = 0
        self._members = 0
        self._inflater: Any = None
        self._ended = False  # the last member's end was seen

    def _new_inflater(self, first: bytes) -> Any:
        self._members += 1
        if self._members > self.max_members:
            raise InputRejected(f"more than {self.max_members} gzip members in one body")
        if self.coding == "deflate":
            # RFC 1950 says zlib-wrapped; servers often send raw deflate (RFC 1951).
            return zlib.decompressobj(zlib.MAX_WBITS if first[:1] and first[0] & 0x0F == 8 else -zlib.MAX_WBITS)
        return zlib.decompressobj(16 + zlib.MAX_WBITS)

    def _take(self, out: bytes) -> bytes:
        self.produced += len(out)
        if self.produced > self.limit:
            raise BoundExceeded(Bound.BODY_BYTES, self.limit)
        return out

    def feed(self, chunk: bytes) -> bytes:
        self.received += len(chunk)
        if self.received > self.limit:
            raise BoundExceeded(Bound.BODY_BYTES, self.limit)
        if not self.coding:
            return self._take(bytes(chunk))
        pieces: list[bytes] = []
        data = bytes(chunk)
        while data:
            if self._inflater is None or self._inflater.eof:
                if self._inflater is not None and self.coding == "deflate":
                    break  # deflate has one stream; what trails it is not body
                self._inflater = self._new_inflater(data)
            room = self.limit - self.produced
            try:
                # room + 1: producing one byte more than fits is how the bound is seen
                out = self._inflater.decompress(data, room + 1)
            except zlib.error as exc:
                raise InputRejected(f"bad {self.coding} data: {exc}") from exc
            pieces.append(self._take(out))
            data = self._inflater.unused_data if self._inflater.eof else b""
        return b"".join(pieces)

    def finish(self) -> bytes:
        if self.coding and (self._inflater is None or not self._inflater.eof):
            if self._inflater is None and self.received == 0:
                return b""  # an empty body stays empty, whatever the header says
            raise InputRejected(f"{self.coding} body cut short")
        return b""


def decode_body(data: bytes, content_encoding: str | None, *, limit: int = LIMITS.body_bytes) -> bytes:
    """A whole body through ``BodyDecoder``."""
    decoder = BodyDecoder(content_encoding, limit=limit)
    return decoder.feed(data) + decoder.finish()


async def read_body(response: Any, *, limit: int = LIMITS.body_bytes) -> bytes:
    """The body of an aiohttp response fetched with ``auto_decompress=False``,
    decoded per its Content-Encoding, at most ``limit`` bytes either way."""
    decoder = BodyDecoder(response.headers.get("Content-Encoding"), limit=limit)
    pieces = []
    async for chunk in response.content.iter_chunked(64 * KiB):
        pieces.append(decoder.feed(chunk))
    pieces.append(decoder.finish())
    return b"".join(pieces)


async def within(total_s: float, awaitable: Awaitable[T], *, what: str = "") -> T:
    """``awaitable``, or ``BoundExceeded(total_time)`` once ``total_s`` has passed,
    whatever it was doing (a byte every few seconds resets no timer here)."""
    try:
        return await asyncio.wait_for(awaitable, total_s)
    except asyncio.TimeoutError as exc:
        raise BoundExceeded(Bound.TOTAL_TIME, total_s, what=what) from exc


@dataclass(frozen=True)
class Fetched:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self, *, max_depth: int = LIMITS.depth) -> Any:
        return loads_json(self.body, max_depth=max_depth)


async def fetch(session: Any, url: str, *, total_s: float, method: str = "GET", limits: Limits = LIMITS,
                **request: Any) -> Fetched:
    """One outbound call, bounded: its total time (connect, headers and every
    byte of the body) by ``total_s``, its body by ``limits.body_bytes``
    decompressed. ``session`` is a ``soak.net`` session, so a 3xx is
    ``RedirectRefused`` and never followed. Raises ``BoundExceeded`` or
    ``InputRejected`` for the bounds, and what aiohttp raises for the connection
    (``aiohttp.ClientError``, ``OSError``)."""
    import aiohttp

    async def call() -> Fetched:
        async with session.request(method, url, auto_decompress=False,
                                   timeout=aiohttp.ClientTimeout(total=None, sock_connect=total_s),
                                   **request) as resp:
            body = await read_body(resp, limit=limits.body_bytes)
            return Fetched(resp.status, resp.headers.copy(), body)

    return await within(total_s, call(), what=f"{method} {url}")


__all__ = [
    "Bound", "BodyDecoder", "BoundExceeded", "Fetched", "InputRejected", "LIMITS", "Limits", "OverlongLine",
    "content_codings", "decode_body", "fetch", "iter_lines", "json_depth", "load_yaml", "loads_json",
    "read_body", "read_file", "read_json_file", "value_depth", "within",
]
