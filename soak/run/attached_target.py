"""A server someone else runs (``AttachedTarget``): the harness only waits for it
to answer, and knows its PID (checked to serve the URL) when the config gives one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Callable

from soak.clock import Clock, SystemClock
from soak.errors import TargetNotReady
from soak.proc import identity as ident
from soak.proc.facts import Pin
from soak.proc.read import pin_of, protected_pids
from soak.run.readiness import wait_ready


class AttachedTarget:
    """A server the harness does not own: it waits for it and never starts it."""

    log_path: Path | None

    def __init__(
        self,
        *,
        base_url: str,
        pid: int | None,
        log_path: Path | None,
        startup_timeout_s: float,
        poll_interval_s: float,
        api_key: str | None = None,
        flight_recorder_pipe_stem: str | None = None,
        clock: Clock | None = None,
        on_waiting: Callable[[str], None] | None = None,
    ) -> None:
        self._on_waiting = on_waiting  # why it is not ready yet (wait_ready), one line
        self.base_url = base_url
        self.root_pid = pid
        self.log_path = log_path
        self.flight_recorder_pipe_stem = flight_recorder_pipe_stem
        self.models: tuple[str, ...] = ()
        self._startup_timeout_s = startup_timeout_s
        self._poll_interval_s = poll_interval_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._clock = clock or SystemClock()
        self.identity: Pin | None = None

    def returncode(self) -> int | None:
        return None

    async def start(self) -> None:
        if self.root_pid is not None:
            if pin_of(self.root_pid) is None:
                raise TargetNotReady(f"attached target: no process with PID {self.root_pid}")
            if self.root_pid in protected_pids():
                await asyncio.to_thread(ident.verify_attached, self.root_pid, self.base_url)  # raises
        self.base_url, self.models = await wait_ready(
            url=lambda: self.base_url,
            timeout_s=self._startup_timeout_s,
            interval_s=self._poll_interval_s,
            headers=self._headers,
            clock=self._clock,
            what=f"the attached server at {self.base_url}",
            on_waiting=self._on_waiting,
        )
        if self.root_pid is not None:
            # The PID must be the one serving the URL (or its ancestor); pinned by start time.
            identity = await asyncio.to_thread(ident.verify_attached, self.root_pid, self.base_url)
            if self.identity is not None and self.identity != identity:
                raise ident.TargetMismatch(
                    f"target.pid {self.root_pid} is another process than the one checked at start "
                    "(the server was restarted and its PID reused)"
                )
            self.identity = identity

    async def restart(self) -> None:
        """Someone else restarts an attached server (systemd, a supervisor): wait for it."""
        await self.start()

    async def aclose(self) -> None:
        pass
