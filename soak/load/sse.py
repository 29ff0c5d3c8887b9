"""A pure, incremental Server-Sent Events decoder: bytes in, events out, no I/O.

Modelled on httpx's ``LineDecoder``: bytes become text through an incremental
UTF-8 decoder (a multi-byte character split across chunks is held back until
it is whole; bytes that are not UTF-8 become U+FFFD), text becomes lines on
``\\n``, ``\\r\\n`` or ``\\r``, and lines become events per the WHATWG rules:
``field: value`` lines accumulate, a blank line dispatches, ``:`` starts a
comment, several ``data:`` lines join with ``\\n``, an event whose data is
empty is not dispatched.

Linear in the stream's length whatever the chunking: the unfinished line is
kept as a list of pieces and joined once, when its end arrives, so a
multi-megabyte line fed a few bytes at a time is not copied again on every
feed. A ``\\r`` that ends a chunk ends its line at once; a ``\\n`` that starts
the next chunk is then the second half of that ``\\r\\n`` and is skipped.
``work`` counts the characters the decoder scanned or copied (tests assert it
stays proportional to the input).

Lines the protocol cannot place (unknown field, a ``retry`` that is not a
number) are ignored as the spec says, but counted in ``malformed_lines`` so
the client can tell a server that is talking nonsense from one that is merely
quiet. A line or an event longer than ``max_chars`` is dropped and counted in
``oversized`` (memory stays bounded whatever the server sends).

``undecodable`` counts the U+FFFD the UTF-8 decoder made of bytes that are not
UTF-8 (a U+FFFD the server sent as its own three bytes is not counted): the
answer's text did not decode (soak.load.degenerate). Cost: a scan for U+FFFD
in each decoded piece, and more only where one is found.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

DONE = "[DONE]"
_FFFD = "\ufffd"
_FFFD_BYTES = _FFFD.encode("utf-8")
DEFAULT_MAX_CHARS = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SSEEvent:
    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None

    @property
    def is_done(self) -> bool:
        """vLLM and OpenAI end a stream with ``data: [DONE]``."""
        return self.data == DONE


class SSEDecoder:
    """Feed it chunks with ``feed(bytes)``; each call returns the events completed by it.

    ``flush()`` at end of stream returns an event left without its closing blank
    line (the spec drops it; we return it so a truncated ``[DONE]`` still counts,
    and the caller decides).
    """

    __slots__ = (
        "_utf8", "_parts", "_parts_len", "_skip_lf", "_started", "_data", "_data_len", "_event", "_id",
        "_retry", "_max", "_dropping", "malformed_lines", "comments", "oversized", "work", "_last2", "undecodable",
    )

    def __init__(self, *, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._parts: list[str] = []  # the unfinished line, in pieces
        self._parts_len = 0
        self._skip_lf = False  # the previous text ended with "\r"
        self._started = False
        self._data: list[str] = []
        self._data_len = 0
        self._event = ""
        self._id: str | None = None
        self._retry: int | None = None
        self._max = max_chars
        self._dropping = False  # the current line passed max_chars: discard until its end
        self.malformed_lines = 0
        self.comments = 0
        self.oversized = 0
        self.work = 0
        self._last2 = b""  # the previous chunk's last two bytes: a sent U+FFFD split across chunks
        self.undecodable = 0

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        text = self._utf8.decode(chunk)
        if _FFFD in text:
            self._count_undecodable(text, self._last2 + chunk)
        self._last2 = chunk[-2:] if len(chunk) >= 2 else (self._last2 + chunk)[-2:]
        return self._text(text, final=False)

    def _count_undecodable(self, text: str, raw: bytes) -> None:
        # The decoder holds back an unfinished sequence, so a U+FFFD sent whole comes
        # out with the chunk that completes it: those bytes are in ``raw``.
        self.undecodable += max(0, text.count(_FFFD) - raw.count(_FFFD_BYTES))

    def flush(self) -> list[SSEEvent]:
        tail = self._utf8.decode(b"", final=True)
        if _FFFD in tail:
            self.undecodable += tail.count(_FFFD)  # bytes held back that never became a character
        events = self._text(tail, final=True)
        if self._parts or self._dropping:
            events.extend(self._line_done(self._take_line("")))
        if self._data:
            event = self._dispatch()
            if event is not None:
                events.append(event)
        return events

    # -- text to lines ---------------------------------------------------------
    def _text(self, text: str, *, final: bool) -> list[SSEEvent]:
        if not text:
            return []
        if not self._started:
            self._started = True
            if text[0] == "\ufeff":  # a byte-order mark opening the stream is not data
                text = text[1:]
        if self._skip_lf:
            self._skip_lf = False
            if text[:1] == "\n":
                text = text[1:]
        if not text:
            return []
        self.work += len(text)
        if "\n" not in text and "\r" not in text:
            self._hold(text)
            return []
        if "\r" in text:
            if text[-1] == "\r":
                self._skip_lf = True
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n")
        events: list[SSEEvent] = []
        events.extend(self._line_done(self._take_line(lines[0])))
        for line in lines[1:-1]:
            events.extend(self._line_done(line))
        if lines[-1]:
            self._hold(lines[-1])
        return events

    def _hold(self, piece: str) -> None:
        if self._dropping:
            return
        self._parts_len += len(piece)
        if self._parts_len > self._max:
            self._parts = []
            self._parts_len = 0
            self._dropping = True
            self.oversized += 1
            return
        self._parts.append(piece)

    def _take_line(self, tail: str) -> str | None:
        """The finished line: the held pieces plus ``tail``; None when it was dropped."""
        if self._dropping:
            self._dropping = False
            return None
        if not self._parts:
            return tail
        if self._parts_len + len(tail) > self._max:
            self._parts = []
            self._parts_len = 0
            self.oversized += 1
            return None
        self._parts.append(tail)
        line = "".join(self._parts)
        self.work += len(line)
        self._parts = []
        self._parts_len = 0
        return line

    # -- lines to events -------------------------------------------------------
    def _line_done(self, line: str | None) -> list[SSEEvent]:
        if line is None:
            return []
        if not line:
            if self._data:
                event = self._dispatch()
                return [event] if event is not None else []
            self._event = ""
            return []
        if line.startswith("data:"):
            value = line[5:]
            self._add_data(value[1:] if value.startswith(" ") else value)
            return []
        if line[0] == ":":
            self.comments += 1
            return []
        name, _, value = line.partition(":")  # no colon: the line is the name
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._add_data(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._id = value
        elif name == "retry":
            # ASCII digits only ("²".isdigit() is true, and int() refuses it).
            if value.isascii() and value.isdigit():
                self._retry = int(value)
            else:
                self.malformed_lines += 1
        else:
            self.malformed_lines += 1
        return []

    def _add_data(self, value: str) -> None:
        self._data_len += len(value) + 1
        if self._data_len > self._max:
            # An event that never ends: drop what it gathered, keep memory bounded.
            self._data = []
            self._data_len = 0
            self.oversized += 1
            return
        self._data.append(value)

    def _dispatch(self) -> SSEEvent | None:
        data = "\n".join(self._data)
        self.work += len(data)
        event = self._event or "message"
        self._data = []
        self._data_len = 0
        self._event = ""
        if not data:
            return None  # the spec: an event with an empty data buffer is not dispatched
        return SSEEvent(data=data, event=event, id=self._id, retry=self._retry)
