"""Reading JSON Lines: one rule for every JSONL file soak reads.

Run-directory files are appended and flushed a line at a time, so a harness
killed with SIGKILL leaves at most a torn last line; workload and trace files
come from users. Both read under the same rule:

- a blank line is skipped;
- a final line without its newline that does not parse is a torn write: it is
  ignored (counted in ``stats['torn_lines']``); one that parses is kept, since
  only the newline is missing;
- any other line that does not parse is a bad line, named by file and line:
  raised as ``JsonlLineError`` (``errors="raise"``, for inputs a user must fix)
  or counted in ``stats['bad_lines']`` (``errors="skip"``, for run directories,
  where the rest of the run is still worth reading).

Lines and values are bounded (``soak.bounds``): a line longer than
``Limits.line_bytes`` or nested deeper than ``Limits.depth`` is a bad line under
the same rule, named by its bound, and is never held whole in memory.

``soak.store.segments`` adds the gzip/segment iteration around ``raw_lines`` and
``parse_line``; everything else calls ``read_jsonl`` or ``read_records``.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any, Iterator, Literal

from soak.bounds import LIMITS, BoundExceeded, InputRejected, Limits, OverlongLine, iter_lines, read_json_file, loads_json

Errors = Literal["raise", "skip"]

SKIP = object()
"""What ``parse_line`` returns for a line the rule leaves out."""


class JsonlLineError(ValueError):
    """A line in the middle of a JSONL file that is not JSON."""

    def __init__(self, message: str, *, path: Path | str, line: int) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.message = message
        self.path = Path(path)
        self.line = line


def raw_lines(handle: IO[bytes], *, limits: Limits = LIMITS) -> Iterator[tuple[int, bytes]]:
    """``(line number, raw line)`` for each non-blank line of a binary handle; a
    line past ``limits.line_bytes`` comes as an ``OverlongLine`` that
    ``parse_line`` treats as a bad line."""
    for number, raw in iter_lines(handle, limit=limits.line_bytes):
        if type(raw) is OverlongLine or raw.strip():
            yield number, raw


def parse_line(raw: bytes, *, path: Path | str, number: int, errors: Errors = "raise",
               stats: dict[str, int] | None = None, limits: Limits = LIMITS) -> Any:
    """The JSON value of one raw line, or ``SKIP`` for a torn last line (and,
    with ``errors="skip"``, for a bad line); see the module docstring."""
    if type(raw) is OverlongLine:
        return _bad(raw.error, raw, path=path, number=number, errors=errors, stats=stats)
    try:
        return loads_json(raw, max_depth=limits.depth)
    except InputRejected as exc:
        if not raw.endswith(b"\n") and not isinstance(exc, BoundExceeded):
            _count(stats, "torn_lines")
            return SKIP
        return _bad(exc, raw, path=path, number=number, errors=errors, stats=stats)


def _bad(exc: InputRejected, raw: bytes, *, path: Path | str, number: int, errors: Errors,
         stats: dict[str, int] | None) -> Any:
    if errors == "skip":
        _count(stats, "bad_lines")
        if isinstance(exc, BoundExceeded):
            _count(stats, f"bound_{exc.bound.value}")
        return SKIP
    raise JsonlLineError(exc.message, path=path, line=number) from exc


def read_jsonl(path: Path, *, errors: Errors = "raise",
               stats: dict[str, int] | None = None) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` for every line of ``path`` the rule keeps.

    The file is opened here: a missing or unreadable one raises ``OSError``
    for the caller to name (it knows which config key named the file)."""
    with open(path, "rb") as handle:
        for number, raw in raw_lines(handle):
            value = parse_line(raw, path=path, number=number, errors=errors, stats=stats)
            if value is not SKIP:
                yield number, value


def read_records(path: Path, *, stats: dict[str, int] | None = None) -> Iterator[dict[str, Any]]:
    """Every JSON object line of a run-directory file (none if it is missing);
    bad lines are counted in ``stats``, lines that are not objects passed over."""
    if not path.is_file():
        return
    for _, value in read_jsonl(path, errors="skip", stats=stats):
        if isinstance(value, dict):
            yield value


def read_json(path: Path, *, limits: Limits = LIMITS) -> Any:
    """A whole JSON file (summary.json, incident.json, plan.json), or None where
    it is missing, unreadable, not JSON or past a bound: a run directory may be
    cut off (or damaged) anywhere."""
    try:
        return read_json_file(path, limits=limits)
    except (OSError, InputRejected):
        return None


def _count(stats: dict[str, int] | None, key: str) -> None:
    if stats is not None:
        stats[key] = stats.get(key, 0) + 1


__all__ = ["JsonlLineError", "SKIP", "parse_line", "raw_lines", "read_json", "read_jsonl", "read_records"]
