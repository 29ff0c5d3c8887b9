"""Trace and request replay without a server: blocks, reuse arithmetic, parsing, timing."""

from __future__ import annotations

import json

from soak.tokens import tokenizer
from soak.workload import SimCounter, build_workload
from soak.workload.config import MooncakeTraceConfig, ReplayJsonlConfig, load_workload_file
from soak.workload.mooncake import parse_mooncake_rows, shared_prefix_tokens, trace_reuse_ratio
from soak.workload.plan import cached_whole_blocks
from soak.workload.sample_trace import synthesize_rows

from .helpers import WORKLOADS

SAMPLE = WORKLOADS / "traces" / "mooncake-sample.jsonl"


def test_the_shipped_sample_is_what_the_generator_makes():
    assert SAMPLE.read_text().splitlines() == [json.dumps(row) for row in synthesize_rows()]


def test_reuse_straight_from_hash_ids(tmp_path):
    trace = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 4, "hash_ids": [1, 2, 3]},
        {"timestamp": 10, "input_length": 1500, "output_length": 4, "hash_ids": [1, 2, 4]},
        {"timestamp": 20, "input_length": 1100, "output_length": 4, "hash_ids": [1, 2, 3]},
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parsed = parse_mooncake_rows(trace)
    assert shared_prefix_tokens(parsed) == [0, 1024, 1100]
    assert trace_reuse_ratio(parsed) == (1024 + 1100) / 3700
    # the server never serves the last token, and only whole blocks
    assert cached_whole_blocks(1100, 1100, 256) == 1024
    assert cached_whole_blocks(1024, 1500, 256) == 1024
    assert cached_whole_blocks(1000, 1500, 256) == 768


async def test_blocks_are_exact_and_shared_ids_share_text():
    config = MooncakeTraceConfig(path=SAMPLE, replay="timestamps", time_scale=4.0, limit=60)
    workload = build_workload(config, base_dir=WORKLOADS, seed=1, model="m")
    await workload.calibrate(SimCounter())
    arrivals = list(workload.arrivals())
    assert len(arrivals) == 60
    assert arrivals[5].offset_s == (workload.rows[5].timestamp_ms - workload.rows[0].timestamp_ms) / 1000 / 4.0
    texts = {}
    for arrival in arrivals:
        body = json.loads(arrival.request.body)
        assert arrival.request.path == "/v1/completions" and body["stream"] is True
        assert tokenizer.count(body["prompt"]) == arrival.request.planned_prompt_tokens
        texts[arrival.request.session_id] = body["prompt"]
    rows = workload.rows
    # two rows that share their first k ids share exactly their first k*512 tokens
    pieces = {row.line: tokenizer.pieces(texts[f"mooncake-{row.line}"]) for row in rows}
    pairs = [
        (x, y) for x in rows for y in rows
        if x.line < y.line and x.hash_ids[:2] == y.hash_ids[:2] and x.hash_ids[2] != y.hash_ids[2]
        and min(x.input_length, y.input_length) >= 1536
    ]
    assert pairs
    for a, b in pairs[:20]:
        assert pieces[a.line][:1024] == pieces[b.line][:1024]
        assert pieces[a.line][1024:1536] != pieces[b.line][1024:1536]
    plan = workload.plan(duration_s=None, concurrency=4, block_size=256)
    assert plan.requests == 60 and plan.hit_ratio is not None


def test_a_trace_path_is_sniffed_for_its_kind(tmp_path):
    assert load_workload_file(SAMPLE).kind == "mooncake_trace"
    requests = tmp_path / "agent.jsonl"
    requests.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    assert load_workload_file(requests).kind == "replay_jsonl"


async def test_jsonl_replay_groups_sessions_and_rewrites_bodies(tmp_path):
    path = tmp_path / "agent.jsonl"
    history = [{"role": "system", "content": "You are terse.\n"}, {"role": "user", "content": "list files\n"}]
    lines = [
        {"session_id": "a", "timestamp": 100.0, "body": {"model": "gpt-x", "messages": history, "max_tokens": 7, "tools": [{"type": "function", "function": {"name": "ls", "parameters": {}}}]}},
        {"session_id": "b", "timestamp": 101.5, "prompt": "def f():\n", "max_tokens": 3},
        {"session_id": "a", "timestamp": 103.0, "body": {"messages": history + [{"role": "assistant", "content": "ok\n"}]}},
        {"messages": [{"role": "user", "content": "alone\n"}], "timestamp": 104},
    ]
    path.write_text("".join(json.dumps(l) + "\n" for l in lines))
    workload = build_workload(ReplayJsonlConfig(path=path, default_max_tokens=11), base_dir=tmp_path, seed=0, model="served")
    await workload.calibrate(SimCounter())
    a = workload.new_session(0)
    first, second, end = a.next_turn(), a.next_turn(), a.next_turn()
    assert end is None and a.session_id == "a" and (first.turn, second.turn) == (0, 1)
    body = json.loads(first.body)
    assert body["model"] == "served" and body["max_tokens"] == 7 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True} and body["tools"][0]["function"]["name"] == "ls"
    assert json.loads(second.body)["max_tokens"] == 11
    assert first.planned_prompt_tokens == tokenizer.count(__import__("soak.tokens.chat", fromlist=["x"]).render_chat(history, body["tools"]))
    b = workload.new_session(1).next_turn()
    assert b.path == "/v1/completions" and json.loads(b.body)["prompt"] == "def f():\n"
    assert workload.new_session(2).session_id == "line-4" and workload.new_session(3) is None
    # repeated history is held once
    user = json.dumps(history[1], separators=(",", ":")).encode()
    held = [p for line in workload.lines for p in line.pieces if p == user]
    assert len(held) == 2 and held[0] is held[1]

    timed = build_workload(ReplayJsonlConfig(path=path, replay="timestamps", time_scale=2.0), base_dir=tmp_path, seed=0, model="served")
    await timed.calibrate(SimCounter())
    assert [a.offset_s for a in timed.arrivals()] == [0.0, 0.75, 1.5, 2.0]


def test_a_run_config_may_point_at_a_trace_or_workload_file_beside_it(tmp_path):
    from soak.config import load_run_config

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "trace.jsonl").write_text(SAMPLE.read_text())
    (tmp_path / "sub" / "wl.yaml").write_text("kind: mooncake_trace\npath: trace.jsonl\nlimit: 5\n")
    (tmp_path / "a.yaml").write_text("workload: sub/trace.jsonl\n")
    (tmp_path / "b.yaml").write_text("workload: sub/wl.yaml\n")
    a, b = load_run_config(tmp_path / "a.yaml").workload, load_run_config(tmp_path / "b.yaml").workload
    assert a.kind == b.kind == "mooncake_trace" and b.limit == 5
    assert a.path == b.path == (tmp_path / "sub" / "trace.jsonl")  # relative to the file that names it
