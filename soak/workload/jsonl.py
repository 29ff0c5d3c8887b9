"""Reading a JSONL file a row at a time, with errors that name the file and line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from soak.errors import WorkloadError


def iter_json_objects(
    path: Path, *, limit: int | None = None, noun: str = "row", field: str | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line, at most ``limit`` of them.

    A missing or unreadable file is a WorkloadError naming ``field`` (the config
    key that named the file); a line that is not a JSON object names its line.
    """
    try:
        handle = path.open("r", encoding="utf-8")
    except FileNotFoundError as exc:
        raise WorkloadError("no such file", path=path, field=field) from exc
    except OSError as exc:
        raise WorkloadError(f"cannot read: {exc}", path=path, field=field) from exc
    yielded = 0
    with handle:
        try:
            for number, text in enumerate(handle, start=1):
                if limit is not None and yielded >= limit:
                    return
                if not text.strip():
                    continue
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise WorkloadError(f"invalid JSON: {exc.msg}", path=path, line=number) from exc
                if not isinstance(obj, dict):
                    raise WorkloadError(f"a {noun} must be a JSON object", path=path, line=number)
                yielded += 1
                yield number, obj
        except UnicodeDecodeError as exc:
            raise WorkloadError(f"not UTF-8 text: {exc}", path=path) from exc
