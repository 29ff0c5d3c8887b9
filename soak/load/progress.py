"""Client-side progress: bytes and tokens on every in-flight stream.

The streaming client updates a ``StreamProgress`` per request as chunks arrive
(two attribute writes a chunk, no allocation); the client-progress probe calls
``snapshot(now)`` on its own schedule. A stream silent for long while the GPUs
read busy is the hang's client-side face.

``tokens`` counts content chunks while a stream runs (a lower bound: with
speculative decoding a chunk carries several tokens) and becomes the server's
exact ``usage.completion_tokens`` once the usage chunk arrives, so finished
requests add exact counts to the totals.

Progress is generated tokens, not bytes. ``generated(now, n)`` is the one
place a stream is marked as having made progress; ``received`` only counts
bytes. An SSE comment (``: ping``), a keep-alive newline, a role chunk or a
usage chunk moves ``bytes`` and ``last_byte_at`` but never ``last_token_at``,
so a server that answers 200 and then sends only keep-alives is cut at the
first-token timeout, and one that stops generating is cut at the stall
timeout (``timeout_phase``), however many bytes it trickles.

Memory is bounded by the number of in-flight streams: a stream's entry goes
when it ends; only totals are kept.
"""

from __future__ import annotations

from enum import Enum

from typing import TYPE_CHECKING

from soak.samples import ClientSample

if TYPE_CHECKING:
    from soak.load.config import TimeoutsConfig


class StreamCut(str, Enum):
    """Why the harness cancelled an in-flight stream: the timeout of the phase the
    stream was in (``RequestTimeout.phase``), or an abort (drain, incident, interrupt)."""

    CONNECT = "connect"
    FIRST_TOKEN = "first_token"
    STALL = "stall"
    TOTAL = "total"
    ABORTED = "aborted"


class StreamProgress:
    """One in-flight stream. Times are monotonic seconds from the run's clock."""

    __slots__ = ("started_at", "first_token_at", "last_token_at", "last_byte_at", "bytes", "tokens", "cut")

    def __init__(self, started_at: float) -> None:
        self.started_at = started_at
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.last_byte_at = started_at
        self.bytes = 0
        self.tokens = 0
        # Set when the harness cancels the stream: by the client's deadline sweep
        # to the timeout that fired, or by an abort.
        self.cut: StreamCut | None = None

    def received(self, now: float, nbytes: int) -> None:
        """Bytes arrived: counted, and nothing more (bytes are not progress)."""
        self.last_byte_at = now
        self.bytes += nbytes

    def generated(self, now: float, tokens: int) -> None:
        """Generated output arrived (``tokens`` content choices): the stream progressed."""
        if self.first_token_at is None:
            self.first_token_at = now
        self.last_token_at = now
        self.tokens += tokens

    @property
    def progressed_at(self) -> float:
        """When the stream last progressed: its last generated token, else its start."""
        last = self.last_token_at if self.last_token_at is not None else self.first_token_at
        return last if last is not None else self.started_at


def timeout_phase(stream: StreamProgress, now: float, timeouts: "TimeoutsConfig") -> StreamCut | None:
    """The timeout ``stream`` has run past at ``now`` (monotonic), if any: the
    total; before the first generated token, the first-token timeout; after it,
    the stall timeout counted from the last generated token, never from the
    last byte (keep-alive comments and a trickle of bytes are not progress)."""
    if now - stream.started_at > timeouts.total:
        return StreamCut.TOTAL
    if stream.first_token_at is None:
        return StreamCut.FIRST_TOKEN if now - stream.started_at > timeouts.first_token else None
    if now - stream.progressed_at > timeouts.stall:
        return StreamCut.STALL
    return None


def _newest(*times: float | None) -> float | None:
    return max((t for t in times if t is not None), default=None)


class ProgressTracker:
    """Totals across the run plus the live set of streams.

    ``now`` passed to ``snapshot`` is unix seconds for the sample's ``ts``;
    ``mono`` is the monotonic time the streams' times are measured on.
    """

    def __init__(self) -> None:
        self._streams: dict[int, StreamProgress] = {}
        self._next_id = 0
        self._bytes_done = 0
        self._tokens_done = 0
        self.requests_done = 0
        self._last_token_done: float | None = None  # the newest last token of the ended streams

    def open(self, mono: float) -> tuple[int, StreamProgress]:
        self._next_id += 1
        stream = StreamProgress(mono)
        self._streams[self._next_id] = stream
        return self._next_id, stream

    def close(self, stream_id: int) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            self._bytes_done += stream.bytes
            self._tokens_done += stream.tokens
            self.requests_done += 1
            self._last_token_done = _newest(self._last_token_done, stream.last_token_at)

    def streams(self) -> list[tuple[int, StreamProgress]]:
        return list(self._streams.items())

    @property
    def in_flight(self) -> int:
        return len(self._streams)

    @property
    def tokens_total(self) -> int:
        return self._tokens_done + sum(s.tokens for s in self._streams.values())

    @property
    def bytes_total(self) -> int:
        return self._bytes_done + sum(s.bytes for s in self._streams.values())

    def snapshot(self, now: float, mono: float | None = None) -> ClientSample:
        """The progress sample at ``now`` (unix s). ``mono`` defaults to ``now``
        when the caller measures streams on the same clock."""
        mono = now if mono is None else mono
        streams = list(self._streams.values())
        streaming = [s for s in streams if s.first_token_at is not None]
        # Silence is time without a generated token (or since the start, before the first).
        max_silence = max((mono - s.progressed_at for s in streams), default=None)
        last_token = _newest(self._last_token_done, *(s.last_token_at for s in streams))
        return ClientSample(
            ts=now,
            in_flight=len(streams),
            bytes_total=self._bytes_done + sum(s.bytes for s in streams),
            tokens_total=self._tokens_done + sum(s.tokens for s in streams),
            requests_done=self.requests_done,
            max_silence_s=max(0.0, max_silence) if max_silence is not None else None,
            streaming=len(streaming),
            token_silence_s=None if last_token is None else max(0.0, mono - last_token),
        )
