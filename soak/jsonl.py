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

import math
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Literal, Mapping

from soak.bounds import (LIMITS, BoundExceeded, InputRejected, Limits, OverlongLine, iter_lines, loads_json, open_input,
                         read_json_file)

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


def read_jsonl(path: Path, *, errors: Errors = "raise", stats: dict[str, int] | None = None,
               devices: bool = True) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` for every line of ``path`` the rule keeps.

    The file is opened here (``soak.bounds.open_input``: never waiting on a
    FIFO; a character device only with ``devices``): a missing, unreadable or
    not regular one raises ``OSError`` for the caller to name (it knows which
    config key named the file)."""
    with open_input(path, devices=devices) as handle:
        for number, raw in raw_lines(handle):
            value = parse_line(raw, path=path, number=number, errors=errors, stats=stats)
            if value is not SKIP:
                yield number, value


FieldCheck = Callable[[Any], bool]


def is_number(value: Any) -> bool:
    """A finite int or float (a bool is not a number here)."""
    return (type(value) is float and math.isfinite(value)) or (type(value) is int and -2**63 <= value < 2**63)


def is_timestamp(value: Any) -> bool:
    """Unix seconds a date can be made of (1970 to 5138)."""
    return is_number(value) and 0 <= value < 1e11


def is_int(value: Any) -> bool:
    return type(value) is int and -2**63 <= value < 2**63


def is_str(value: Any) -> bool:
    return type(value) is str


def is_bool(value: Any) -> bool:
    return type(value) is bool


def is_list(value: Any) -> bool:
    return type(value) is list


def is_dict(value: Any) -> bool:
    return type(value) is dict


def typed_fields(record: dict[str, Any], fields: Mapping[str, FieldCheck],
                 stats: dict[str, int] | None = None) -> dict[str, Any]:
    """``record`` with every field ``fields`` knows and whose value fails its
    check left out (counted in ``stats['wrong_type_fields']``): a field of the
    wrong type reads as absent, so no reader downstream trips on it."""
    wrong = [key for key, check in fields.items() if key in record and record[key] is not None
             and not check(record[key])]
    if not wrong:
        return record
    _count(stats, "wrong_type_fields", len(wrong))
    return {k: v for k, v in record.items() if k not in wrong}


def read_records(path: Path, *, stats: dict[str, int] | None = None,
                 fields: Mapping[str, FieldCheck] | None = None) -> Iterator[dict[str, Any]]:
    """Every JSON object line of a run-directory file (none if it is missing);
    bad lines are counted in ``stats``, lines that are not objects passed over,
    fields of the wrong type (per ``fields``) left out and counted."""
    if not path.is_file():
        return
    for _, value in read_jsonl(path, errors="skip", stats=stats, devices=False):
        if isinstance(value, dict):
            yield typed_fields(value, fields, stats) if fields else value


def read_json(path: Path, *, limits: Limits = LIMITS) -> Any:
    """A whole JSON file (summary.json, incident.json, plan.json), or None where
    it is missing, unreadable, not JSON or past a bound: a run directory may be
    cut off (or damaged) anywhere."""
    try:
        return read_json_file(path, limits=limits, devices=False)
    except (OSError, InputRejected):
        return None


def _count(stats: dict[str, int] | None, key: str, n: int = 1) -> None:
    if stats is not None:
        stats[key] = stats.get(key, 0) + n


__all__ = ["JsonlLineError", "SKIP", "is_bool", "is_dict", "is_int", "is_list", "is_number", "is_str", "is_timestamp",
           "parse_line", "raw_lines", "read_json", "read_jsonl", "read_records", "typed_fields"]
