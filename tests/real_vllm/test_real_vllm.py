"""soak run against vLLM's own code (CPU build, PP 2, tiny Llama): hangs of every
form inside vLLM's pipeline, one server launch each, then a healthy stretch.

Marked real_vllm; skipped unless set up and asked for (scripts/real-vllm test).
One `soak run` carries the whole tier: the fault injector's plan
(scripts/real_vllm_faults.py) gives each launch the next fault and
`response.on_hang: restart` relaunches after each kill, so the tier pays one cold
start, not one per form. The extra test (vLLM's own RPC timeout) costs a launch
of its own and runs only with SOAK_REAL_VLLM_EXTRA=1.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from .conftest import alive, hangs_bench, launch_config, run_soak

pytestmark = [pytest.mark.real_vllm, pytest.mark.timeout(2400)]

STEP = 60  # each fault's step: past the first tokens, seconds into a launch's load
PLAN = [
    f"skip_send:rank=0:step={STEP}",   # (a) a send nobody gets: the next stage blocks in gloo's recv
    f"lag_send:rank=0:step={STEP}",    # (b) every send a step late: a step waits for one never scheduled
    f"spin_last:step={STEP}",          # (c) the last stage spins, deaf to SIGTERM
    f"sigstop:step={STEP}",            # the earlier tiers' stopped last stage
    "none",                            # healthy: must stay free of incidents
]
FAULTS = len(PLAN) - 1
# The load's time: one cold start (not counted), four hangs and relaunches, the rest
# healthy. SOAK_REAL_VLLM_TIER_DURATION shortens it where relaunches are quick.
DURATION = os.environ.get("SOAK_REAL_VLLM_TIER_DURATION") or "11m"
MIN_HEALTHY_S = 60.0  # the healthy stretch must be at least this long to mean anything
DETECT_BOUND_S = 90.0  # generous: the goal (10 s median, 20 s max) is the bench's to measure


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_plan_of_hangs_inside_vllm_each_caught_and_cleaned_up_then_a_healthy_stretch(tmp_path):
    bench = hangs_bench()
    # The run ends by its own duration, so the healthy launch's last requests drain
    # (an interrupt would cut them, and a cut request's tokens are the server's only).
    config, _ = launch_config(tmp_path, duration=DURATION)
    bench.plan_config(config, config, plan=PLAN, state_dir=tmp_path / "faults", max_restarts=FAULTS + 1)
    out = tmp_path / "run"
    soak = run_soak(config, out)
    watcher = bench.Watcher(out, give_up_s=DETECT_BOUND_S + 30)
    thread = watcher.start()
    try:
        soak.wait(timeout=2100)
    finally:
        if soak.poll() is None:
            soak.send_signal(signal.SIGTERM)  # a supervisor's stop: summary and report still written
            soak.wait(timeout=600)
        watcher.stop.set()
        thread.join(timeout=60)
    ran = (tmp_path / "run.out").read_text()[-3000:]
    summary = _summary(out)
    rows = bench.rows_for(out, watcher)
    for row in rows:
        print(f"{row['form']}: detected {row.get('detect_s')} s after the injector's stamp, rule {row.get('rule')}, "
              f"stage {row.get('stage_named')}, diagnosed rank {row.get('diagnosed_rank')}")
        for p in row.get("processes", []):
            print(f"    {p['title']:<22} {p['state']:<9} {p['cpu_pct']:>4}%  {p.get('py_spy', '')}")
    # every planned fault fired, on its own launch, in the plan's order
    assert [(r["plan"], r["form"]) for r in rows] == [(i, e.split(":")[0]) for i, e in enumerate(PLAN[:FAULTS])], ran
    incidents = summary["incidents"]
    assert len(incidents) == FAULTS, incidents  # and none in the healthy stretch
    report = (out / "report.html").read_text()
    for row in rows:
        assert_caught_and_cleaned_up(out, row, incidents, bench)
        assert row["rule"] in report
    relaunched = [e for e in watcher.events if e.get("type") == "restart_done"]
    [stopped] = [e for e in watcher.events if e.get("type") == "load_stopped"]
    healthy_s = stopped["ts"] - relaunched[FAULTS - 1]["ts"]
    print(f"healthy stretch {healthy_s:.0f} s")
    assert healthy_s >= MIN_HEALTHY_S, f"the healthy launch served {healthy_s:.0f} s of {DURATION}: a box this slow " \
        "needs a longer duration"
    assert_healthy_stretch(out, since=relaunched[FAULTS - 1]["ts"])


def assert_caught_and_cleaned_up(out: Path, row: dict, incidents: list[dict], bench) -> None:
    """One planned hang (a row of bench/real_vllm_hangs.py): detected by a hang rule,
    the whole tree killed, its /dev/shm files removed, the evidence collected."""
    form = row["form"]
    # detected: a hang rule, never the server's death or the bench's own kill
    assert not row["undetected"] and row.get("incident") is not None, form
    assert row["kind"] == "hang" and row["rule"] in bench.HANG_RULES, (form, row["rule"])
    assert 0 < row["detect_s"] < DETECT_BOUND_S, (form, row["detect_s"])
    incident = next(i for i in incidents if i["number"] == row["incident"])
    bundle = out / incident["evidence"]
    # the whole tree, resource tracker included, SIGKILLed and gone
    killed = set(incident["killed_pids"])
    assert set(row["tree"]) <= killed and {row["stamp"]["pid"], row["stamp"]["engine_pid"]} <= killed, form
    assert any("resource_tracker" in " ".join(p.get("cmdline") or []) for p in
               json.loads((bundle / "processes.json").read_text())["processes"]), form
    assert row["left"] == [], (form, row["left"])
    # no /dev/shm file of the tree left: the responder removed the rings it held
    assert row["shm_before"], f"{form}: the tree held no /dev/shm file?"
    assert row["shm_left"] == [], (form, row["shm_left"])
    cleanup = json.loads((bundle / "shm_cleanup.json").read_text())
    assert {s["path"] for s in cleanup["removed"]} >= set(row["shm_before"]), form
    # evidence: py-spy of the real processes, /metrics text, the log tail
    assert any("Thread" in p.read_text() for p in bundle.glob("py-spy-*.txt")), form
    assert "vllm:generation_tokens_total" in (bundle / "metrics.txt").read_text(), form
    assert "Worker_PP1" in (bundle / "log_tail.txt").read_text(), form


def assert_healthy_stretch(out: Path, *, since: float) -> None:
    """The launch from ``since`` on (plan entry none): no incident, every request
    answered, and the client's token totals equal that server's own counters."""
    events = _jsonl(out / "events.jsonl")
    assert not [e for e in events if e["type"] == "incident" and e["detected_at"] >= since]
    requests = [r for r in _jsonl(out / "requests.jsonl") if r["started_at"] >= since]
    assert requests and all(r["outcome"] == "ok" for r in requests), {r["outcome"] for r in requests}
    server = [s["values"] for s in _jsonl(out / "samples.jsonl")
              if s.get("kind") == "server" and s["ts"] >= since and s.get("ok")]
    assert server, "no scrape of the healthy server"
    final = {k: max(v.get(k) or 0.0 for v in server) for k in
             ("prompt_tokens", "generation_tokens", "prefix_cache_hits", "prefix_cache_queries")}
    # The oracle's canaries are server work the workload's records leave out (never counted as
    # workload): the server's counters hold both.
    canaries = [s for s in _jsonl(out / "samples.jsonl")
                if s.get("kind") == "canary" and (s.get("started_at") or s["ts"]) >= since]
    assert all(c.get("error") is None for c in canaries), [c.get("error") for c in canaries]
    prompt = sum(r["prompt_tokens"] for r in requests) + sum(c.get("prompt_tokens") or 0 for c in canaries)
    generated = sum(r["output_tokens"] for r in requests) + sum(c.get("output_tokens") or 0 for c in canaries)
    print(f"healthy stretch: {len(requests)} requests and {len(canaries)} canaries; prompt {prompt} "
          f"(server {final['prompt_tokens']:.0f}), generated {generated} "
          f"(server {final['generation_tokens']:.0f}), prefix hits {final['prefix_cache_hits']:.0f}/"
          f"{final['prefix_cache_queries']:.0f}")
    # every request's and canary's usage chunk against this server life's counters (a new server counts from 0)
    assert final["prompt_tokens"] == prompt
    assert final["generation_tokens"] == generated
    # cached tokens from vLLM's usage (--enable-prompt-tokens-details), hits from its counters
    assert sum(r.get("cached_tokens") or 0 for r in requests) > 0
    assert 0 < final["prefix_cache_hits"] < final["prefix_cache_queries"]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["counter"] == "exact (target /tokenize)"


def _injected(out: Path) -> dict:
    """The injector's own line in server.log: when and where it fired."""
    bench = hangs_bench()
    [stamp] = bench.read_stamps((out / "server.log").read_text(errors="replace"))
    return stamp


@pytest.mark.skipif(os.environ.get("SOAK_REAL_VLLM_EXTRA") != "1",
                    reason="a server launch of its own: SOAK_REAL_VLLM_EXTRA=1")
def test_vllms_own_rpc_timeout_and_engine_death_reach_the_log_rules_once(tmp_path):
    # Only the log and server_gone rules: the hang rules would decide first (no
    # stage source: the stage rules stay inactive).
    config, _ = launch_config(
        tmp_path, duration="25m",
        # the shm-broadcast line at vLLM's default 60 s, not the harness's 5 s: it would settle first
        env={"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "20", "SOAK_VLLM_FAULT": f"sigstop:step={STEP}",
             "VLLM_RINGBUFFER_WARNING_INTERVAL": "60"},
        detector={"generation_frozen": {"enabled": False}, "client_stall": {"enabled": False}},
        gpu="none",
    )
    out = tmp_path / "run"
    soak = run_soak(config, out)
    assert soak.wait(timeout=2100) == 1, (tmp_path / "run.out").read_text()[-3000:]
    summary = _summary(out)
    assert len(summary["incidents"]) == 1, summary["incidents"]
    [incident] = summary["incidents"]
    assert incident["rule"] in ("log_signature", "server_gone")
    signatures = {s["signature"] for s in _jsonl(out / "samples.jsonl") if s.get("kind") == "log"}
    assert "sample_tokens_timeout" in signatures or "execute_model_timeout" in signatures, signatures
    assert sum(1 for e in _jsonl(out / "events.jsonl") if e["type"] == "incident") == 1
    stamp = _injected(out)
    assert stamp["pid"] in incident["killed_pids"] and not [p for p in incident["killed_pids"] if alive(p)]
