"""Health over real HTTP and liveness of a real subprocess."""

from __future__ import annotations

import subprocess
import sys

from aiohttp import web

from soak.clock import ManualClock
from soak.probes.target import HealthProbe, ProcessProbe


async def test_health_probe_status_and_failures(serve, session):
    status = {"code": 200}

    async def health(request):
        return web.Response(status=status["code"])

    base = await serve({"/health": health})
    probe = HealthProbe(base, session=session, clock=ManualClock(1_800_000_000.0))
    (ok,) = await probe.collect()
    assert ok.ok and ok.status == 200 and ok.latency_s >= 0 and ok.ts == 1_800_000_000.0
    status["code"] = 503
    (bad,) = await probe.collect()
    assert not bad.ok and bad.status == 503
    refused = HealthProbe("http://127.0.0.1:9", session=session, clock=ManualClock(), timeout_s=2)
    (gone,) = await refused.collect()
    assert not gone.ok and gone.status is None and gone.error


async def test_process_probe_sees_a_real_process_and_its_tree_and_its_exit():
    child = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
         "print(p.pid, flush=True)\ntime.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        grandchild = int(child.stdout.readline())
        probe = ProcessProbe(child.pid, clock=ManualClock(), returncode=child.poll)
        (alive,) = await probe.collect()
        assert alive.alive and alive.pid == child.pid and grandchild in alive.tree_pids
        child.kill()
        child.wait(30)
        (dead,) = await probe.collect()
        assert not dead.alive and dead.exit_code == -9
        # attached (no returncode): a PID that is gone reads dead
        (attached,) = await ProcessProbe(child.pid, clock=ManualClock()).collect()
        assert not attached.alive
    finally:
        child.kill()
        child.wait(30)
        import os, signal
        try:
            os.kill(grandchild, signal.SIGKILL)
        except (ProcessLookupError, NameError, UnboundLocalError):
            pass
