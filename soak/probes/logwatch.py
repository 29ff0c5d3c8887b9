"""The log watcher: a few lines of tailing I/O around the pure line parser.

``soak.logsignatures.parse_log_line(line)`` knows the signatures of FACTS.md and
returns a ``LogMatch`` (signature, fatal, parsed fields) or None. ``LogTailer``
reads the lines appended to a file since the last call (following truncation and
rotation, bounded per call), and ``LogProbe`` turns matches into LogSamples.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from soak.clock import Clock
from soak.logsignatures import parse_log_line, strip_ansi
from soak.samples import LogSample


class LogTailer:
    """Lines appended to ``path`` since the previous call; at most ``max_bytes`` a call."""

    def __init__(self, path: str | Path, *, from_start: bool = True, max_bytes: int = 1 << 20) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._offset: int | None = 0 if from_start else None
        self._inode: int | None = None
        self._partial = b""

    def read_lines(self) -> list[str]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return []
        if self._offset is None:  # start at the end of what is there now
            self._offset, self._inode = st.st_size, st.st_ino
            return []
        if self._inode is not None and st.st_ino != self._inode or st.st_size < self._offset:
            self._offset, self._partial = 0, b""  # rotated or truncated
        self._inode = st.st_ino
        if st.st_size == self._offset:
            return []
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            chunk = fh.read(self.max_bytes)
        self._offset += len(chunk)
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        if len(self._partial) > self.max_bytes:  # a runaway line: hand it on in pieces
            lines.append(self._partial)
            self._partial = b""
        return [raw.decode("utf-8", "replace").rstrip("\r") for raw in lines]


class LogProbe:
    name = "log"

    def __init__(self, path: str | Path, *, clock: Clock, interval_s: float = 0.1, from_start: bool = True) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._tailer = LogTailer(path, from_start=from_start)

    async def collect(self) -> list[LogSample]:
        lines = await asyncio.to_thread(self._tailer.read_lines)
        now = self._clock.now()
        out = []
        for line in lines:
            match = parse_log_line(line)
            if match is not None:
                out.append(LogSample(now, match.signature, strip_ansi(line), match.fatal, dict(match.fields)))
        return out

    async def aclose(self) -> None:
        pass
