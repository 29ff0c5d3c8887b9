"""Log lines in vLLM's format: ``(APIServer pid=123) INFO 12-02 16:42:28 [file.py:N] message``.

Worker and engine-core lines carry their own prefix, ``(Worker_PP3 pid=1234)``
and ``(EngineCore_DP0 pid=1200)``; lines are written whole and flushed, so a
killed server leaves a readable log.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from soak.clock import Clock, SystemClock

# vllm/utils: CYAN = "\033[1;36m", RESET = "\033[0;0m"
CYAN = "\033[1;36m"
RESET = "\033[0;0m"


class SimLog:
    def __init__(self, *, stream: TextIO | None = None, clock: Clock | None = None, pid: int, ansi: bool = False) -> None:
        self._stream = stream if stream is not None else sys.stdout
        self.ansi = ansi  # vLLM 0.11.x colours the process prefix
        self._clock = clock or SystemClock()
        self.pid = pid
        self.lines_written = 0

    def stamp(self) -> str:
        return time.strftime("%m-%d %H:%M:%S", time.localtime(self._clock.now()))

    def line(self, level: str, where: str, message: str, *, who: str = "APIServer", pid: int | None = None) -> None:
        prefix = self.prefix(who, pid if pid is not None else self.pid)
        text = "".join(f"{prefix}{level} {self.stamp()} [{where}] {part}\n" for part in message.split("\n"))
        self.raw(text)

    def prefix(self, who: str, pid: int) -> str:
        """``(Worker_PP3 pid=1234) ``, cyan as vLLM 0.11.x writes it (``_add_prefix``)."""
        return f"{CYAN}({who} pid={pid}){RESET} " if self.ansi else f"({who} pid={pid}) "

    def raw(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):  # stdout closed under us: nothing to save
            pass
        self.lines_written += text.count("\n")

    def info(self, where: str, message: str, **kw) -> None:
        self.line("INFO", where, message, **kw)

    def warning(self, where: str, message: str, **kw) -> None:
        self.line("WARNING", where, message, **kw)

    def error(self, where: str, message: str, **kw) -> None:
        self.line("ERROR", where, message, **kw)

    def nccl(self, rank: int, message: str, *, where: str = "ProcessGroupNCCL.cpp:632", who: str, pid: int) -> None:
        """PyTorch's c10 log format: ``[rank0]:[E1202 16:42:28.123456789 File.cpp:N] message``."""
        now = self._clock.now()
        frac = int((now % 1) * 1e9)
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(now)) + f".{frac:09d}"
        self.raw(f"{self.prefix(who, pid)}[rank{rank}]:[E{stamp} {where}] {message}\n")
