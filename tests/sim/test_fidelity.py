"""The simulator behaves as vLLM 0.11.2 by default, and as 0.33 when asked
(FACTS.md; the facts extracted from the wheels in soak/upstream/)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from soak.metric_names import parse_process_title
from soak.probes.logwatch import parse_log_line, strip_ansi
from soak.probes.metrics import parse_metrics
from soak.sim.config import SimConfig
from soak.sim.engine import Engine, SimRequest
from soak.sim.logs import SimLog
from soak.sim.metrics import SimMetrics
from ports import free_port as _free_port  # per-worker ports: tests/ports.py

MODEL = "deepseek-v4-flash"


async def _stream(session, url, body):
    async with session.post(url, json=body) as r:
        raw = await r.read()
    return [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: {")]


@pytest.mark.parametrize("version,tpot,reasons", [
    ("0.11.2", True, {"stop", "length", "abort"}),
    ("0.33.0", False, {"stop", "length", "abort", "error", "repetition"}),
])
async def test_version_endpoint_names_and_finish_reasons(sim_app, version, tpot, reasons):
    sim = await sim_app(SimConfig(vllm_version=version, log_stats_interval=0))
    async with aiohttp.ClientSession() as s:
        async with s.get(sim.base_url + "/version") as r:
            assert (await r.json())["version"] == version
        async with s.get(sim.base_url + "/metrics") as r:
            text = await r.text()
    families = {f.name for f in text_string_to_metric_families(text)}
    assert ("vllm:time_per_output_token_seconds" in families) == tpot
    found = {s.labels["finished_reason"] for f in text_string_to_metric_families(text)
             if f.name == "vllm:request_success" for s in f.samples if "finished_reason" in s.labels}
    assert found == reasons


@pytest.mark.parametrize("version,default_usage", [("0.11.2", True), ("0.33.0", False)])
async def test_include_usage_default_follows_the_version(sim_app, version, default_usage):
    sim = await sim_app(SimConfig(vllm_version=version, log_stats_interval=0, time_scale=50))
    body = {"model": MODEL, "prompt": "hello there\n", "max_tokens": 3, "stream": True}
    async with aiohttp.ClientSession() as s:
        given = await _stream(s, sim.base_url + "/v1/completions", {**body, "stream_options": {}})
        absent = await _stream(s, sim.base_url + "/v1/completions", body)
        explicit = await _stream(s, sim.base_url + "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    assert ("usage" in given[-1]) == default_usage
    assert "usage" not in absent[-1]  # no stream_options: no usage chunk in either version
    assert explicit[-1]["usage"]["completion_tokens"] == 3  # soak always asks


@pytest.mark.parametrize("version,omitted", [("0.11.2", True), ("0.33.0", False)])
async def test_cached_field_at_zero(sim_app, version, omitted):
    sim = await sim_app(SimConfig(vllm_version=version, log_stats_interval=0, time_scale=50, block_size=16))
    body = {"model": MODEL, "prompt": "a cold prompt nobody sent before\n" * 3, "max_tokens": 2, "stream": True,
            "stream_options": {"include_usage": True}}
    async with aiohttp.ClientSession() as s:
        cold = (await _stream(s, sim.base_url + "/v1/completions", body))[-1]["usage"]
        warm = (await _stream(s, sim.base_url + "/v1/completions", body))[-1]["usage"]
    assert ("prompt_tokens_details" not in cold) == omitted
    if not omitted:
        assert cold["prompt_tokens_details"]["cached_tokens"] == 0
    assert warm["prompt_tokens_details"]["cached_tokens"] > 0


def test_prefix_queries_move_on_admission_and_iteration_tokens_only_with_output():
    config = SimConfig(pp_size=2, block_size=16, max_num_batched_tokens=64, num_speculative_tokens=0)
    metrics = SimMetrics(config)
    engine = Engine(config, observer=metrics)
    engine.add_request(SimRequest("r1", prompt_tokens=640, hashes=list(range(40)), stop_at=4,
                                  finish_reason="length", arrival=0.0))

    def values():
        return parse_metrics(metrics.render().decode()).values

    now, seen = 0.0, []
    while engine.has_work:
        result = engine.step(now)
        now = result.ends_at
        v = values()
        seen.append((result.has_prefill, sum(d.new_tokens for d in result.deltas), v["prefix_cache_queries"],
                     v["iteration_tokens_total_count"], v["kv_cache_usage_perc"]))
    prefill_only = [x for x in seen if x[0] and x[1] == 0]
    assert len(prefill_only) >= 8  # a chunked prefill: 640 tokens, 64 a step
    # queries: once, when the request was admitted, then flat through the prefill
    assert {x[2] for x in seen} == {640.0}
    # iteration tokens: untouched by steps that emitted nothing
    assert {x[3] for x in prefill_only} == {0.0}
    assert seen[-1][3] == sum(1 for x in seen if x[1] > 0)
    # KV usage still moves during the prefill (what keeps generation_frozen quiet)
    assert len({x[4] for x in prefill_only}) > 1


def test_log_prefix_is_ansi_coloured_as_0112_and_plain_as_033():
    for version, coloured in (("0.11.2", True), ("0.33.0", False)):
        out = io.StringIO()
        log = SimLog(stream=out, pid=77, ansi=SimConfig(vllm_version=version).profile.ansi_log_prefix)
        log.error("core.py:1", "TimeoutError: RPC call to execute_model timed out.", who="EngineCore_DP0")
        line = out.getvalue()
        assert ("\x1b[1;36m(EngineCore_DP0 pid=77)\x1b[0;0m" in line) == coloured
        match = parse_log_line(line)
        assert match is not None and match.fields == {"worker": "EngineCore_DP0", "pid": 77, "method": "execute_model"}
        assert strip_ansi(line).startswith("(EngineCore_DP0 pid=77) ERROR")


def _health(port: int) -> int | str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError, OSError):
        return "refused"


def _sim(tmp_path, *args: str, env: dict | None = None) -> tuple[subprocess.Popen, int, object]:
    port = _free_port()
    out = tmp_path / f"sim-{port}.log"
    proc = subprocess.Popen([sys.executable, "-m", "soak", "sim", "--port", str(port), "--no-processes",
                             "--log-stats-interval", "0", *args],
                            stdout=open(out, "w"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    return proc, port, out


def _wait_for_line(out, text: str, proc, seconds: float = 90.0) -> None:
    deadline = time.monotonic() + seconds  # a loaded CI box can take many seconds to import
    while text not in out.read_text() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert text in out.read_text(), out.read_text()[-2000:]


def _poll(port: int, proc: subprocess.Popen, seconds: float, until=None) -> list:
    seen, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        status = _health(port)
        if not seen or seen[-1] != status:
            seen.append(status)
        if until is not None and until(seen):
            return seen
        time.sleep(0.05)
    if proc.poll() is not None:
        seen.append(f"exit {proc.returncode}")
    return seen


def test_refused_while_loading_then_503_after_engine_death_then_refused(tmp_path):
    # time_scale 2: 2 s of loading, 2 s ready, 2.5 s of 503 before the shutdown
    proc, port, out = _sim(tmp_path, "--startup-delay", "4", "--time-scale", "2", "--fault", "crash:at=8")
    try:
        _wait_for_line(out, "simulator: loading", proc)
        seen = _poll(port, proc, 60.0, until=lambda s: len(s) >= 4)
    finally:
        proc.kill()
        proc.wait()
    # loading: no listener; ready: 200; engine dead: 503; ~5 s later the server has gone
    assert seen[:4] in (["refused", 200, 503, "refused"], ["refused", 200, 503, "exit 1"]), seen
    assert "shutting down the API server" in out.read_text()


def test_keep_alive_on_engine_death_keeps_answering_503(tmp_path):
    proc, port, out = _sim(tmp_path, "--time-scale", "5", "--fault", "crash:at=2",
                           env={"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"})
    try:
        _wait_for_line(out, "EngineDeadError", proc)
        time.sleep(2.0)  # 10 sim s after death, twice the 5 s at which the API server would shut down
        seen = _poll(port, proc, 1.0)
    finally:
        proc.kill()
        proc.wait()
    assert seen == [503], seen
    assert "shutting down the API server" not in out.read_text()


def test_the_single_api_server_is_untitled(sim_process):
    sim = sim_process()
    with open(f"/proc/{sim.pid}/cmdline", "rb") as f:
        argv = [a.decode() for a in f.read().split(b"\0") if a]
    assert parse_process_title(argv) is None and "sim" in argv
