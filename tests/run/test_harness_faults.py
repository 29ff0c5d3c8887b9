"""The harness's own failures: the first one is the fault (its reason stops the
load, on the run's loop whatever thread it came from); the run store failing is
a fault, another sink failing is one line, once."""

from __future__ import annotations

import asyncio
import io
import threading

from soak.run.faults import Faults


class Store:
    pass


class View:
    pass


def test_the_first_fault_is_kept_and_stops_the_load_once():
    stopped: list[str] = []
    faults = Faults(record=Store(), on_fault=stopped.append)

    async def go() -> None:
        faults.fault(OSError(28, "No space left on device"), where="writing samples")
        faults.fault(RuntimeError("later"), where="elsewhere")

    asyncio.run(go())
    assert stopped == ["harness fault while writing samples: OSError: [Errno 28] No space left on device"]
    assert isinstance(faults.exc, OSError) and faults.where == "writing samples"


def test_a_fault_from_another_thread_stops_the_load_on_the_run_loop():
    seen: list[tuple[str, bool]] = []

    async def go() -> None:
        loop = asyncio.get_running_loop()
        faults = Faults(record=Store(), on_fault=lambda r: seen.append((r, threading.current_thread() is main)))
        faults.loop = loop
        await asyncio.to_thread(faults.fault, ValueError("bad line"), where="writing incident evidence")
        await asyncio.sleep(0)

    main = threading.current_thread()
    asyncio.run(go())
    assert seen == [("harness fault while writing incident evidence: ValueError: bad line", True)]


def test_the_store_failing_is_a_fault_another_sink_failing_is_one_line():
    store, view, out, stopped = Store(), View(), io.StringIO(), []
    faults = Faults(record=store, on_fault=stopped.append, stderr=out)

    async def go() -> None:
        for _ in range(3):
            faults.sink_error(view, "on_sample", BrokenPipeError("closed"))
        assert faults.exc is None and stopped == []
        faults.sink_error(store, "on_event", OSError("read-only file system"))

    asyncio.run(go())
    assert out.getvalue().count("View.on_sample failed: BrokenPipeError: closed (the run goes on)") == 1
    assert stopped == ["harness fault while writing the run directory (on_event): OSError: read-only file system"]


def test_noting_a_fault_keeps_the_first():
    faults = Faults(record=Store(), on_fault=lambda r: None)
    assert faults.note(KeyError("a"), "stopping the probes") is True
    assert faults.note(KeyError("b"), "stopping the target") is False
    assert faults.where == "stopping the probes"
