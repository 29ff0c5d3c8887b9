"""The signals that end a run as an operator's interrupt: the one list.

Ctrl-C (SIGINT), a supervisor's or CI job's stop (SIGTERM) and a closed terminal
or ssh session (SIGHUP) all mean "stop now, keep what you have": exit 130, with
summary.json and junit.xml written (CONTRACTS). A signal left off this list
would keep its default action and kill the harness with nothing written; the run
loop installs a handler for each, and the guardian ignores each (they are the
harness's to handle; the guardian acts only when the harness is gone).

A signal the harness was started with ignored stays ignored: ``nohup soak run``
(SIGHUP ignored) must outlive the terminal it was started from, as a background
job of a script (SIGINT ignored) must outlive a Ctrl-C to that script. Python
keeps an inherited SIGINT ignore the same way.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Callable

INTERRUPT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def interrupt_reason(sig: signal.Signals) -> str:
    return f"interrupted ({sig.name})"


def handled() -> tuple[signal.Signals, ...]:
    """The interrupt signals to handle now: those not inherited as ignored."""
    return tuple(sig for sig in INTERRUPT_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN)


def install(handler: Callable[[str], None]) -> list[signal.Signals]:
    """``handler(reason)`` on each interrupt signal, in the running loop; returns
    those installed (``uninstall`` takes them back)."""
    loop = asyncio.get_running_loop()
    installed = []
    # Every one of them (SIGHUP too: a closed terminal) ends the run as an
    # interrupt; a default action would kill the harness with nothing written.
    # One inherited as ignored (nohup) stays ignored.
    for sig in handled():
        try:
            loop.add_signal_handler(sig, handler, interrupt_reason(sig))
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    return installed


def uninstall(installed: list[signal.Signals]) -> None:
    loop = asyncio.get_running_loop()
    for sig in installed:
        loop.remove_signal_handler(sig)
