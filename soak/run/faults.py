"""The harness's own failures (a write that failed, a bug): the first one is the
run's harness fault (exit 4) and stops the load, from whatever thread it came;
a sink other than the run store failing costs a line once, not the run."""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Callable, TextIO


class Faults:
    def __init__(self, *, record: object, on_fault: Callable[[str], None], stderr: TextIO | None = None) -> None:
        self._record = record  # the sink whose failure loses the record: the run store
        self._on_fault = on_fault  # called with the fault's reason, on the run's loop
        self._stderr = stderr
        self._lock = threading.Lock()
        self._sink_errors: set[tuple[str, str]] = set()
        self.exc: BaseException | None = None
        self.where = ""
        self.traceback: str | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the run's, once it runs

    def note(self, exc: BaseException, where: str) -> bool:
        """Keep ``exc`` if it is the first fault; True when it was."""
        with self._lock:
            if self.exc is not None:
                return False
            self.exc, self.where = exc, where
            return True

    def fault(self, exc: BaseException, *, where: str) -> None:
        """The first fault stops the load (called from any thread); later ones are the same run's."""
        if not self.note(exc, where):
            return
        reason = f"harness fault while {where}: {type(exc).__name__}: {exc}"
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if self.loop is not None:
                self.loop.call_soon_threadsafe(self._on_fault, reason)
            return
        self._on_fault(reason)

    def sink_error(self, sink: object, method: str, exc: BaseException) -> None:
        """A sink raised. The run store failing means the record is being lost (a
        full disk, a read-only mount): that ends the run as a harness fault. The
        live view or the exporter failing costs a line once, not the run."""
        if sink is self._record:
            self.fault(exc, where=f"writing the run directory ({method})")
            return
        key = (type(sink).__name__, method)
        if key not in self._sink_errors:
            self._sink_errors.add(key)
            print(f"soak: {type(sink).__name__}.{method} failed: {type(exc).__name__}: {exc} (the run goes on)",
                  file=self._stderr or sys.stderr)
