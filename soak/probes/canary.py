"""The canary probe: greedy requests beside the load, each answer judged by the
run's reference book (``soak.oracle.book``) and handed on as a ``CanarySample``.

Canaries go through the run's own ``OutboundSession`` (``soak.net``), each
bounded by ``soak.bounds.fetch`` with ``oracle.timeout``; never through the
load's client, so they are never workload: not in requests.jsonl, not in the
progress tracker, not in any throughput figure.

Pacing (``CanaryPacer``, pure): at most one canary in flight; at least
``oracle.interval`` between starts; and the canaries' share of server time at
most ``oracle.max_share``, where

    share = C / (C + L)

over the span since the probe started: C is the canaries' busy request-seconds
(each canary's whole request time), L the load's (the sum over its requests of
the time each was in flight, finished or not). A batching server shares its
steps among the requests in flight, so a canary's cost is its request-seconds
among all of them. When the load idles (think times, a drain), L grows slower
and canaries wait. A canary starts only when the share *after* it (its duration
estimated from its last run; a canary's first run, from the others' runs, or
nothing before any) stays within the bound, so the pacer waits longer after a
long canary. Every sample carries the running share.

A failed or timed-out canary is UNJUDGED with its error: a hang is the hang
rules' business. So is an answer that cannot be read (not JSON, no choices,
tokens of the wrong type): never a corruption. An answer without logprobs is
UNJUDGED and said once (the server cannot be judged).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from soak.bounds import fetch, loads_json
from soak.clock import Clock
from soak.events import Emit, EventType
from soak.oracle.answer import Answer, CanaryPrompt, answer_from_body
from soak.oracle.compare import usable
from soak.redact import clip
from soak.samples import CanarySample, CanaryVerdict, RequestRecord, Sample, ServerSample

BAD = (CanaryVerdict.CORRUPT, CanaryVerdict.CROSSTALK)
GOOD = (CanaryVerdict.MATCH, CanaryVerdict.EXPLAINED, CanaryVerdict.REFERENCE)
# The evidence's answers keep this many tokens on each side of the first difference.
EVIDENCE_TOKENS = 16
EVIDENCE_TEXT_CHARS = 2000
NO_LOGPROBS = "the server returns no logprobs: the oracle cannot judge"
# The longest a pacer waits before it looks again (the load's busy time moves on).
MAX_POLL_S = 5.0
CUT = "cut: the run ended while it was in flight"
MIN_POLL_S = 0.02


@dataclass(frozen=True)
class Canary:
    """One prompt as it is sent: the prompt and its request body, serialized once."""

    prompt: CanaryPrompt
    body: bytes


class CanaryPacer:
    """When the next canary may start (pure: every time is passed in)."""

    def __init__(self, *, interval_s: float, max_share: float, concurrency: int) -> None:
        self.interval_s = interval_s
        self.max_share = max_share
        self.concurrency = max(1, concurrency)
        self.canary_busy_s = 0.0
        self.last_start: float | None = None

    def share(self, load_busy_s: float, *, extra_s: float = 0.0) -> float:
        canary = self.canary_busy_s + extra_s
        denominator = canary + max(0.0, load_busy_s)
        return canary / denominator if denominator > 0 else 0.0

    def wait_s(self, *, now: float, load_busy_s: float, estimate_s: float) -> float:
        """Seconds to wait before starting a canary estimated to take ``estimate_s``
        (0: start now)."""
        wait = 0.0 if self.last_start is None else max(0.0, self.last_start + self.interval_s - now)
        if self.share(load_busy_s, extra_s=estimate_s) > self.max_share:
            # The load must be busy this many request-seconds longer: at best c of them a second.
            needed = (self.canary_busy_s + estimate_s) * (1.0 / self.max_share - 1.0)
            wait = max(wait, (needed - load_busy_s) / self.concurrency, MIN_POLL_S)
        return wait

    def started(self, at: float) -> None:
        self.last_start = at

    def finished(self, busy_s: float) -> None:
        self.canary_busy_s += max(0.0, busy_s)


class LoadBusy:
    """The load's busy request-seconds since ``since``: finished requests from
    their records, those in flight from the progress tracker."""

    def __init__(self, *, since_wall: float, since_mono: float, tracker: Any = None) -> None:
        self._since_wall, self._since_mono = since_wall, since_mono
        self._tracker = tracker
        self.finished_s = 0.0
        self.longest_s = 0.0

    def add(self, record: RequestRecord) -> None:
        span = record.ended_at - max(record.started_at, self._since_wall)
        if span > 0:
            self.finished_s += span
        self.longest_s = max(self.longest_s, record.ended_at - record.started_at)

    def busy_s(self, mono_now: float) -> float:
        live = 0.0
        for _, stream in self.in_flight():
            live += max(0.0, mono_now - max(stream.started_at, self._since_mono))
        return self.finished_s + live

    def in_flight(self) -> list:
        return list(self._tracker.streams()) if self._tracker is not None else []


def _window(answer: Mapping[str, Any], position: int | None) -> dict[str, Any]:
    """An answer's JSON with its tokens cut to those around ``position``."""
    tokens = answer.get("tokens") or []
    centre = position if position is not None else 0
    lo = max(0, centre - EVIDENCE_TOKENS)
    out = dict(answer)
    out["tokens"] = tokens[lo:centre + EVIDENCE_TOKENS + 1]
    out["tokens_from"] = lo
    out["tokens_total"] = len(tokens)
    out["text"] = clip(str(answer.get("text") or ""), EVIDENCE_TEXT_CHARS)
    return out


class CanaryProbe:
    """Sends the canaries, one at a time, until ``aclose()``."""

    name = "canary"

    def __init__(self, canaries: Sequence[Canary], *, base_url: str, session: Any, book: Any,
                 on_sample: Callable[[Sample], None], emit: Emit, clock: Clock, interval_s: float,
                 max_share: float, timeout_s: float, concurrency: int, tracker: Any = None,
                 api_key: str | None = None) -> None:
        self.canaries = tuple(canaries)
        self._url = base_url.rstrip("/") + "/v1/chat/completions"
        self._session = session
        self.book = book
        self._on_sample = on_sample
        self._emit = emit
        self._clock = clock
        self._timeout_s = timeout_s
        self._headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self.pacer = CanaryPacer(interval_s=interval_s, max_share=max_share, concurrency=concurrency)
        self._tracker = tracker
        self.load: LoadBusy | None = None
        self._task: asyncio.Task[None] | None = None
        self._estimates: dict[str, float] = {}
        self._said_no_logprobs = False
        self.server: ServerSample | None = None  # the latest good scrape: the server's state at a bad canary
        self.sent = 0
        self.bad = 0
        self._stopping = False
        self._in_flight = False

    # -- what the run feeds in ---------------------------------------------------
    def observe(self, sample: Sample) -> None:
        if isinstance(sample, ServerSample) and sample.ok:
            self.server = sample

    def note_request(self, record: RequestRecord) -> None:
        if self.load is not None:
            self.load.add(record)

    # -- the loop ------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None and self.canaries:
            self.load = LoadBusy(since_wall=self._clock.now(), since_mono=self._clock.monotonic(),
                                 tracker=self._tracker)
            # The first canary waits an interval too: the share has the load's time to stand on.
            self.pacer.started(self._clock.monotonic())
            self._task = asyncio.create_task(self._run(), name="soak-canaries")

    async def aclose(self, *, grace_s: float = 0.0) -> None:
        """No canary starts after this; one in flight has ``grace_s`` to be answered
        (the server counts its tokens either way, so the record should too), then it
        is cut and recorded as cut. Idempotent."""
        self._stopping = True
        task, self._task = self._task, None
        if task is None:
            return
        if grace_s > 0 and self._in_flight:
            await asyncio.wait({task}, timeout=grace_s)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        assert self.load is not None
        index = 0
        while not self._stopping:
            canary = self.canaries[index % len(self.canaries)]
            index += 1
            while True:
                wait = self.pacer.wait_s(now=self._clock.monotonic(), load_busy_s=self.load.busy_s(self._clock.monotonic()),
                                         estimate_s=self._estimate(canary))
                if wait <= 0:
                    break
                await asyncio.sleep(min(wait, MAX_POLL_S))
            if self._stopping:  # a grace period is for the canary in flight, not for a new one
                return
            try:
                self._on_sample(await self.ask(canary))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the probe's own bug: said, and the next canary still goes
                self._emit(EventType.WARNING, message=clip(f"canary probe: {type(exc).__name__}: {exc}", 300))

    def _estimate(self, canary: Canary) -> float:
        """How long ``canary`` will take: its last run; never run yet, the mean of the
        canaries run so far (none yet: 0, so the night's first canary goes after one
        interval and is measured; its share is in its sample)."""
        known = self._estimates.get(canary.prompt.canary_id)
        if known is not None:
            return known
        runs = list(self._estimates.values())
        return sum(runs) / len(runs) if runs else 0.0

    async def ask(self, canary: Canary) -> CanarySample:
        """One canary sent, read and judged; never raises for what the server sent."""
        prompt = canary.prompt
        started_wall, started = self._clock.now(), self._clock.monotonic()
        self.pacer.started(started)
        self.sent += 1
        error: str | None = None
        body: Any = None
        self._in_flight = True
        try:
            fetched = await fetch(self._session, self._url, total_s=self._timeout_s, method="POST",
                                  data=canary.body, headers=self._headers)
            if fetched.status != 200:
                error = f"HTTP {fetched.status}: {clip(fetched.body.decode('utf-8', 'replace'), 200)}"
            else:
                body = loads_json(fetched.body)
        except asyncio.CancelledError:
            # Cut (the run's end, past its grace): the server did some of its work, so it is
            # on the record, unjudged, never a verdict on the server.
            e2e = self._clock.monotonic() - started
            self.pacer.finished(e2e)
            self._on_sample(self._sample(CanaryVerdict.UNJUDGED, error=CUT, canary_id=prompt.canary_id,
                                         started_at=started_wall, e2e_s=round(e2e, 4), long=prompt.long))
            raise
        except (asyncio.TimeoutError, TimeoutError):
            error = f"timed out after {self._timeout_s:g}s"
        except Exception as exc:  # refused, reset, a redirect, a body past its bound, not JSON
            error = clip(f"{type(exc).__name__}: {exc}", 300)
        finally:
            self._in_flight = False
        e2e = self._clock.monotonic() - started
        self.pacer.finished(e2e)
        self._estimates[prompt.canary_id] = e2e
        common = dict(canary_id=prompt.canary_id, started_at=started_wall, e2e_s=round(e2e, 4), long=prompt.long)
        if error is not None:
            return self._sample(CanaryVerdict.UNJUDGED, error=error, **common)
        answer = answer_from_body(body)
        usage = body.get("usage") if isinstance(body, Mapping) else None
        prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, Mapping) else None
        common["prompt_tokens"] = prompt_tokens if type(prompt_tokens) is int else None
        common["output_tokens"] = len(answer.tokens)
        if answer.malformed == "no logprobs":
            if not self._said_no_logprobs:
                self._said_no_logprobs = True
                self._emit(EventType.WARNING, message=NO_LOGPROBS)
            return self._sample(CanaryVerdict.UNJUDGED, error=NO_LOGPROBS, **common)
        why = usable(answer)
        if why is not None:  # unreadable: not judged, never a corruption
            return self._sample(CanaryVerdict.UNJUDGED, error=clip(f"the answer cannot be judged: {why}", 300),
                                **common)
        reference = self.book.reference(prompt.canary_id)
        try:
            judgement = self.book.judge(prompt.canary_id, answer)
        except Exception as exc:  # the judge's own bug is no verdict on the server
            return self._sample(CanaryVerdict.UNJUDGED, error=clip(f"judge failed: {exc!r}", 300), **common)
        verdict = CanaryVerdict(judgement.verdict)
        evidence = self._evidence(judgement, reference, answer) if verdict in BAD else {}
        if verdict in BAD:
            self.bad += 1
        return self._sample(verdict, position=judgement.position, reference_source=self.book.source(prompt.canary_id),
                            crosstalk_with=judgement.crosstalk_with, error=None, evidence=evidence, **common,
                            reason=judgement.reason)

    def _sample(self, verdict: CanaryVerdict, *, reason: str | None = None, **fields: Any) -> CanarySample:
        now_mono = self._clock.monotonic()
        share = self.pacer.share(self.load.busy_s(now_mono)) if self.load is not None else None
        if reason and verdict in BAD:
            fields["evidence"] = {**fields.get("evidence", {}), "reason": reason}
        return CanarySample(ts=self._clock.now(), verdict=verdict,
                            share=None if share is None else round(share, 6), **fields)

    def _evidence(self, judgement: Any, reference: Answer | None, answer: Answer) -> dict[str, Any]:
        position = judgement.position
        server = self.server
        streams = self.load.in_flight() if self.load is not None else []
        now = self._clock.monotonic()
        return {
            "judgement": judgement.to_json(),
            "reference": _window(reference.to_json(), position) if reference is not None else None,
            "answer": _window(answer.to_json(), position),
            "server": None if server is None else {
                "ts": server.ts,
                "running": server.values.get("num_requests_running"),
                "waiting": server.values.get("num_requests_waiting"),
                "kv_cache_usage_perc": server.values.get("kv_cache_usage_perc"),
            },
            # The tracker knows each stream's age and tokens, not its prompt: the
            # batch's contexts are the requests.jsonl lines in flight at this time.
            "load": {
                "in_flight": len(streams),
                "streams": [{"age_s": round(now - s.started_at, 3), "tokens": s.tokens} for _, s in streams[:64]],
            },
        }

    def write_reference(self, path: str, *, header: Mapping[str, Any]) -> int:
        """The book's references to ``path`` (``soak.oracle.reference``); how many."""
        from soak.oracle.reference import ReferenceEntry, write_reference

        refs = self.book.references()
        by_id = {c.prompt.canary_id: c.prompt for c in self.canaries}
        entries = [ReferenceEntry(canary_id=cid, digest=by_id[cid].digest, max_tokens=by_id[cid].max_tokens,
                                  long=by_id[cid].long, answer=answer)
                   for cid, answer in refs.items() if cid in by_id]
        write_reference(path, header={**header, "recorded_at": self._clock.now()}, entries=entries)
        return len(entries)
