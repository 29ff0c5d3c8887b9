"""Is this PID the server at that URL? Checked before any signal can reach it.

A PID in a config is a claim, not a fact: a placeholder left from an example,
a server restarted since, the operator's shell. The kill path trusts a PID only
when the kernel agrees:

- the process listening on the URL's port is the PID, or one of its descendants
  (vLLM's API server may sit under a launcher or a supervisor shell);
- the PID is not the harness, one of its ancestors, PID 0 or 1;
- just before a kill the PID still has the start time it had when it was checked
  (the kernel hands the numbers of dead processes to new ones).

The listener is the owner of the LISTEN socket on the port (``psutil``'s view
of ``/proc/net/tcp*`` and each process's fds), never a name or a title.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import psutil

from soak.errors import TargetMismatch
from soak.proc.facts import Pin
from soak.proc.read import describe, listeners, local_addresses, pin_of, protected_pids

_LOOPBACK_NAMES = {"localhost", "ip6-localhost", "ip6-loopback"}


def url_port(base_url: str) -> int | None:
    try:
        parts = urlsplit(base_url)
        port = parts.port
    except ValueError:
        return None
    if port is not None:
        return port
    return 443 if parts.scheme == "https" else 80


def is_local(base_url: str) -> bool:
    """The URL's host is this machine: loopback, or an address of one of its interfaces."""
    try:
        host = urlsplit(base_url).hostname
    except ValueError:
        return False
    if not host:
        return False
    if host in _LOOPBACK_NAMES or host.startswith("127.") or host == "::1":
        return True
    addresses = local_addresses()
    if host in addresses:
        return True
    try:
        return any(info[4][0] in addresses or info[4][0].startswith("127.")
                   for info in socket.getaddrinfo(host, None))
    except OSError:
        return False


def port_taken(port: int, host: str = "127.0.0.1") -> bool:
    """Something accepts connections on ``host:port`` (also a listener we cannot see)."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def in_tree(pid: int, root: int) -> bool:
    """``pid`` is ``root`` or one of its descendants."""
    if pid == root:
        return True
    try:
        return any(p.pid == root for p in psutil.Process(pid).parents())
    except psutil.Error:
        return False


def verify_attached(pid: int, base_url: str) -> Pin:
    """The attached ``pid`` serves ``base_url``; else ``TargetMismatch`` naming
    what listens there and what was given."""
    given = describe(pid)
    if pid in protected_pids():
        raise TargetMismatch(
            f"target.pid {pid} is the harness itself or one of its parents ({given}): refusing to attach to it"
        )
    ident = pin_of(pid)
    if ident is None:
        raise TargetMismatch(f"target.pid {pid}: no such process")
    if not is_local(base_url):
        raise TargetMismatch(
            f"target.pid {pid} given, but {base_url} is not on this machine: the PID cannot be checked against it"
        )
    port = url_port(base_url)
    owners = listeners(port) if port is not None else []
    if not owners:
        raise TargetMismatch(f"target.pid {pid} ({given}) does not serve {base_url}: nothing listens on port {port}")
    strangers = [o for o in owners if o is None or not in_tree(o, pid)]
    if strangers:
        there = ", ".join(describe(o) for o in strangers)
        raise TargetMismatch(
            f"target.pid {pid} does not serve {base_url}: port {port} is served by {there}; given {given}"
        )
    return ident


def verify_launch_port(base_url: str) -> None:
    """Before a launch: nothing may already serve the port the server is to bind."""
    port = url_port(base_url)
    if port is None or not is_local(base_url):
        return
    owners = listeners(port)
    host = urlsplit(base_url).hostname or "127.0.0.1"
    if owners or port_taken(port, "127.0.0.1" if host in _LOOPBACK_NAMES else host):
        there = ", ".join(describe(o) for o in owners) if owners else "a process this user cannot see"
        raise TargetMismatch(
            f"target.base_url {base_url}: port {port} already has a listener, {there} "
            f"(a leftover server?); stop it or launch on another port"
        )


def verify_launched_listener(base_url: str, root_pid: int) -> None:
    """After a launch is ready: the listener is the launched process or its descendant."""
    port = url_port(base_url)
    if port is None or not is_local(base_url):
        return
    owners = listeners(port)
    strangers = [o for o in owners if o is not None and not in_tree(o, root_pid)]
    if strangers:
        there = ", ".join(describe(o) for o in strangers)
        raise TargetMismatch(
            f"{base_url} is served by {there}, not by the launched server (pid {root_pid}): refusing to drive it"
        )
