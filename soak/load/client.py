"""The streaming client: one aiohttp session (one connection pool) per run.

``send(request)`` posts one OpenAI-style streaming request and always returns a
``RequestRecord``: success or a classified failure (refused, reset, HTTP
status, which timeout, malformed stream). Failures never raise out of
``send``; only cancellation of the caller does.

Timeouts other than connect are enforced by one sweep over the in-flight
streams (``ProgressTracker``) a few times a second instead of a timer per
chunk: the hot path per chunk is a clock read, two attribute writes and the
SSE decoder.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping, Protocol

import aiohttp

from soak import net
from soak.bounds import content_codings
from soak.clock import Clock, SystemClock
from soak.errors import (
    ConnectionReset,
    ConnectRefused,
    HTTPStatusError,
    MalformedStream,
    RequestAborted,
    RequestTimeout,
    TransportError,
)
from soak.load.chunks import (ContentTemplate, Usage, counted_tokens, error_body_message, interpret, measure, preview,
                              usage_disagreement)
from soak.load.degenerate import DegenerateText
from soak.load.config import TimeoutsConfig
from soak.load.progress import ProgressTracker, StreamCut, StreamProgress, timeout_phase
from soak.load.sse import DEFAULT_MAX_CHARS, SSEDecoder
from soak.percentiles import percentile
from soak.redact import clip
from soak.samples import CutCause, RequestRecord

_ERROR_BODY_LIMIT = 2048
_MAX_ANOMALY_NOTES = 3
# The generated text kept for an exact count (``count_output``): past this the
# count is unknown and the claim is checked against the chunks only.
MAX_COUNTED_CHARS = 1 << 20


class TurnLike(Protocol):
    """What the client needs of a ``soak.workload`` ``TurnRequest``."""

    session_id: str | None
    turn: int | None
    path: str
    body: bytes
    planned_prompt_tokens: int | None
    max_tokens: int


class _Stream:
    """What one response taught us; filled in as chunks arrive."""

    __slots__ = ("first_at", "last_at", "gaps", "chunks", "usage", "finish_reason", "done", "status",
                 "anomalies", "anomaly_notes", "template", "events", "text_bytes", "substantive", "max_tokens",
                 "model", "model_changed", "degenerate", "kept", "kept_chars", "decoder")

    def __init__(self, max_tokens: int | None = None) -> None:
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.gaps: list[float] = []
        self.chunks = 0
        # What bounds the token count a server may claim (chunks.counted_tokens),
        # and whether any generated text was more than whitespace (chunks.measure).
        self.events = 0
        self.text_bytes = 0
        self.substantive = False
        self.max_tokens = max_tokens if type(max_tokens) is int and max_tokens >= 1 else None
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self.done = False
        self.status: int | None = None
        self.anomalies = 0
        self.anomaly_notes: list[str] = []
        self.template = ContentTemplate()
        self.model: str | None = None  # the first model a chunk named
        self.model_changed = False  # a later chunk named another (noted once)
        self.degenerate = DegenerateText()
        # The generated text, kept only where the run can count it exactly (None: not kept).
        self.kept: list[str] | None = None
        self.kept_chars = 0
        self.decoder: SSEDecoder | None = None

    def note(self, text: str) -> None:
        self.anomalies += 1
        if len(self.anomaly_notes) < _MAX_ANOMALY_NOTES:
            self.anomaly_notes.append(text)

    def text(self, text: str) -> None:
        self.degenerate.feed(text)
        kept = self.kept
        if kept is not None:
            self.kept_chars += len(text)
            if self.kept_chars > MAX_COUNTED_CHARS:
                self.kept = None  # too long to count: the claim meets the chunks only
            else:
                kept.append(text)


# Well below uvicorn's default keep-alive (5 s), which vLLM's API server keeps: the
# two clocks start at different moments (the server's at its last write, ours when
# the response is read), and on a loaded box the gap grew past 1 s (a real-vLLM CI
# night met the race once in 1,300 requests with 4 s; a box at load average 8, two
# real-vLLM tiers' worth of work on 2 cores, met it 4 times in 466 s with 2 s). A new
# loopback connection costs well under a millisecond.
IDLE_CONNECTION_S = 1.0


class StreamingClient:
    def __init__(
        self,
        *,
        base_url: str,
        timeouts: TimeoutsConfig,
        tracker: ProgressTracker,
        max_connections: int,
        api_key: str | None = None,
        clock: Clock | None = None,
        sweep_interval_s: float | None = None,
        max_event_chars: int = DEFAULT_MAX_CHARS,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        # usage -> cached prompt tokens or None; set by the run once GET /version is known.
        # It sees every usage (with prompt_tokens_details when the server sent them),
        # so it can learn that the server's details flag is on (soak.versions.CachedTokensReader).
        self.usage_cached_tokens: Callable[[Mapping[str, Any]], int | None] | None = None
        # The origin of RequestRecord.started_mono/ended_mono on this clock's
        # monotonic time line: the run store's (the run loop sets it); None: 0.
        self.mono_origin: float | None = None
        # text -> its tokens, by a tokenizer exact for the target, in process and cheap
        # (soak.workload.counters: SimCounter, LocalTokenizerCounter ``count_text_sync``);
        # set by the run. With it, output_tokens (and TPOT) are the tokens of the text
        # received, and a usage claim is held against them; None: no such counter.
        self.count_output: Callable[[str], int] | None = None
        self._max_event_chars = max_event_chars
        self._timeouts = timeouts
        self._tracker = tracker
        self._max_connections = max_connections
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
                         "Accept-Encoding": "identity"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._clock = clock or SystemClock()
        if sweep_interval_s is None:
            shortest = min(timeouts.first_token, timeouts.stall, timeouts.total)
            sweep_interval_s = min(1.0, max(0.05, shortest / 8))
        self._sweep_interval_s = sweep_interval_s
        self._session: net.OutboundSession | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._tasks: dict[int, asyncio.Task[Any]] = {}
        self._closed = False
        self._cuts: dict[int, tuple[str, CutCause]] = {}

    async def start(self) -> None:
        if self._session is not None:
            return
        # vLLM's uvicorn closes a connection idle for 5 s; a pooled one reused at that
        # moment meets its FIN and the request fails "Server disconnected" with no fault
        # of the server's (once in 1,344 requests of a 30-minute real soak). aiohttp
        # keeps idle connections 15 s by default: drop them before the server does.
        connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0, force_close=False,
                                         keepalive_timeout=IDLE_CONNECTION_S)
        # soak.net: a 3xx is this request's outcome (``redirect``), never followed elsewhere.
        self._session = net.session(connector=connector, connect_s=self._timeouts.connect, auto_decompress=False)
        self._sweeper = asyncio.create_task(self._sweep(), name="soak-client-deadlines")

    async def __aenter__(self) -> "StreamingClient":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            try:
                await self._sweeper
            except asyncio.CancelledError:
                pass
        if self._session is not None:
            await self._session.close()

    def abort_in_flight(self, reason: str, *, cut_by: CutCause = CutCause.DRAIN) -> int:
        """Cut every in-flight request short; each still yields its record
        (outcome ``aborted``, ``cut_by`` its ``CutCause``). Returns how many were cut."""
        try:
            cut_by = CutCause(cut_by)
        except ValueError:
            raise ValueError(f"unknown cut cause {cut_by!r}, known: {', '.join(c.value for c in CutCause)}") from None
        count = 0
        for stream_id, stream in self._tracker.streams():
            task = self._tasks.get(stream_id)
            if task is not None and stream.cut is None:
                stream.cut = StreamCut.ABORTED
                self._cuts[stream_id] = (reason, cut_by)
                task.cancel()
                count += 1
        return count

    async def _sweep(self) -> None:
        timeouts = self._timeouts
        while True:
            await asyncio.sleep(self._sweep_interval_s)
            now = self._clock.monotonic()
            for stream_id, stream in self._tracker.streams():
                if stream.cut is not None:
                    continue
                phase = timeout_phase(stream, now, timeouts)
                if phase is not None:
                    task = self._tasks.get(stream_id)
                    if task is not None:
                        stream.cut = phase
                        task.cancel()

    async def send(self, request: TurnLike, *, request_id: str, warmup: bool = False) -> RequestRecord:
        if self._session is None:
            raise RuntimeError("StreamingClient.send before start()")
        clock = self._clock
        started_wall = clock.now()
        t0 = clock.monotonic()
        stream_id, progress = self._tracker.open(t0)
        task = asyncio.current_task()
        assert task is not None
        self._tasks[stream_id] = task
        state = _Stream(getattr(request, "max_tokens", None))
        if self.count_output is not None:
            state.kept = []
        error: TransportError | None = None
        cut_by: CutCause | None = None
        try:
            await self._stream(request, progress, state)
        except asyncio.CancelledError:
            if progress.cut is None or task.uncancel() > 0:
                self._cuts.pop(stream_id, None)
                raise
            if progress.cut is StreamCut.ABORTED:
                reason, cut_by = self._cuts.pop(stream_id, ("aborted by the harness", CutCause.DRAIN))
                error = RequestAborted(reason)
            else:
                error = RequestTimeout(progress.cut.value, clock.monotonic() - t0)
        except net.RedirectRefused as exc:
            state.status = exc.status
            error = exc
        except TransportError as exc:
            error = exc
        except asyncio.TimeoutError as exc:  # aiohttp's sock_connect
            error = RequestTimeout(StreamCut.CONNECT.value, self._timeouts.connect)
            error.__cause__ = exc
        except aiohttp.ClientConnectorError as exc:
            error = ConnectRefused(str(exc))
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as exc:
            error = ConnectionReset(str(exc) or type(exc).__name__)
        except aiohttp.ClientResponseError as exc:
            error = MalformedStream(f"bad HTTP response: {exc.message}")
        except aiohttp.ClientError as exc:
            error = TransportError(f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            # Whatever the server's bytes make a library (or us) trip on is this
            # request's outcome, never the soak's end.
            error = MalformedStream(clip(f"the response could not be read: {type(exc).__name__}: {exc}", 300))
        finally:
            self._tasks.pop(stream_id, None)
            self._tracker.close(stream_id)
        return self._record(request, request_id, warmup, started_wall, t0, progress, state, error, cut_by)

    async def _stream(self, request: TurnLike, progress: StreamProgress, state: _Stream) -> None:
        assert self._session is not None
        mono = self._clock.monotonic
        async with self._session.post(
            self._base_url + request.path, data=request.body, headers=self._headers
        ) as response:
            state.status = response.status
            if response.status >= 400:
                body = await response.content.read(_ERROR_BODY_LIMIT)
                raise HTTPStatusError(response.status, error_body_message(body))
            coding = response.headers.get("Content-Encoding", "")
            if content_codings(coding):
                # The stream is read raw (auto_decompress off: an inflater on a stream has no
                # bound); a compressed one is the server's error, named, not fed to the decoder.
                raise MalformedStream(f"a compressed stream (Content-Encoding: {coding[:40]}), "
                                      "not read: the harness asks for identity")
            decoder = state.decoder = SSEDecoder(max_chars=self._max_event_chars)
            async for chunk in response.content.iter_any():
                now = mono()
                progress.received(now, len(chunk))
                for event in decoder.feed(chunk):
                    self._on_event(event.data, now, progress, state)
                if decoder.oversized:
                    raise MalformedStream(f"an SSE line or event longer than {self._max_event_chars} characters")
            for event in decoder.flush():
                self._on_event(event.data, mono(), progress, state)
        if not state.done:
            if decoder.oversized:
                raise MalformedStream(f"an SSE line or event longer than {self._max_event_chars} characters")
            if decoder.malformed_lines:
                raise MalformedStream(f"{decoder.malformed_lines} line(s) that are not SSE, no [DONE]")
            raise MalformedStream("stream ended before data: [DONE]")

    def _on_event(self, data: str, now: float, progress: StreamProgress, state: _Stream) -> None:
        if data == "[DONE]":
            state.done = True
            return
        if state.done:
            raise MalformedStream(f"data after [DONE]: {preview(data)}")
        state.events += 1
        template = state.template
        chunk = None
        text = template.content_of(data)
        if text is not None:
            content = 1  # the learned chunk's shape with another plain string: no parse needed
            size, solid = measure(text)
            state.text(text)  # the same model as the learned chunk: it is in the template's text
        else:
            chunk = interpret(data)
            content, size, solid = chunk.content, chunk.text_bytes, chunk.substantive
            if content:
                state.text(chunk.text)
                if not template.learned:
                    template.learn(data, chunk)
            model = chunk.model
            if model is not None and model != state.model:
                if state.model is None:
                    state.model = model
                elif not state.model_changed:
                    state.model_changed = True
                    state.note(f"the stream named model {state.model!r}, then {model!r}")
        if content:
            state.text_bytes += size
            if solid:
                state.substantive = True
            if state.first_at is None:
                state.first_at = now
            else:
                state.gaps.append(now - state.last_at)  # type: ignore[operator]
            state.last_at = now
            state.chunks += content
            progress.generated(now, content)
        if chunk is None:
            return
        if chunk.finish_reason is not None:
            state.finish_reason = chunk.finish_reason
        for anomaly in chunk.anomalies:
            state.note(anomaly)
        usage = chunk.usage
        if usage is not None:
            state.usage = usage
            # A content chunk carries one token, or several under speculative
            # decoding: chunks are only a lower bound until the usage chunk
            # gives the exact count (or every chunk does, with continuous_usage_stats),
            # within what the text so far can hold (chunks.counted_tokens).
            completion = usage.completion_tokens
            if completion is not None:
                completion, _ = counted_tokens(completion, chunks=state.chunks, text_bytes=state.text_bytes,
                                               events=state.events, max_tokens=state.max_tokens)
                if completion > progress.tokens:
                    progress.tokens = completion

    def _record(
        self,
        request: TurnLike,
        request_id: str,
        warmup: bool,
        started_wall: float,
        t0: float,
        progress: StreamProgress,
        state: _Stream,
        error: TransportError | None,
        cut_by: CutCause | None = None,
    ) -> RequestRecord:
        elapsed = self._clock.monotonic() - t0
        usage = state.usage or Usage()
        prompt_tokens = usage.prompt_tokens
        cached = usage.cached_tokens
        if state.usage is not None and not usage.cached_unreadable and self.usage_cached_tokens is not None:
            # Details left out: what that means depends on the version and on
            # whether this server has shown the details flag on (soak.versions:
            # 0 on 0.11.x with the flag on). Details given teach the reader the flag.
            shown: dict[str, Any] = {"prompt_tokens": prompt_tokens}
            if cached is not None:
                shown["prompt_tokens_details"] = {"cached_tokens": cached}
            cached = self.usage_cached_tokens(shown)
        # The server's count, unless what arrived cannot hold it (chunks.counted_tokens);
        # a refused claim is an anomaly on the record, the claim named.
        claimed = usage.completion_tokens
        output_tokens, refused = counted_tokens(claimed, chunks=state.chunks, text_bytes=state.text_bytes,
                                                events=state.events, max_tokens=state.max_tokens)
        streamed = self._streamed_tokens(state)
        if streamed is not None:
            # Counted from the text received: what throughput and TPOT stand on, never the claim.
            output_tokens = streamed
        notes = list(state.anomaly_notes)
        anomalies = state.anomalies
        if refused is not None:
            anomalies += 1
            notes.append(refused)
        disagreement = None if refused is not None else usage_disagreement(claimed, streamed=streamed,
                                                                           chunks=state.chunks)
        if disagreement is not None:
            anomalies += 1
            notes.append(disagreement)
        if not state.substantive and output_tokens > 0:
            # Whitespace alone (or nothing) is no output, whatever was claimed for it:
            # the request generated nothing (criteria.rules counts it as no_output).
            anomalies += 1
            notes.append(f"{output_tokens} token(s) counted for generated text that is only whitespace"
                         if state.text_bytes else
                         f"usage.completion_tokens {output_tokens} refused: no generated text arrived")
            output_tokens = 0
        ttft = state.first_at - t0 if state.first_at is not None else None
        itl_mean = itl_p50 = itl_p99 = itl_max = None
        if state.gaps:
            gaps = sorted(state.gaps)
            itl_mean = sum(gaps) / len(gaps)
            itl_p50 = percentile(gaps, 50, method="nearest_rank")
            itl_p99 = percentile(gaps, 99, method="nearest_rank")
            itl_max = gaps[-1]
        e2e = elapsed if error is None else None
        tpot = None
        if error is None and ttft is not None and output_tokens > 1:
            tpot = (elapsed - ttft) / (output_tokens - 1)
        origin = self.mono_origin if self.mono_origin is not None else 0.0
        return RequestRecord(
            request_id=request_id,
            session=request.session_id,
            turn=request.turn,
            started_at=started_wall,
            ended_at=started_wall + elapsed,
            outcome="ok" if error is None else error.outcome,
            prompt_tokens=prompt_tokens if isinstance(prompt_tokens, int) else request.planned_prompt_tokens,
            planned_prompt_tokens=request.planned_prompt_tokens,
            cached_tokens=cached if isinstance(cached, int) else None,
            output_tokens=output_tokens,
            ttft_s=ttft,
            itl_mean_s=itl_mean,
            itl_p50_s=itl_p50,
            itl_p99_s=itl_p99,
            itl_max_s=itl_max,
            tpot_s=tpot,
            e2e_s=e2e,
            bytes_sent=len(request.body),
            bytes_received=progress.bytes,
            http_status=state.status,
            error=None if error is None else str(error),
            warmup=warmup,
            finish_reason=state.finish_reason,
            cut_by=cut_by,
            anomalies=anomalies,
            anomaly_notes=tuple(notes),
            started_mono=round(t0 - origin, 6),
            ended_mono=round(t0 + elapsed - origin, 6),
            model=state.model,
            usage_output_tokens=claimed,
            degenerate=self._degenerate(state),
        )

    def _streamed_tokens(self, state: _Stream) -> int | None:
        """The tokens of the generated text received, where the run can count them exactly."""
        count = self.count_output
        if count is None or state.kept is None:
            return None
        try:
            return count("".join(state.kept))
        except Exception:  # a counter that trips is no count: the claim meets the chunks only
            return None

    @staticmethod
    def _degenerate(state: _Stream) -> str | None:
        if state.decoder is not None:
            state.degenerate.undecodable(state.decoder.undecodable)
        return state.degenerate.verdict

