"""Every input from outside is bounded, here: bytes, decompressed bytes, lines,
nesting, whole files, and the total time of an outbound call.

Invariant: whatever a server, a file or a device sends, a reader either returns
data that lies within ``Limits`` or raises ``InputRejected`` (``BoundExceeded``
when a bound was hit, naming it). It never holds more than the bound in memory,
never recurses past it, and never waits past its total time. A file is opened
by ``open_input``, which never waits either: a FIFO, socket or directory where
a file should be is ``NotRegularFile`` (an ``OSError`` too), at once.

Callers turn the error into their own recorded outcome: a line of a run
directory skipped and counted, a ``ConfigError`` naming the file and line, a
failed sample naming the bound. Nothing here reads the clock for logic other
than the deadline it is asked to hold, nor any setting from the environment.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import math
import os
import re
import stat
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
    VALUE_NODES = "value_nodes"
    INFLATED_BYTES = "inflated_bytes"


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
    # Values in one decoded structure, counted as a walk meets them (shared
    # objects once per reference): a pickle's memo lets 300 bytes name 1e10
    # values, and every walk (depth, repr, matching) pays the expanded count. A
    # flight-recorder dump of 2000 entries with their frames holds under a
    # million; this leaves room for rings several times larger and walks in a second.
    value_nodes: int = 4 * MiB
    # One gzip file of a run directory once inflated (a sample segment): a
    # segment rolls at 4 MiB plus at most one line (``line_bytes``, 16 MiB); a 4 MB
    # file of zeros inflates to gigabytes.
    inflated_bytes: int = 32 * MiB


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
    Bound.VALUE_NODES: lambda limit: f"more than {limit:.0f} values once shared references are expanded "
                                     "(bound value_nodes)",
    Bound.INFLATED_BYTES: lambda limit: f"more than {_size(limit)} once decompressed (bound inflated_bytes)",
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


class NotRegularFile(InputRejected, OSError):
    """A path read as a file that is a FIFO, a socket, a directory or a device
    (one a reader may not take). An ``OSError`` too, so every caller that names
    an unreadable file names this one the same way; ``strerror`` says what it is."""

    def __init__(self, path: str | Path, kind: str) -> None:
        super().__init__(f"{path}: not a regular file ({kind})")
        self.filename = str(path)
        self.strerror = f"not a regular file ({kind})"


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


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return "not a file"


class _DeviceIO(io.FileIO):
    """A character device read without ever waiting: a read that would block
    (a terminal, a device with nothing to give) is ``NotRegularFile``."""

    path = ""

    def readinto(self, buffer: Any) -> int:
        got = super().readinto(buffer)
        if got is None:
            raise NotRegularFile(self.path, "a device with nothing to read now")
        return got


def open_input(path: str | Path, *, devices: bool = True) -> IO[bytes]:
    """``path`` opened for reading in binary, never waiting to open or to read:
    it is opened non-blocking (a FIFO with no writer would block ``open`` for
    ever) and the opened descriptor's type checked. A regular file reads as
    usual; a character device (``/dev/zero``) only with ``devices`` and then
    still non-blocking; a FIFO, socket, directory or block device is
    ``NotRegularFile`` naming it. Other ``OSError`` as ``open`` raises it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode):
            os.set_blocking(fd, True)
            return os.fdopen(fd, "rb")
        if devices and stat.S_ISCHR(mode):
            raw = _DeviceIO(fd, "rb", closefd=True)
            raw.path = str(path)
            return io.BufferedReader(raw)
        raise NotRegularFile(path, _kind(mode))
    except BaseException:
        os.close(fd)
        raise


def read_file(path: str | Path, *, limit: int = LIMITS.file_bytes, devices: bool = True) -> bytes:
    """A whole file, at most ``limit`` bytes (a device such as /dev/zero
    included unless ``devices`` is false), opened by ``open_input`` (a FIFO or
    directory is ``NotRegularFile``); ``OSError`` as ``open`` raises it, for
    the caller to name."""
    with open_input(path, devices=devices) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise BoundExceeded(Bound.FILE_BYTES, limit)
    return data


class _Capped(io.RawIOBase):
    """What ``inner`` gives, raising ``BoundExceeded(inflated_bytes)`` once more
    than ``limit`` bytes came out; closes ``inner`` and ``below`` with itself."""

    def __init__(self, inner: Any, limit: int, below: Any = None) -> None:
        super().__init__()
        self._inner = inner
        self._below = below
        self.limit = limit
        self.produced = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        room = self.limit + 1 - self.produced
        view = memoryview(buffer)
        if room < len(view):
            view = view[:max(room, 1)]
        got = self._inner.readinto(view)
        self.produced += got
        if self.produced > self.limit:
            raise BoundExceeded(Bound.INFLATED_BYTES, self.limit)
        return got

    def close(self) -> None:
        try:
            self._inner.close()
            if self._below is not None:
                self._below.close()
        finally:
            super().close()


def open_gzip_input(path: str | Path, *, limit: int = LIMITS.inflated_bytes, devices: bool = False) -> IO[bytes]:
    """A gzip file opened by ``open_input`` and inflated as it is read, at most
    ``limit`` bytes out: past that a read raises ``BoundExceeded(inflated_bytes)``
    (having inflated no more than the bound). Bad gzip data raises what
    ``gzip`` raises (``OSError``, ``EOFError``, ``zlib.error``)."""
    handle = open_input(path, devices=devices)
    try:
        inflating = gzip.GzipFile(fileobj=handle, mode="rb")
    except BaseException:
        handle.close()
        raise
    return io.BufferedReader(_Capped(inflating, limit, below=handle))


# ---------------------------------------------------------------- JSON

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
# What a number that overflows a float (past 1.8e308) needs: a positive
# exponent of three digits or more, or (with an exponent of two at most) a run
# of 200 digits. Only a text that has one pays for checking every float (found
# by translate and substring tests: a regular expression's character classes
# cost a third of the parse).
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789E", b"000000000e")
_RUN = b"0" * 200


def _maybe_huge(raw: bytes) -> bool:
    flat = raw.translate(_DIGITS_AS_ZERO)
    return b"e000" in flat or b"e+000" in flat or _RUN in flat


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


def _no_constant(name: str) -> Any:
    raise InputRejected(f"invalid JSON: {name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InputRejected(f"invalid JSON: {text[:40]} is out of range for a number")
    return value


# Built once: json.loads with any keyword builds a decoder per call.
_DECODER = json.JSONDecoder(parse_constant=_no_constant)
_CHECKING_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float)


def loads_json(data: bytes | str, *, max_depth: int = LIMITS.depth) -> Any:
    """``json.loads`` that never recurses past ``max_depth``; anything that is
    not JSON (or not UTF-8) is ``InputRejected``, deeper nesting ``BoundExceeded``.
    Every number is finite: ``NaN``, ``Infinity`` and ``1e999`` (which Python's
    parser takes) are ``InputRejected``."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    # No value nests deeper than it has brackets: most lines never need the scan.
    if raw.count(b"[") + raw.count(b"{") > max_depth and json_depth(raw) > max_depth:
        raise BoundExceeded(Bound.NESTING, max_depth)
    try:
        # Decoded here, not by json.loads: its encoding sniffing costs a fifth of a parse.
        text = raw.decode("utf-8")
        return (_CHECKING_DECODER if _maybe_huge(raw) else _DECODER).decode(text)
    except InputRejected:
        raise
    except UnicodeDecodeError as exc:
        raise InputRejected(f"not UTF-8 text: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise InputRejected(f"invalid JSON: {exc.msg}", line=exc.lineno) from exc
    except RecursionError as exc:  # the scan's count is exact; this is the last resort
        raise BoundExceeded(Bound.NESTING, max_depth) from exc
    except ValueError as exc:  # e.g. an integer too long to convert
        raise InputRejected(f"invalid JSON: {exc}") from exc


def read_json_file(path: str | Path, *, limits: Limits = LIMITS, devices: bool = True) -> Any:
    """A whole JSON file under the file and nesting bounds; ``OSError`` or ``InputRejected``."""
    return loads_json(read_file(path, limit=limits.file_bytes, devices=devices), max_depth=limits.depth)


def value_depth(value: Any, *, stop: int, max_nodes: int = LIMITS.value_nodes) -> int:
    """The nesting depth of a parsed value (lists, tuples, sets, dicts: keys
    and values), counted without recursion and given up past ``stop``. Every
    value met counts towards ``max_nodes`` once per reference (a shared object
    as often as it is shared, as every later walk meets it): past that,
    ``BoundExceeded(value_nodes)``, having walked no more than the bound."""
    deepest = 0
    nodes = 1
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (list, tuple, dict, set, frozenset)):
            if depth > deepest:
                deepest = depth
                if deepest > stop:
                    return deepest
            nodes += 2 * len(node) if isinstance(node, dict) else len(node)
            if nodes > max_nodes:
                raise BoundExceeded(Bound.VALUE_NODES, max_nodes)
            if isinstance(node, dict):
                stack.extend((child, depth + 1) for child in node.keys())
                stack.extend((child, depth + 1) for child in node.values())
            else:
                stack.extend((child, depth + 1) for child in node)
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
    "Bound", "BodyDecoder", "BoundExceeded", "Fetched", "InputRejected", "LIMITS", "Limits", "NotRegularFile",
    "OverlongLine", "content_codings", "decode_body", "fetch", "iter_lines", "json_depth", "load_yaml", "loads_json",
    "open_gzip_input", "open_input", "read_body", "read_file", "read_json_file", "value_depth", "within",
]
