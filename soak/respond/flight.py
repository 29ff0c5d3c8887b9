"""PyTorch's NCCL flight recorder: the environment a launched target gets, and
asking live ranks for a dump through their pipe files (FACTS.md).

Each rank started with ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<stem>`` opens a FIFO
``<stem><rank>.pipe``; writing any byte to it makes that rank write its trace to
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>``. With ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``
the watchdog also dumps there on its own timeout, so dumps may already exist.
"""

from __future__ import annotations

import asyncio
import errno
import glob
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from soak.proc.facts import MARKER_VARIABLE

TRACE_BUFFER_SIZE = 2000
ownership_variable = MARKER_VARIABLE  # the one name, soak.proc.facts


@dataclass(frozen=True)
class FlightRecorderPaths:
    dump_prefix: str  # TORCH_NCCL_DEBUG_INFO_TEMP_FILE: rank N writes <prefix>N
    pipe_stem: str    # TORCH_NCCL_DEBUG_INFO_PIPE_FILE: rank N reads <stem>N.pipe


def default_flight_recorder_paths(run_dir: Path) -> FlightRecorderPaths:
    """Where a launched target's ranks dump and listen: ``<run_dir>/nccl/``."""
    base = Path(run_dir).resolve() / "nccl"
    return FlightRecorderPaths(str(base / "nccl_trace_rank_"), str(base / "pipe_rank_"))


def flight_recorder_env(dump_dir: str | Path, pipe_stem: str) -> dict[str, str]:
    """The variables that turn the recorder on, in both spellings.

    ``dump_dir`` is the directory the ranks dump into (each writes
    ``nccl_trace_rank_<rank>`` there). They must be in the workers' environment
    when their process groups are created, so the run loop merges them into the
    launched server's environment; create ``dump_dir`` before the launch.
    """
    dump_prefix = str(Path(dump_dir) / "nccl_trace_rank_")
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": str(TRACE_BUFFER_SIZE),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": dump_prefix,
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": pipe_stem,
        "TORCH_FR_BUFFER_SIZE": str(TRACE_BUFFER_SIZE),
        "TORCH_FR_DUMP_TEMP_FILE": dump_prefix,
        # No TORCH_FR_ spelling of the pipe exists (torch 2.9 and 2.14 read only
        # TORCH_NCCL_DEBUG_INFO_PIPE_FILE), and TORCH_NCCL_ASYNC_ERROR_HANDLING is
        # left at torch's default (3), which takes a rank down after a watchdog
        # timeout: the harness asks through the pipe long before that fires.
    }


def torch_default_dump_prefix(environ: dict[str, str] | None) -> str | None:
    """Where a server started without ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` dumps.

    torch 2.9 and 2.14 default to ``$XDG_CACHE_HOME/torch/comm_lib_trace_rank_``
    (``~/.cache/torch/...``), read in the server's environment, not ours: an
    attached server's dumps are not under /tmp. ``environ`` is the server's
    (None when it cannot be read).
    """
    if not environ:
        return None
    explicit = environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") or environ.get("TORCH_FR_DUMP_TEMP_FILE")
    if explicit:
        return explicit
    cache = environ.get("XDG_CACHE_HOME") or (
        os.path.join(environ["HOME"], ".cache") if environ.get("HOME") else None
    )
    return os.path.join(cache, "torch", "comm_lib_trace_rank_") if cache else None


def attached_flight_recorder_paths(pid: int | None, *, run_dir: Path) -> FlightRecorderPaths:
    """An attached server's dump prefix and pipe stem, from its own environment.

    Falls back to the run directory's defaults (which then find nothing) when
    the process's environment cannot be read."""
    fallback = default_flight_recorder_paths(run_dir)
    if pid is None:
        return fallback
    try:
        import psutil

        environ = psutil.Process(pid).environ()
    except Exception:  # gone, or not ours to read: nothing to learn
        return fallback
    prefix = torch_default_dump_prefix(environ) or fallback.dump_prefix
    stem = environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE") or fallback.pipe_stem
    return FlightRecorderPaths(prefix, stem)


def ownership_env(token: str) -> dict[str, str]:
    """A marker every descendant of a launched target inherits.

    The responder uses it to claim GPU processes that left the tree before any
    snapshot saw them (pass the same token as ``Responder(ownership_token=...)``).
    """
    return {ownership_variable: token}


def request_dumps(pipe_stem: str) -> tuple[list[str], list[str]]:
    """Write one byte to every ``<stem><rank>.pipe`` that exists; never blocks.

    Returns (pipes written, notes for pipes that could not be written).
    """
    written: list[str] = []
    notes: list[str] = []
    for path in sorted(glob.glob(glob.escape(pipe_stem) + "*.pipe")):
        try:
            # O_NONBLOCK: fails with ENXIO at once when no rank has it open.
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            reason = "no reader" if exc.errno == errno.ENXIO else exc.strerror
            notes.append(f"{path}: {reason}")
            continue
        try:
            os.write(fd, b"1")
            written.append(path)
        except OSError as exc:
            notes.append(f"{path}: {exc.strerror}")
        finally:
            os.close(fd)
    return written, notes


def dump_files(dump_prefix: str) -> dict[str, float]:
    """Existing dump files under the prefix, with their mtimes."""
    out: dict[str, float] = {}
    for path in glob.glob(glob.escape(dump_prefix) + "*"):
        if path.endswith(".pipe") or path.endswith(".tmp"):
            continue
        try:
            out[path] = os.stat(path).st_mtime
        except OSError:
            continue
    return out


async def collect_dumps(
    dump_prefix: str,
    *,
    expected: int,
    before: dict[str, float],
    wait_s: float,
    dest: Path,
    poll_s: float = 0.1,
) -> list[Path]:
    """Wait (bounded) for new or rewritten dumps, then copy them into ``dest``.

    Stops early once ``expected`` new dumps have appeared and their sizes held
    still for one poll (a rank writes its pickle in one go, but not atomically).
    Dumps that already existed and were not collected by an earlier incident
    are taken too: the watchdog may have dumped on its own timeout.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    sizes: dict[str, int] = {}
    while True:
        current = dump_files(dump_prefix)
        fresh = {p for p, m in current.items() if before.get(p) != m}
        new_sizes = {}
        for p in fresh:
            try:
                new_sizes[p] = os.stat(p).st_size
            except OSError:
                pass
        settled = bool(new_sizes) and new_sizes == sizes
        # Nothing asked for: take what the watchdog may have dumped, no waiting.
        if not expected or (len(fresh) >= expected and settled) or loop.time() >= deadline:
            break
        sizes = new_sizes
        await asyncio.sleep(poll_s)
    copied: list[Path] = []
    if fresh:
        dest.mkdir(parents=True, exist_ok=True)
    for path in sorted(fresh):
        target = dest / Path(path).name
        try:
            shutil.copyfile(path, target)
            copied.append(target)
        except OSError:
            continue
    return copied
