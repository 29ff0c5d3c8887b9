"""Text from outside made safe for a terminal and a one-line record: the one filter.

A worker's process title, a py-spy frame's path, a server's Location header: the
server chose those bytes. Printed raw, an ESC starts a terminal control sequence
(it can move the cursor, rewrite earlier lines of the incident summary, retitle
the window), a carriage return or newline forges a line of the harness's own, and
a bidirectional override (U+202E) shows a path reversed. ``printable`` replaces
every character Python does not call printable (the C0 and C1 controls, DEL, the
format characters that include the bidi overrides, line and paragraph separators)
with ``?`` and bounds the length.

Invariant: ``printable(text)`` has no character for which ``str.isprintable`` is
False, is at most ``limit`` characters plus the ellipsis, and leaves printable
text of that length unchanged.
"""

from __future__ import annotations

ELLIPSIS = "..."


def printable(text: str, *, limit: int | None = None) -> str:
    if not text.isprintable():
        text = "".join(c if c.isprintable() else "?" for c in text)
    if limit is not None and len(text) > limit:
        return text[:limit] + ELLIPSIS
    return text


__all__ = ["printable"]
