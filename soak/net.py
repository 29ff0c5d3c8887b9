"""The one way the harness talks HTTP to anything: its outbound sessions.

Invariant: traffic goes only to the URL the harness was given. No outbound call
of the harness (the streaming client, the probes, /version, /tokenize,
readiness, evidence capture, the Pushgateway push) ever follows a redirect: a
3xx answer is the call's outcome, ``RedirectRefused``, naming the status and
where it pointed (redacted), and nothing is sent to that place. A redirect the
harness followed would re-send the workload's prompts to another server and
measure it instead of the target, with no trace in the run.

aiohttp follows redirects per request (``allow_redirects`` defaults to True, and
``max_redirects=0`` means *no limit*), so a bare ``ClientSession`` is one
forgotten keyword away from following one. ``session()`` returns an
``OutboundSession`` whose every request is made here with
``allow_redirects=False`` and which cannot be asked otherwise; prometheus_client's
push takes ``push_handler``.
"""

from __future__ import annotations

import http.client
import socket
import threading
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import urlsplit

import aiohttp

from soak.errors import TransportError
from soak.printable import printable

# A Location is the server's text: kept short, and redacted (a signed URL carries its signature).
_LOCATION_CHARS = 300


def _redacted_location(location: str | None) -> str:
    if not location:
        return "(no Location header)"
    from soak.redact import Redactor

    return printable(Redactor().text(str(location)), limit=_LOCATION_CHARS)


class RedirectRefused(TransportError, aiohttp.ClientError):
    """A 3xx answer, not followed. A ``TransportError`` (a request's outcome,
    ``redirect`` in requests.jsonl) and an ``aiohttp.ClientError`` (so a probe
    that records any client error as a failed sample records this one)."""

    outcome = "redirect"

    def __init__(self, status: int, location: str | None, *, url: str = "") -> None:
        self.status = status
        self.location = _redacted_location(location)
        self.url = _redacted_location(url) if url else ""
        super().__init__(f"HTTP {status} redirect to {self.location} (not followed: traffic goes only to the target)")


def is_redirect(status: int) -> bool:
    return 300 <= status < 400


class _Call:
    """``async with session.get(...) as resp`` (or ``await``): the response, or
    ``RedirectRefused`` for a 3xx (its connection released first)."""

    __slots__ = ("_make", "_response")

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._response: aiohttp.ClientResponse | None = None

    async def _open(self) -> aiohttp.ClientResponse:
        response = await self._make()
        if is_redirect(response.status):
            location = response.headers.get("Location")
            await response.__aexit__(None, None, None)  # released as aiohttp's own context would
            raise RedirectRefused(response.status, location, url=str(response.url))
        return response

    def __await__(self):
        return self._open().__await__()

    async def __aenter__(self) -> aiohttp.ClientResponse:
        self._response = await (await self._open()).__aenter__()
        return self._response

    async def __aexit__(self, *exc: Any) -> None:
        if self._response is not None:
            response, self._response = self._response, None
            await response.__aexit__(*exc)


class OutboundSession:
    """An aiohttp session that never follows a redirect. It offers what the
    harness's callers use (``get``, ``post``, ``put``, ``request``, ``close``);
    ``allow_redirects`` and ``max_redirects`` are refused, not passed on."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self._session = session

    def request(self, method: str, url: str, **kwargs: Any) -> _Call:
        for name in ("allow_redirects", "max_redirects"):
            if name in kwargs:
                raise TypeError(f"{name} is not an option: the harness never follows a redirect")
        return _Call(lambda: self._session.request(method, url, allow_redirects=False, **kwargs))

    def get(self, url: str, **kwargs: Any) -> _Call:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> _Call:
        return self.request("POST", url, **kwargs)

    def put(self, url: str, **kwargs: Any) -> _Call:
        return self.request("PUT", url, **kwargs)

    @property
    def closed(self) -> bool:
        return self._session.closed

    async def close(self) -> None:
        await self._session.close()

    async def __aenter__(self) -> "OutboundSession":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def session(
    *,
    total_s: float | None = None,
    connect_s: float | None = None,
    headers: Mapping[str, str] | None = None,
    connector: aiohttp.BaseConnector | None = None,
    auto_decompress: bool = True,
) -> OutboundSession:
    """The harness's outbound session (call inside a running event loop).
    ``total_s`` bounds each call whole (None: the caller bounds it, as the
    streaming client does with its own deadlines)."""
    client = aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=total_s, sock_connect=connect_s),
        headers=dict(headers or {}),
        auto_decompress=auto_decompress,
        # Credentials in a URL are never sent: they go in headers (soak.target.config refuses them).
        trust_env=False,
    )
    return OutboundSession(client)


# --- the Pushgateway push (prometheus_client's push_to_gateway) -------------------------------

def push_handler(total_s: float) -> Callable[..., Callable[[], None]]:
    """A ``push_to_gateway`` handler that follows no redirect (a 3xx is
    ``RedirectRefused``) and whose whole call (connect, send, the answer) ends
    within ``total_s``: prometheus_client's own handler times each socket read,
    so a gateway that answered a byte every few seconds held a run for minutes.
    At the deadline the socket is shut, which ends any read under way."""

    def handler(url: str, method: str, timeout: float | None, headers: Sequence[tuple[str, str]],
                data: bytes) -> Callable[[], None]:
        def handle() -> None:
            parts = urlsplit(url)
            cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
            per_op = min(total_s, timeout) if timeout else total_s
            conn = cls(parts.hostname or "", parts.port, timeout=per_op)
            expired = threading.Event()

            def expire() -> None:
                expired.set()
                sock = conn.sock
                if sock is not None:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

            timer = threading.Timer(total_s, expire)
            timer.daemon = True
            timer.start()
            try:
                conn.connect()  # the name lookup has no timeout of its own: checked before a byte is sent
                if expired.is_set():
                    raise TimeoutError(f"the push did not finish within {total_s:g}s in total (bound total_time)")
                path = parts.path or "/"
                conn.request(method, path + (f"?{parts.query}" if parts.query else ""), body=data,
                             headers=dict(headers))
                resp = conn.getresponse()
                resp.read(64 * 1024)  # an answer body is a line or two; never more than this
                if is_redirect(resp.status):
                    raise RedirectRefused(resp.status, resp.getheader("Location"), url=url)
                if resp.status >= 400:
                    raise OSError(f"error talking to pushgateway: {resp.status} {resp.reason}")
            except (OSError, http.client.HTTPException) as exc:
                if expired.is_set():
                    raise TimeoutError(
                        f"the push did not finish within {total_s:g}s in total (bound total_time)") from exc
                raise
            finally:
                timer.cancel()
                conn.close()
            if expired.is_set():
                raise TimeoutError(f"the push did not finish within {total_s:g}s in total (bound total_time)")

        return handle

    return handler
