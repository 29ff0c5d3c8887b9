"""Sample files that roll into gzip segments, so a 24-hour soak stays small.

Layout in the run directory, oldest first::

    samples-000.jsonl.gz   closed segments: gzip of whole JSON lines
    samples-001.jsonl.gz
    samples.jsonl          the open segment: plain JSONL, flushed per line

A short run never rolls and has ``samples.jsonl`` alone, as before. Every file
reads with ``zcat``/``jq`` (``zcat -f samples-*.jsonl.gz samples.jsonl | jq``).

Rolling is safe against SIGKILL at every step, so every complete line is read
back exactly once whenever the harness dies:

1. rename ``samples.jsonl`` to ``samples-NNN.jsonl`` (closed, still plain) and
   open a fresh ``samples.jsonl``;
2. in a worker thread, gzip ``samples-NNN.jsonl`` into a temporary file and rename
   that to ``samples-NNN.jsonl.gz`` (``soak.fsio``: it appears complete or not at all);
3. unlink ``samples-NNN.jsonl``.

A reader takes, per segment number, the ``.gz`` if it exists, else the plain
closed file; then the open segment. Leftover ``.tmp`` files are ignored.
"""

from __future__ import annotations

import gzip
import math
import os
import re
import shutil
import threading
import zlib
from pathlib import Path
from typing import Any, Callable, Collection, Iterator

from soak.bounds import InputRejected, open_gzip_input, open_input
from soak.fsio import atomic_writer
from soak.jsonl import is_number, parse_line, raw_lines
from soak.store.jsonl import JsonlWriter

OPEN_SEGMENT = "samples.jsonl"
# The open segment rolls past this size: small enough that the plain tail is a
# small part of a long run's directory, large enough that gzip compresses well.
DEFAULT_SEGMENT_BYTES = 4 * 1024 * 1024
COMPRESS_LEVEL = 6  # gzip's default trade: ~10x on sample lines at a fraction of level 9's CPU

_SEGMENT = re.compile(r"^samples-(\d{3,})\.jsonl(\.gz)?$")


class RollingJsonlWriter:
    """Append-and-flush JSON lines into ``samples.jsonl``; past ``segment_bytes``
    the file is closed and gzipped off the event loop (a worker thread; zlib
    releases the GIL). ``segment_bytes=None`` never rolls."""

    def __init__(self, run_dir: Path, *, segment_bytes: int | None = DEFAULT_SEGMENT_BYTES,
                 compress_level: int = COMPRESS_LEVEL, redact: Callable[[str], str] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self._redact = redact
        self.path = self.run_dir / OPEN_SEGMENT
        self._segment_bytes = segment_bytes
        self._level = compress_level
        self._next_index = 1 + max((n for n, _ in _closed_segments(self.run_dir)), default=-1)
        self._segment = JsonlWriter(self.path, redact=redact)
        self._worker: threading.Thread | None = None
        self.lines = 0
        self.rolled = 0
        self.compress_errors: list[str] = []

    def write(self, obj: Any) -> None:
        if self._segment.closed:
            return
        self._segment.write(obj)  # an I/O error (disk full) is raised to the caller, who decides
        self.lines += 1
        if self._segment_bytes is not None and self._segment.size >= self._segment_bytes:
            self.roll()

    def roll(self) -> None:
        """Close the open segment now and start a new one (step 1); gzip it in the background."""
        if self._segment.closed or self._segment.size == 0:
            return
        self._segment.close()
        closed = self.run_dir / f"samples-{self._next_index:03d}.jsonl"
        self._next_index += 1
        os.replace(self.path, closed)
        self._segment = JsonlWriter(self.path, redact=self._redact)
        self.rolled += 1
        self._wait()  # one compression at a time: a backlog would only grow the plain files
        self._worker = threading.Thread(target=self._compress, args=(closed,), name="soak-samples-gzip", daemon=True)
        self._worker.start()

    def _compress(self, plain: Path) -> None:
        try:
            with open(plain, "rb") as src, atomic_writer(plain.with_name(plain.name + ".gz")) as raw, \
                    gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=self._level) as dst:
                shutil.copyfileobj(src, dst, 1024 * 1024)
            plain.unlink()
        except OSError as exc:  # a full disk: the plain closed segment stays and reads as before
            self.compress_errors.append(f"{plain.name}: {exc}")

    def _wait(self) -> None:
        if self._worker is not None:
            self._worker.join()
            self._worker = None

    def close(self) -> None:
        """Idempotent; waits for a compression under way. The open segment stays plain."""
        self._segment.close()
        self._wait()


def _closed_segments(run_dir: Path) -> list[tuple[int, Path]]:
    """(number, file) per closed segment, oldest first: the .gz where it is complete, else the plain file."""
    chosen: dict[int, Path] = {}
    try:
        names = os.listdir(run_dir)
    except OSError:
        return []
    for name in names:
        match = _SEGMENT.match(name)
        if not match:
            continue
        number = int(match.group(1))
        if match.group(2) or number not in chosen:
            chosen[number] = run_dir / name
    return sorted(chosen.items())


def sample_files(run_dir: str | Path) -> list[Path]:
    """Every sample file of a run in time order: closed segments, then the open one (if any)."""
    run_dir = Path(run_dir)
    files = [path for _, path in _closed_segments(run_dir)]
    if (run_dir / OPEN_SEGMENT).is_file():
        files.append(run_dir / OPEN_SEGMENT)
    return files


def iter_sample_lines(run_dir: str | Path, *, stats: dict[str, int] | None = None) -> Iterator[tuple[Path, int, bytes]]:
    """(file, line number, raw line) for every non-blank line of every sample
    file, for ``soak.jsonl.parse_line`` (which applies the torn-last-line rule).
    A gzip segment cut short, or inflating past ``Limits.inflated_bytes``, is
    read up to there and counted in ``stats['bad_segments']``; so is a segment
    that is not a regular file (a FIFO, a directory, a device: refused by
    ``soak.bounds.open_input`` without waiting)."""
    for path in sample_files(run_dir):
        try:
            opened = open_gzip_input(path) if path.suffix == ".gz" else open_input(path, devices=False)
            with opened as handle:
                for number, raw in raw_lines(handle):
                    yield path, number, raw
        except (OSError, EOFError, zlib.error, InputRejected):
            _count(stats, "bad_segments")


def line_head(raw: bytes) -> tuple[str | None, float | None]:
    """(kind, ts) read off the front of a line as the run store writes it
    (``{"kind":"gpu","ts":1764690000.5,...``) without parsing the rest; None for
    what is not there in that shape (the caller parses the line whole)."""
    if not raw.startswith(b'{"kind":"'):
        return None, None
    end = raw.find(b'"', 9)
    if end < 0:
        return None, None
    kind = raw[9:end].decode("utf-8", "replace")
    if not raw.startswith(b',"ts":', end + 1):
        return kind, None
    start = end + 7
    stop = start
    while stop < len(raw) and raw[stop] not in b",}":
        stop += 1
    try:
        return kind, float(raw[start:stop])
    except ValueError:
        return kind, None


def line_mono(raw: bytes) -> float | None:
    """The ``mono`` the run store writes last on a sample line (``...,"mono":12.5}``),
    without parsing the rest; None when the line does not end that way."""
    raw = raw.rstrip()
    at = raw.rfind(b',"mono":')
    if at < 0 or not raw.endswith(b"}"):
        return None
    try:
        mono = float(raw[at + 8:-1])
    except ValueError:
        return None
    return mono if math.isfinite(mono) else None  # "NaN" or "Infinity" would stick as the latest


def read_sample_records(run_dir: str | Path, *, stats: dict[str, int] | None = None,
                        kinds: Collection[str] | None = None,
                        scan: dict[str, float] | None = None) -> Iterator[dict[str, Any]]:
    """Every valid JSON object line of the run's sample files, in order. With
    ``kinds``, lines of other kinds are passed over unparsed (the writer puts
    ``"kind"`` first, so that is a prefix test). ``scan``, if given, gets
    ``lines`` (sample lines seen, parsed or passed over), ``last_ts`` (the
    latest ``ts`` among them), ``last_mono`` (the latest ``mono``) and
    ``last_unmarked_ts`` (the latest ``ts`` of a line without ``mono``). Lines are read under ``soak.jsonl``'s rule, bad
    ones counted in ``stats``."""
    wanted = frozenset(kinds) if kinds is not None else None
    lines = 0
    last_ts: float | None = None
    last_mono: float | None = None
    unmarked: float | None = None
    try:
        for path, number, raw in iter_sample_lines(run_dir, stats=stats):
            if wanted is not None:
                kind, ts = line_head(raw)
                if kind is not None and kind not in wanted:
                    lines += 1
                    if ts is not None and (last_ts is None or ts > last_ts):
                        last_ts = ts
                    mono = line_mono(raw)
                    if mono is not None and (last_mono is None or mono > last_mono):
                        last_mono = mono
                    elif mono is None and ts is not None and (unmarked is None or ts > unmarked):
                        unmarked = ts
                    continue
            obj = parse_line(raw, path=path, number=number, errors="skip", stats=stats)
            if not isinstance(obj, dict):
                continue
            lines += 1
            ts = obj.get("ts")
            if isinstance(ts, (int, float)) and (last_ts is None or ts > last_ts):
                last_ts = float(ts)
            mono = obj.get("mono")
            if is_number(mono):
                if last_mono is None or mono > last_mono:
                    last_mono = float(mono)
            elif isinstance(ts, (int, float)) and (unmarked is None or ts > unmarked):
                unmarked = float(ts)
            if wanted is None or obj.get("kind") in wanted:
                yield obj
    finally:
        if scan is not None:
            scan["lines"] = lines
            if last_ts is not None:
                scan["last_ts"] = last_ts
            if last_mono is not None:
                scan["last_mono"] = last_mono
            if unmarked is not None:
                scan["last_unmarked_ts"] = unmarked


def _count(stats: dict[str, int] | None, key: str) -> None:
    if stats is not None:
        stats[key] = stats.get(key, 0) + 1


__all__ = [
    "DEFAULT_SEGMENT_BYTES", "OPEN_SEGMENT", "RollingJsonlWriter", "iter_sample_lines", "line_head",
    "read_sample_records", "sample_files",
]
