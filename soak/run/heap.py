"""A day-long harness keeps its heap from creeping: glibc's malloc, tuned once at start.

Why. Python's own small-object allocator returns its arenas, but every object
over 512 bytes goes to the C library's malloc: request bodies (a whole
conversation, 100 KB at 24K tokens, 1 MB at 200K), response buffers, JSON
lines. glibc serves an allocation that size from the heap once a freed one of
that size has raised its *dynamic* mmap threshold (up to 32 MB), and the small
long-lived objects the harness allocates meanwhile land between them. The freed
space is then split into holes the next, differently sized body does not fit,
and the heap only grows: at 64 streams the harness's main arena grew about
0.5 MB a minute while the bytes in use stayed flat (mallinfo2, measured over
ten minutes of a bench run), which is the whole of its RSS growth over a day.

A fixed threshold turns the dynamic one off: anything from ``MMAP_THRESHOLD``
up is its own mapping, returned to the system on free, and the heap holds only
small objects, whose holes the next small objects fill. The price is an
mmap/munmap pair per large buffer, a few per request.

One buffer would pay that price far more often: asyncio's selector transport
reads a socket into a fresh ``bytes`` of ``max_size`` (256 KiB) and shrinks it
to what arrived. Over the threshold, every SSE read becomes an mmap, a page
fault and a munmap (600 a second at 64 streams, measured with strace; +29%
harness CPU per token). So the read size is lowered under the threshold
(``READ_SIZE``); a read gets what the socket holds, up to that, and a
streamed chunk is a few hundred bytes.

What the fixed threshold leaves: objects under it (a socket read's 32 KiB
buffer shrunk to the few hundred bytes that arrived, a JSON line, a parsed
chunk) still come from the heap, and the free space between the long-lived
ones grows slowly: at 64 streams glibc's free bytes inside the heap grew
about 0.2 MB a minute while its bytes in use stayed flat (mallinfo2, a
day-long bench at time scale 24). ``HeapTrimmer`` calls ``malloc_trim(0)``
once a minute, which hands every whole free page inside the heap back to the
system (glibc >= 2.8 madvises them, not only the top), so RSS follows the
bytes in use. It runs on its own thread: ctypes drops the GIL for the call,
and a trim of a heap this size takes milliseconds.

Only the ``soak run`` process is tuned, at its start. A user who set glibc's own
knobs (``MALLOC_MMAP_THRESHOLD_``, ``GLIBC_TUNABLES=glibc.malloc...``) keeps
them; another C library is left alone.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
from dataclasses import dataclass
from typing import Callable, Mapping

# From glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 64 * 1024
# Under MMAP_THRESHOLD with room for malloc's header: a socket read stays in the heap.
READ_SIZE = 32 * 1024
# Free memory at the top of the heap above this goes back to the system (the
# default, 128 KiB, also turns dynamic once the mmap threshold moves; fixed here).
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD

# Often enough that a day's free pages never pile up; rarely enough to cost nothing.
TRIM_INTERVAL_S = 60.0

_USER_KNOBS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


class HeapTrimmer:
    """Calls ``trim`` (glibc's ``malloc_trim``) every ``interval`` seconds on a
    daemon thread from ``start()`` until ``close()`` (idempotent)."""

    def __init__(self, trim: Callable[[int], object], *, interval: float = TRIM_INTERVAL_S) -> None:
        self._trim = trim
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def trim_once(self) -> None:
        self._trim(0)  # 0: keep no padding at the heap's top

    def start(self) -> None:
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._loop, name="soak-heap-trim", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.trim_once()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


@dataclass(frozen=True)
class HeapTuning:
    applied: bool
    reason: str
    trimmer: HeapTrimmer | None = None  # not started: the caller owns its thread


def _glibc() -> ctypes.CDLL | None:
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def _asyncio_transport() -> type | None:
    from asyncio import selector_events

    return getattr(selector_events, "_SelectorSocketTransport", None)


def bound_read_size(read_size: int, *, transport: Callable[[], type | None] = _asyncio_transport) -> int | None:
    """Lower asyncio's per-read buffer to ``read_size``; the size now, or None
    where this Python's transport has no such knob (a private one: checked)."""
    cls = transport()
    current = getattr(cls, "max_size", None) if cls is not None else None
    if not isinstance(current, int) or isinstance(current, bool):
        return None
    cls.max_size = min(current, read_size)  # type: ignore[union-attr]
    return cls.max_size  # type: ignore[union-attr]


def bound_heap_growth(*, environ: Mapping[str, str] = os.environ,
                      libc: Callable[[], ctypes.CDLL | None] = _glibc,
                      mmap_threshold: int = MMAP_THRESHOLD,
                      trim_threshold: int = TRIM_THRESHOLD,
                      read_size: int = READ_SIZE,
                      trim_interval: float = TRIM_INTERVAL_S,
                      transport: Callable[[], type | None] = _asyncio_transport) -> HeapTuning:
    """Fix glibc's mmap and trim thresholds for this process, keep socket
    reads under the first, and make the trimmer of free heap pages; say what
    was done."""
    if any(name in environ for name in _USER_KNOBS) or "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return HeapTuning(False, "malloc tuned by the environment; left as set")
    lib = libc()
    mallopt = getattr(lib, "mallopt", None) if lib is not None else None
    if mallopt is None:
        return HeapTuning(False, "not glibc; malloc left as it is")
    # mallopt returns 1 on success, 0 on an unknown parameter or a bad value.
    if mallopt(M_MMAP_THRESHOLD, mmap_threshold) != 1:
        return HeapTuning(False, "glibc refused the mmap threshold; malloc left as it is")
    # The mmap threshold is fixed from here: the reads must go under it whatever the trim does.
    trim = f"trim threshold {trim_threshold} B" if mallopt(M_TRIM_THRESHOLD, trim_threshold) == 1 else "trim threshold refused"
    reads = bound_read_size(min(read_size, mmap_threshold // 2), transport=transport)
    said = f"socket reads {reads} B" if reads is not None else "socket reads left as they are (no asyncio knob)"
    malloc_trim = getattr(lib, "malloc_trim", None)
    trimmer = HeapTrimmer(malloc_trim, interval=trim_interval) if malloc_trim is not None else None
    pages = f"free pages returned every {trim_interval:g} s" if trimmer else "no malloc_trim"
    return HeapTuning(True, f"mmap threshold {mmap_threshold} B, {trim}, {said}, {pages}", trimmer)
