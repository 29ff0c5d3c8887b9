"""A pure, incremental Server-Sent Events decoder: bytes in, events out, no I/O.

Modelled on httpx's ``LineDecoder``: bytes become text through an incremental
UTF-8 decoder (a multi-byte character split across chunks is held back until
it is whole), text becomes lines on ``\\n``, ``\\r\\n`` or ``\\r`` (a ``\\r`` at
the end of a chunk is held back, since the next chunk may start with the
``\\n`` that completes it), and lines become events per the WHATWG rules:
``field: value`` lines accumulate, a blank line dispatches, ``:`` starts a
comment, several ``data:`` lines join with ``\\n``.

Lines the protocol cannot place (no colon, unknown field) are ignored as the
spec says, but counted in ``malformed_lines`` so the client can tell a server
that is talking nonsense from one that is merely quiet.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

DONE = "[DONE]"


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

    __slots__ = ("_utf8", "_pending", "_data", "_event", "_id", "_retry", "malformed_lines", "comments")

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._retry: int | None = None
        self.malformed_lines = 0
        self.comments = 0

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        text = self._utf8.decode(chunk)
        if not text:
            return []
        return self._lines(self._pending + text, final=False)

    def flush(self) -> list[SSEEvent]:
        text = self._pending + self._utf8.decode(b"", final=True)
        self._pending = ""
        events = self._lines(text, final=True) if text else []
        if self._data:
            events.append(self._dispatch())
        return events

    def _lines(self, text: str, *, final: bool) -> list[SSEEvent]:
        if not final and text.endswith("\r"):
            # The "\r" may be the first half of "\r\n": hold its line back.
            lines = text[:-1].replace("\r\n", "\n").replace("\r", "\n").split("\n")
            self._pending = lines[-1] + "\r"
            complete = lines[:-1]
        else:
            if "\r" in text:
                text = text.replace("\r\n", "\n").replace("\r", "\n")
            lines = text.split("\n")
            self._pending = "" if final else lines[-1]
            complete = lines if final else lines[:-1]
        if final and complete and complete[-1] == "":
            complete = complete[:-1]
        events: list[SSEEvent] = []
        for line in complete:
            if not line:
                if self._data:
                    events.append(self._dispatch())
                else:
                    self._event = ""
                continue
            if line.startswith("data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(" ") else value)
                continue
            if line[0] == ":":
                self.comments += 1
                continue
            name, _, value = line.partition(":")  # no colon: the line is the name
            if value.startswith(" "):
                value = value[1:]
            if name == "data":
                self._data.append(value)
            elif name == "event":
                self._event = value
            elif name == "id":
                if "\0" not in value:
                    self._id = value
            elif name == "retry":
                if value.isdigit():
                    self._retry = int(value)
                else:
                    self.malformed_lines += 1
            else:
                self.malformed_lines += 1
        return events

    def _dispatch(self) -> SSEEvent:
        event = SSEEvent(
            data="\n".join(self._data),
            event=self._event or "message",
            id=self._id,
            retry=self._retry,
        )
        self._data = []
        self._event = ""
        return event
