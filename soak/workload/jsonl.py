"""Reading a workload's JSONL file a row at a time, with errors that name the file and line."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from soak.errors import WorkloadError
from soak.jsonl import JsonlLineError, read_jsonl


def iter_json_objects(
    path: Path, *, limit: int | None = None, noun: str = "row", field: str | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each line ``soak.jsonl`` keeps, at most ``limit`` of them.

    A missing or unreadable file is a WorkloadError naming ``field`` (the config
    key that named the file); a line that is not a JSON object names its line.
    """
    if limit is not None and limit <= 0:
        return
    yielded = 0
    try:
        for number, obj in read_jsonl(path, errors="raise"):
            if not isinstance(obj, dict):
                raise WorkloadError(f"a {noun} must be a JSON object", path=path, line=number)
            yield number, obj
            yielded += 1
            if limit is not None and yielded >= limit:
                return
    except FileNotFoundError as exc:
        raise WorkloadError("no such file", path=path, field=field) from exc
    except OSError as exc:
        raise WorkloadError(f"cannot read: {exc}", path=path, field=field) from exc
    except JsonlLineError as exc:
        raise WorkloadError(exc.message, path=path, line=exc.line) from exc
