"""soak run against vLLM's own code (CPU build, PP 2, tiny Llama): healthy, hung, dead.

Marked real_vllm; skipped unless set up and asked for (scripts/real-vllm test).
Each test launches its own server through the harness (minutes on two cores).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from .conftest import Stopper, alive, launch_config, run_soak

pytestmark = [pytest.mark.real_vllm, pytest.mark.timeout(2400)]


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _samples(out: Path, kind: str) -> list[dict]:
    rows = []
    with open(out / "samples.jsonl") as fh:
        for line in fh:
            row = json.loads(line)
            if row.get("kind") == kind:
                rows.append(row)
    return rows


def test_healthy_soak_passes_and_the_server_counters_match_the_client(tmp_path):
    config, _ = launch_config(tmp_path, duration="2m")
    out = tmp_path / "run"
    soak = run_soak(config, out, timeout=1800)
    assert soak.wait(timeout=2100) == 0, (tmp_path / "run.out").read_text()[-3000:]
    summary = _summary(out)
    assert summary["verdict"] == "pass" and summary["incidents"] == []
    assert summary["requests"]["ok"] > 0 and summary["requests"]["failed"] == 0
    # every request's usage chunk against vLLM's own counters, warm-up included
    assert summary["server_tokens"]["prompt"] == summary["tokens"]["prompt"]
    assert summary["server_tokens"]["generated"] == summary["tokens"]["generated"]
    # cached tokens from vLLM's usage (--enable-prompt-tokens-details), the ratio from its counters
    assert summary["tokens"]["cached"] > 0
    assert 0.5 < summary["prefix_cache_hit_ratio"] < 1.0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["counter"] == "exact (target /tokenize)"


def test_a_stopped_last_stage_is_caught_evidenced_and_its_whole_tree_killed(tmp_path):
    config, base = launch_config(tmp_path, duration="25m")
    out = tmp_path / "run"
    soak = run_soak(config, out, timeout=1800)
    stopper = Stopper(soak, base)
    stopper.start().join(timeout=1800)
    assert stopper.error is None, stopper.error
    assert soak.wait(timeout=600) == 1, (tmp_path / "run.out").read_text()[-3000:]
    summary = _summary(out)
    [incident] = summary["incidents"]
    # A real deadlock stops no process: the rules that fire read progress, not process state.
    assert incident["kind"] == "hang"
    assert incident["rule"] in ("generation_frozen", "client_stall")
    assert incident["detected_at"] - stopper.stop_at < 60
    record = json.loads((out / incident["evidence"] / "incident.json").read_text())
    assert record["decision"]["reasons"]
    # evidence: py-spy of the real processes, /metrics text, the log tail
    bundle = out / incident["evidence"]
    dumps = list(bundle.glob("py-spy-*.txt"))
    assert dumps, sorted(p.name for p in bundle.iterdir())
    assert any("Thread" in p.read_text() for p in dumps)
    assert "vllm:generation_tokens_total" in (bundle / "metrics.txt").read_text()
    assert "Worker_PP1" in (bundle / "log_tail.txt").read_text()
    # the whole tree, resource tracker included, SIGKILLed and gone
    tree_pids = {p["pid"] for p in stopper.tree}
    assert any("resource_tracker" in " ".join(p["cmdline"]) for p in stopper.tree)
    assert tree_pids <= set(incident["killed_pids"])
    assert not [pid for pid in tree_pids if alive(pid)]
    # and no /dev/shm segment of its own left behind
    assert stopper.shm, "the tree mapped no shared memory?"
    assert not [p for p in stopper.shm if os.path.exists(p)]
    cleanup = json.loads((bundle / "shm_cleanup.json").read_text())
    assert {s["path"] for s in cleanup["removed"]} >= stopper.shm
    # the report names the rule and why
    report = (out / "report.html").read_text()
    assert incident["rule"] in report


def test_vllms_own_rpc_timeout_and_engine_death_reach_the_log_rules_once(tmp_path):
    # Only the log and server_gone rules: the hang rules would decide first.
    config, base = launch_config(
        tmp_path, duration="25m",
        env={"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "20"},
        detector={"generation_frozen": {"enabled": False}, "client_stall": {"enabled": False}},
    )
    out = tmp_path / "run"
    soak = run_soak(config, out, timeout=1800)
    stopper = Stopper(soak, base, seed=7)
    stopper.start().join(timeout=1800)
    assert stopper.error is None, stopper.error
    assert soak.wait(timeout=600) == 1, (tmp_path / "run.out").read_text()[-3000:]
    summary = _summary(out)
    assert len(summary["incidents"]) == 1, summary["incidents"]
    [incident] = summary["incidents"]
    assert incident["rule"] in ("log_signature", "server_gone")
    signatures = {s["signature"] for s in _samples(out, "log")}
    assert "sample_tokens_timeout" in signatures or "execute_model_timeout" in signatures, signatures
    events = [json.loads(line) for line in open(out / "events.jsonl")]
    assert sum(1 for e in events if e["type"] == "incident") == 1
    assert not [p["pid"] for p in stopper.tree if alive(p["pid"])]


def _injected(out: Path) -> dict:
    """The injector's own line in server.log (scripts/real_vllm_faults.py): when and where it fired."""
    for line in (out / "server.log").read_text(errors="replace").splitlines():
        if "SOAK_FAULT_INJECTED " in line:
            return json.loads(line.split("SOAK_FAULT_INJECTED ", 1)[1])
    raise AssertionError("the fault never fired")


@pytest.mark.parametrize("fault", ["skip_send:rank=0:step=150", "spin_last:step=150"])
def test_a_fault_inside_vllms_own_pipeline_is_caught_and_its_whole_tree_killed(tmp_path, fault):
    # (a) a send the next stage never sees: it blocks in gloo's recv; (c) the last
    # stage spins deaf to SIGTERM. Every process stays alive: only progress tells.
    config, _ = launch_config(tmp_path, duration="25m", env={"SOAK_VLLM_FAULT": fault})
    out = tmp_path / "run"
    soak = run_soak(config, out, timeout=1800)
    assert soak.wait(timeout=2100) == 1, (tmp_path / "run.out").read_text()[-3000:]
    injected = _injected(out)
    [incident] = _summary(out)["incidents"]
    assert incident["kind"] == "hang"
    latency = incident["detected_at"] - injected["ts"]
    print(f"{fault}: detected {latency:.1f} s after the injector's own stamp, rule {incident['rule']}")
    assert 0 < latency < 60
    killed = set(incident["killed_pids"])
    assert injected["pid"] in killed and not [pid for pid in killed if alive(pid)]
