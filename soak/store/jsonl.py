"""Append-and-flush JSON Lines: a harness killed with SIGKILL leaves every
complete line valid JSON (at most the last line is partial, and ``soak.jsonl``'s
readers skip it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from soak.plain import plain


def dumps(obj: Any) -> str:
    """One line of strict JSON (NaN and infinities become null)."""
    try:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str)
    except ValueError:
        return json.dumps(plain(obj), separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str)


class JsonlWriter:
    """One file, opened for append; each ``write`` is one line, flushed at once."""

    def __init__(self, path: Path, *, redact: Callable[[str], str] | None = None) -> None:
        self.path = path
        self._redact = redact
        self._file = open(path, "a", encoding="utf-8", buffering=1)  # line-buffered: flushed per line
        # Characters in the file (bytes, for ASCII JSON): close enough for a roll threshold.
        self.size = self._file.tell()
        self.lines = 0

    @property
    def closed(self) -> bool:
        return self._file.closed

    def write(self, obj: Any) -> None:
        """One line; an I/O error (disk full) is raised to the caller, who decides."""
        if self._file.closed:
            return
        line = dumps(obj)
        if self._redact is not None:
            line = self._redact(line)
        line += "\n"
        self._file.write(line)
        self.lines += 1
        self.size += len(line)

    def close(self) -> None:
        if not self._file.closed:
            try:
                self._file.close()
            except OSError:
                pass  # what could not be flushed is already reported by the write that failed
