"""Writing a file whole or not at all: the one atomic write every stage uses.

A reader (``soak report``, a nightly job, the dashboard, a test polling a port
file) never sees half a file, and a harness killed mid-write or a full disk
leaves the old file whole: the data goes to a temporary name in the same
directory, is flushed and fsynced, then renamed over the target. On failure the
temporary file is removed and the error raised to the caller, who decides.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import IO, Any, Callable, Iterator


def _tmp_for(path: Path) -> Path:
    # Hidden, and unique per process: two writers of one file never share a temporary.
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


@contextlib.contextmanager
def atomic_writer(path: str | Path) -> Iterator[IO[bytes]]:
    """A binary file that becomes ``path`` when the block ends without error."""
    path = Path(path)
    tmp = _tmp_for(path)
    try:
        with open(tmp, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: str | Path, data: bytes | str) -> None:
    """``data`` (text is written as UTF-8) as the whole of ``path``."""
    with atomic_writer(path) as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)


def write_json_atomic(path: str | Path, obj: Any, *, redact: Callable[[str], str] | None = None) -> None:
    """``obj`` as indented JSON (the form of summary.json and plan.json), redacted if asked."""
    text = json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n"
    write_atomic(path, redact(text) if redact is not None else text)


def symlink_atomic(target: str, link: str | Path) -> None:
    """Point ``link`` at ``target``, replacing an existing link in one rename."""
    link = Path(link)
    tmp = _tmp_for(link)
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


__all__ = ["atomic_writer", "symlink_atomic", "write_atomic", "write_json_atomic"]
