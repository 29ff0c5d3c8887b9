"""Loopback ports for servers a test starts on a port it names up front.

``free_port()`` used to bind port 0 and close the socket: under pytest-xdist
another worker (or any process's bind 0 or outgoing connection) could take that
port before the test's server bound it, and a readiness probe would then talk to
the wrong server. Where a server can report the port it bound (``soak sim
--port 0 --port-file``, an aiohttp TestServer), tests use that instead; for the
rest (Prometheus, the Pushgateway, a target URL nothing may answer on, the exporter
port a Prometheus config must name before the run starts) this hands out ports:

- from below the kernel's ephemeral range (32768-60999 by default), so no port-0
  bind and no outgoing connection on this machine is ever given one of them;
- from a block of its own per xdist worker (PYTEST_XDIST_WORKER=gwN), so two
  workers never hand out the same port;
- never the same port twice within a worker (a counter walks the block), so a
  server a finished test left dying cannot answer a later test.

A port something outside the suite holds is skipped (checked by binding it).
"""

from __future__ import annotations

import os
import random
import socket

BASE = 20000
BLOCK = 500  # 24 workers fit under 32000


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    digits = "".join(ch for ch in worker if ch.isdigit())
    return int(digits or 0) % 24


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_start = BASE + _worker_index() * BLOCK
# A random starting point in the block: two suites run side by side on one machine
# (helpers on a shared box) rarely start on the same port.
_next = random.randrange(BLOCK)


def free_port() -> int:
    """A loopback port no other test of this run will be given, and free right now."""
    global _next
    assert _start + BLOCK <= _ephemeral_low(), "the test port blocks overlap the ephemeral range"
    for _ in range(BLOCK):
        port = _start + _next % BLOCK
        _next += 1
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # held by something outside the suite
            return port
    raise RuntimeError(f"no free port in {_start}-{_start + BLOCK - 1}")
