"""The load generator against the in-process simulator over real loopback HTTP,
with a tiny stand-in workload: concurrency caps, session order and think time,
the request cap, open-loop arrivals, timestamped replay, warm-up, bounded drain."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import pytest
from aiohttp import web

from soak.load.client import StreamingClient
from soak.load.config import LoadConfig
from soak.load.generator import LoadGenerator
from soak.load.progress import ProgressTracker

MODEL = "deepseek-v4-flash"


@dataclass(frozen=True)
class Turn:
    session_id: str | None
    turn: int | None
    path: str
    body: bytes
    planned_prompt_tokens: int | None
    max_tokens: int
    think_time_s: float


def chat_turn(session: str, turn: int, *, think: float = 0.0, max_tokens: int = 4) -> Turn:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"session {session} turn {turn} " + "lorem ipsum " * 20}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return Turn(session, turn, "/v1/chat/completions", json.dumps(body).encode(), None, max_tokens, think)


class StandInSession:
    def __init__(self, index: int, turns: int, think: float) -> None:
        self.session_id = f"s{index}"
        self._turns = [chat_turn(self.session_id, t, think=think if t else 0.0) for t in range(turns)]

    def next_turn(self):
        return self._turns.pop(0) if self._turns else None


@dataclass(frozen=True)
class Arrival:
    offset_s: float
    request: Turn


class StandInWorkload:
    def __init__(self, *, sessions: int | None = None, turns: int = 3, think: float = 0.0, arrivals=None) -> None:
        self.mode = "arrivals" if arrivals is not None else "sessions"
        self._sessions = sessions
        self._turns = turns
        self._think = think
        self._arrivals = arrivals or []

    def new_session(self, index: int):
        if self._sessions is not None and index >= self._sessions:
            return None
        return StandInSession(index, self._turns, self._think)

    def arrivals(self):
        return iter(self._arrivals)


def max_overlap(records) -> int:
    edges = sorted([(r.started_at, 1) for r in records] + [(r.ended_at, -1) for r in records], key=lambda e: (e[0], e[1]))
    depth = peak = 0
    for _, step in edges:
        depth += step
        peak = max(peak, depth)
    return peak


@pytest.fixture
async def make_generator():
    clients: list[StreamingClient] = []

    async def make(base_url: str, workload, *, duration_s=5.0, warmup_s=0.0, **load):
        config = LoadConfig(**{"concurrency": 3, "drain": 5, **load})
        client = StreamingClient(base_url=base_url, timeouts=config.timeouts, tracker=ProgressTracker(),
                                 max_connections=config.concurrency)
        await client.start()
        clients.append(client)
        records = []
        generator = LoadGenerator(workload=workload, client=client, config=config, duration_s=duration_s,
                                  warmup_s=warmup_s, on_record=records.append, seed=1)
        return generator, records

    yield make
    for client in clients:
        await client.aclose()


async def test_closed_loop_keeps_the_cap_and_each_session_in_order(sim_app, make_generator) -> None:
    sim = await sim_app(time_scale=100)
    generator, records = await make_generator(sim.base_url, StandInWorkload(sessions=8, turns=3, think=0.05), concurrency=3)
    result = await generator.run()
    assert result.stop_reason == "workload exhausted"
    assert len(records) == 24 and all(r.outcome == "ok" for r in records)
    assert max_overlap(records) <= 3
    by_session: dict[str, list] = {}
    for r in records:
        by_session.setdefault(r.session, []).append(r)
    for turns in by_session.values():
        assert [r.turn for r in turns] == [0, 1, 2]
        for before, after in zip(turns, turns[1:]):
            assert after.started_at >= before.ended_at + 0.05  # think time before each later turn


async def test_request_cap_stops_at_exactly_n(sim_app, make_generator) -> None:
    sim = await sim_app(time_scale=100)
    generator, records = await make_generator(sim.base_url, StandInWorkload(turns=5), concurrency=4, max_requests=13)
    result = await generator.run()
    assert result.stop_reason == "request cap" and result.requests_sent == 13
    assert len(records) == 13 and len({r.request_id for r in records}) == 13


async def test_open_loop_arrivals_respect_the_cap_on_in_flight(sim_app, make_generator) -> None:
    sim = await sim_app(time_scale=100)
    generator, records = await make_generator(
        sim.base_url, StandInWorkload(turns=4), mode="open", rate=200.0, burstiness=0.5, concurrency=2, max_requests=30
    )
    result = await generator.run()
    assert result.requests_sent == 30 and len(records) == 30
    assert max_overlap(records) <= 2
    assert all(r.outcome == "ok" for r in records)


async def test_replay_sends_at_the_trace_offsets(sim_app, make_generator) -> None:
    sim = await sim_app(time_scale=100)
    arrivals = [Arrival(offset, chat_turn(None, None)) for offset in (0.0, 0.1, 0.3, 0.31, 0.6)]
    generator, records = await make_generator(sim.base_url, StandInWorkload(arrivals=arrivals), concurrency=8)
    wall_start = time.time()
    result = await generator.run()
    assert result.stop_reason == "workload exhausted" and len(records) == 5
    starts = sorted(r.started_at - wall_start for r in records)
    for got, planned in zip(starts, (0.0, 0.1, 0.3, 0.31, 0.6)):
        assert got >= planned - 0.01  # never early


async def test_warmup_requests_are_flagged(sim_app, make_generator) -> None:
    sim = await sim_app(time_scale=100)
    generator, records = await make_generator(sim.base_url, StandInWorkload(turns=2, think=0.05), duration_s=1.0,
                                              warmup_s=0.4, concurrency=2)
    await generator.run()
    first = min(r.started_at for r in records)
    assert any(r.warmup for r in records) and any(not r.warmup for r in records)
    for r in records:
        if r.warmup:
            assert r.started_at - first < 0.45
        else:
            assert r.started_at - first >= 0.35


async def stalling(request: web.Request) -> web.StreamResponse:
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n')
    await asyncio.sleep(60)
    return response


async def test_the_drain_is_bounded_and_cut_requests_are_recorded(make_generator) -> None:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", stalling)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        generator, records = await make_generator(f"http://127.0.0.1:{port}", StandInWorkload(turns=1),
                                                  duration_s=0.3, drain=0.3, concurrency=3)
        result = await generator.run()
        assert result.aborted_at_drain == 3
        assert [r.outcome for r in records] == ["aborted"] * 3
        assert result.drained_mono - result.stopped_mono < 10
    finally:
        await runner.cleanup()


async def test_stop_and_pause(sim_app, make_generator) -> None:
    sim = await sim_app(time_scale=100)
    generator, records = await make_generator(sim.base_url, StandInWorkload(turns=3), duration_s=30.0, concurrency=2)
    generator.pause()
    task = asyncio.create_task(generator.run())
    await asyncio.sleep(0.3)
    assert records == []  # paused: nothing goes out
    generator.resume()
    while len(records) < 4:
        await asyncio.sleep(0.02)
    generator.stop("operator")
    result = await asyncio.wait_for(task, 10)
    assert result.stop_reason == "operator"
