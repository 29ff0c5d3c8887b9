"""Why the load stops: the reason said last, whether an interrupt stopped it, and
the load it stops once there is one. Shared by the run, the live judge and the
incident cycle, each of which may end the load."""

from __future__ import annotations

from typing import Protocol


class Load(Protocol):
    def stop(self, reason: str) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...

    @property
    def stopping(self) -> bool: ...


class LoadStop:
    """Why the load stops (the last word given), whether an interrupt stopped it,
    and the load it stops once there is one."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.interrupted = False
        self.load: Load | None = None

    def stop(self, reason: str) -> None:
        self.reason = reason
        if self.load is not None:
            self.load.stop(reason)
