"""What the real vLLM 0.32.0 (CPU build, PP 2) sent, read by the harness's own parsers.

The bytes under tests/fixtures/real_vllm/ were recorded from a live server
(tests/real_vllm/record_fixtures.py; the log lines cut from its server.log).
These tests run everywhere, real vLLM or not: a parser change that stops
reading the real formats fails here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from soak.errors import TransportError
from soak.load.client import StreamingClient
from soak.load.config import TimeoutsConfig
from soak.load.progress import ProgressTracker
from soak.load.sse import SSEDecoder
from soak.metric_names import engine_core_title, worker_title
from soak.probes.logwatch import parse_log_line
from soak.probes.metrics import parse_metrics
from soak.workload.counters import TargetCounter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "real_vllm"


def _events(name: str) -> list:
    decoder = SSEDecoder()
    raw = (FIXTURES / name).read_bytes()
    events = []
    for i in range(0, len(raw), 37):  # odd chunk boundaries, as TCP delivers them
        events += decoder.feed(raw[i:i + 37])
    return events + decoder.flush()


def test_metrics_exposition_gives_every_counter_the_rules_read():
    parsed = parse_metrics((FIXTURES / "metrics.txt").read_text())
    v = parsed.values
    # three requests of 12 tokens each were served before the scrape
    assert v["generation_tokens"] == 36 and v["request_success"] == 3
    # vLLM's own prefix accounting: the warm chat hit 640 of its tokens
    assert v["prefix_cache_hits"] == 640 and v["prefix_cache_queries"] == v["prompt_tokens"] == 1522
    assert {"num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "num_preemptions"} <= set(v)
    # 0.32 no longer exposes the deprecated time_per_output_token histogram; nothing else lacks
    assert set(parsed.missing) <= {"time_per_output_token_seconds"}


@pytest.mark.parametrize("name, cached", [("sse_chat_cold.txt", None), ("sse_chat_warm.txt", 640), ("sse_completion.txt", None)])
def test_sse_streams_end_with_usage_then_done(name, cached):
    events = _events(name)
    assert events[-1].is_done
    usage = json.loads(events[-2].data)["usage"]
    assert usage["completion_tokens"] == 12
    details = usage.get("prompt_tokens_details") or {}
    # 0.x omits cached_tokens or reports 0 on a miss; the warm request hit the prefix cache
    assert (details.get("cached_tokens") or None) == cached
    content = [json.loads(e.data) for e in events[:-2]]
    assert all(c["choices"] for c in content)


@dataclass
class _Turn:
    path: str
    body: bytes
    session_id: str | None = "s"
    turn: int | None = 0
    planned_prompt_tokens: int | None = None
    max_tokens: int = 12


async def _replay_server(aiohttp_unused_port=None):
    """A fake that answers with the recorded bytes: the real framing, byte for byte."""

    async def stream(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("tool_choice") == "auto":
            rec = json.loads((FIXTURES / "chat_tool_choice_auto_400.json").read_text())
            return web.json_response(rec["body"], status=rec["status"])
        name = "sse_completion.txt" if request.path == "/v1/completions" else "sse_chat_warm.txt"
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        raw = (FIXTURES / name).read_bytes()
        for i in range(0, len(raw), 200):
            await response.write(raw[i:i + 200])
        await response.write_eof()
        return response

    tokenize = json.loads((FIXTURES / "tokenize.json").read_text())

    async def tokenize_handler(request: web.Request) -> web.Response:
        body = await request.json()
        if "prompt" in body:
            key = "completion"
        elif not body["messages"]:
            key = "empty_conversation"
        else:
            key = "chat_with_tools" if body.get("tools") else "chat_no_tools"
        return web.json_response(tokenize[key]["body"], status=tokenize[key]["status"])

    app = web.Application()
    app.router.add_post("/v1/chat/completions", stream)
    app.router.add_post("/v1/completions", stream)
    app.router.add_post("/tokenize", tokenize_handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


async def test_the_client_reads_usage_and_cached_tokens_from_the_real_stream():
    runner, base = await _replay_server()
    try:
        client = StreamingClient(base_url=base, timeouts=TimeoutsConfig(), tracker=ProgressTracker(), max_connections=4)
        await client.start()
        try:
            chat = await client.send(_Turn("/v1/chat/completions", b'{"tool_choice":"none"}'), request_id="a")
            completion = await client.send(_Turn("/v1/completions", b"{}"), request_id="b")
            refused = await client.send(_Turn("/v1/chat/completions", b'{"tool_choice":"auto"}'), request_id="c")
        finally:
            await client.aclose()
    finally:
        await runner.cleanup()
    assert (chat.outcome, chat.prompt_tokens, chat.cached_tokens, chat.output_tokens) == ("ok", 671, 640, 12)
    assert chat.finish_reason == "length"
    assert (completion.outcome, completion.output_tokens) == ("ok", 12)
    # the server without tool-parser flags: one clear line, not a mystery
    assert refused.outcome == "http_status" and refused.http_status == 400
    assert "--enable-auto-tool-choice" in (refused.error or "")


async def test_tokenize_answers_give_exact_counts_and_an_empty_conversation_is_refused():
    runner, base = await _replay_server()
    counter = TargetCounter(base, "tiny-llama")
    try:
        messages = [{"role": "system", "content": "x\n"}, {"role": "user", "content": "ping\n"}]
        assert await counter.count_chat(messages, [{"type": "function"}]) == 671
        assert await counter.count_chat(messages) == 467
        assert await counter.count_text("def f(x):\n") == 11
        with pytest.raises(TransportError, match="empty conversation"):
            await counter.count_chat([], [{"type": "function"}], add_generation_prompt=False)
    finally:
        await counter.aclose()
        await runner.cleanup()


def test_the_real_log_lines_match_their_signatures():
    expected = json.loads((FIXTURES / "log_lines.json").read_text())
    assert expected
    for case in expected:
        match = parse_log_line(case["line"])
        assert (match.signature if match else None) == case["signature"], case["line"]
        if match is not None:
            assert match.fatal == case["fatal"]
            for key, value in case.get("fields", {}).items():
                assert match.fields.get(key) == value, (key, case["line"])


def test_the_real_process_tree_has_the_titles_the_harness_knows():
    tree = json.loads((FIXTURES / "process_tree.json").read_text())
    procs = {p["pid"]: p for p in tree["processes"]}
    root = procs[tree["root"]]
    assert "vllm" in " ".join(root["cmdline"]) and "serve" in root["cmdline"]  # one API server: untitled
    titles = {p["cmdline"][0] for p in procs.values() if p["cmdline"]}
    assert {engine_core_title(), worker_title(0), worker_title(1)} <= titles
    engine = next(p for p in procs.values() if p["cmdline"][0] == engine_core_title())
    workers = [p for p in procs.values() if p["cmdline"][0].startswith("VLLM::Worker")]
    assert engine["ppid"] == root["pid"] and all(w["ppid"] == engine["pid"] for w in workers)
    # the multiprocessing resource tracker, a child of the API server, is part of the tree too
    tracker = [p for p in procs.values() if "resource_tracker" in " ".join(p["cmdline"])]
    assert len(tracker) == 1 and tracker[0]["ppid"] == root["pid"]


def test_a_real_hang_that_began_between_turns_is_caught_by_the_progress_rules():
    # Recorded samples of a real run (bench/real_vllm_hangs.py, hang 2): Worker_PP1
    # SIGSTOPped 0.7 s after every request had finished, as the next four were
    # sent. The engine, stuck in its step, never published new stats: the running
    # gauge stayed 0 while the client waited with 4 requests and no first token.
    # Before the fix only vLLM's own RPC timeout caught it, 300 s later.
    from soak.detect import Detector, DetectorConfig
    from soak.records import Topology
    from soak.detect.replay import replay
    from soak.store.rundir import read_samples

    stop_at = 1796295701.195
    detector = Detector(DetectorConfig(), topology=Topology.pipeline(2))
    result = replay(read_samples(FIXTURES / "hang_between_turns.samples.jsonl.gz"), detector)
    [decision] = result.decisions
    assert decision.rule == "generation_frozen"
    assert decision.decided_at - stop_at < 60
    assert decision.onset_at <= stop_at + 1
