"""`soak run` end to end, real processes on loopback: a healthy soak, a harness
SIGKILLed mid-run, SIGTERM to the harness, and an incident."""

from __future__ import annotations

import json
import platform
import signal
import subprocess
from pathlib import Path

import pytest

from soakrun_helpers import events, pid_alive, read_lines, scrape, small_config, soak_cmd, wait_for, write_config

from soak.events import EventType
from soak.judge import summarize

CONTRACT_FIELDS = ("verdict", "started_at", "ended_at", "duration_s", "requests", "tokens", "prefix_cache_hit_ratio", "incidents")


def test_healthy_soak_against_the_simulator_agrees_with_its_counters(tmp_path, sim_process, harness) -> None:
    sim = sim_process(time_scale=20)
    config = small_config(duration="5s", warmup="1s", probes={"gpu": {"kind": "sim"}})
    config["target"] = {"kind": "attached", "base_url": sim.base_url}
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "healthy.yaml", config), run_dir, html=True)
    assert h.wait() == 0, h.stderr
    assert "Traceback" not in h.stderr

    summary = json.loads((run_dir / "summary.json").read_text())
    for field in CONTRACT_FIELDS:
        assert field in summary, field
    assert summary["verdict"] == "pass" and summary["cut_off"] is False and summary["incidents"] == []
    assert summary["started_at"] < summary["ended_at"]
    assert 4.0 <= summary["duration_s"] < 15.0

    records = read_lines(run_dir / "requests.jsonl")
    ok = sum(r["outcome"] == "ok" for r in records)
    assert summary["requests"]["ok"] == ok > 10
    assert summary["requests"]["failed"] == len(records) - ok == 0
    assert summary["requests"]["warmup"] == sum(r["warmup"] for r in records) > 0

    # The simulator served nobody else: its counters are the run's.
    counters = scrape(sim.base_url)
    assert summary["tokens"]["prompt"] == counters["vllm:prompt_tokens_total"] == sum(r["prompt_tokens"] for r in records)
    assert summary["tokens"]["generated"] == counters["vllm:generation_tokens_total"]
    hits, queries = counters["vllm:prefix_cache_hits_total"], counters["vllm:prefix_cache_queries_total"]
    assert summary["prefix_cache_hit_ratio"] == pytest.approx(hits / queries, rel=1e-9)
    assert 0 < summary["prefix_cache_hit_ratio"] < 1

    # Samples from every probe, the plan, the redacted config, the report.
    kinds = {s["kind"] for s in read_lines(run_dir / "samples.jsonl")}
    assert {"server", "health", "gpu", "client"} <= kinds
    assert json.loads((run_dir / "plan.json").read_text())["requests"] > 0
    assert (run_dir / "config.yaml").read_text().count(sim.base_url) == 1
    assert (run_dir / "report.html").exists() and (run_dir / "junit.xml").exists()
    # Plain lines for a log, since stdout is not a terminal.
    assert "requests ok" in h.stdout_path.read_text()
    # The harness fixed malloc's thresholds for a long run, and said so.
    created = next(e for e in events(run_dir) if e["type"] == "run_created")
    assert created["heap"]["tuned"] is (platform.libc_ver()[0] == "glibc"), created
    if created["heap"]["tuned"]:  # and hands the heap's free pages back through the run
        assert "free pages returned every 60 s" in created["heap"]["how"], created


def test_default_simulator_target_is_started_and_stopped(tmp_path, harness, monkeypatch) -> None:
    monkeypatch.setenv("SOAK_TEST_API_KEY", "sk-secret-value")
    config = small_config(duration="3s")
    config["target"]["api_key_env"] = "SOAK_TEST_API_KEY"
    config["target"]["sim"]["seed"] = 3
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "sim.yaml", config), run_dir)
    assert h.wait() == 0, h.stderr
    pid = h.target_pid()
    assert pid is not None and not pid_alive(pid)
    assert "Uvicorn" in (run_dir / "server.log").read_text() or (run_dir / "server.log").stat().st_size > 0
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert b"sk-secret-value" not in path.read_bytes(), path
    summary = summarize(run_dir)
    assert summary["verdict"] == "pass" and summary["requests"]["ok"] > 0


def test_sigkill_mid_run_leaves_a_readable_cut_off_run(tmp_path, harness) -> None:
    config = small_config(duration="60s")
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "long.yaml", config), run_dir)
    requests = run_dir / "requests.jsonl"
    wait_for(lambda: requests.exists() and requests.stat().st_size > 4000, 60, "requests to be recorded")
    h.popen.send_signal(signal.SIGKILL)
    h.popen.wait(timeout=10)
    h.close()  # the orphaned simulator

    for name in ("events.jsonl", "requests.jsonl", "samples.jsonl"):
        raw = (run_dir / name).read_bytes()
        complete = raw[: raw.rfind(b"\n") + 1]
        for line in complete.splitlines():
            json.loads(line)
    summary = summarize(run_dir)
    assert summary["cut_off"] is True and summary["verdict"] == "aborted"
    assert summary["requests"]["ok"] == len(read_lines_complete(requests))
    assert summary["duration_s"] > 0

    report = subprocess.run(soak_cmd("report", str(run_dir)), capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    assert "cut off" in report.stdout
    assert json.loads((run_dir / "summary.json").read_text())["cut_off"] is True


def read_lines_complete(path: Path) -> list[dict]:
    raw = path.read_bytes()
    return [json.loads(line) for line in raw[: raw.rfind(b"\n") + 1].splitlines()]


def test_sigterm_stops_the_load_writes_the_summary_and_exits_130(tmp_path, harness) -> None:
    config = small_config(duration="60s")
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "term.yaml", config), run_dir)
    requests = run_dir / "requests.jsonl"
    wait_for(lambda: requests.exists() and requests.stat().st_size > 2000, 60, "requests to be recorded")
    h.popen.send_signal(signal.SIGTERM)
    assert h.wait(timeout_s=60) == 130, h.stderr
    assert "Traceback" not in h.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "aborted" and summary["cut_off"] is False
    assert summary["requests"]["ok"] > 0
    assert summary["duration_s"] < 50
    ended = [e for e in events(run_dir) if e["type"] == "run_ended"]
    assert ended and ended[0]["exit_code"] == 130 and "SIGTERM" in ended[0]["reason"]
    assert not pid_alive(h.target_pid())


def test_a_deadlock_is_an_incident_the_tree_is_killed_restarted_and_the_exit_is_1(tmp_path, harness) -> None:
    """on_hang: restart with max_restarts 1: hang, kill, restart, hang again, stop."""
    config = small_config(duration="60s")
    # Every simulator start deadlocks 60 simulated seconds (3 s at time_scale 20) in.
    config["target"]["sim"] = {"time_scale": 20, "faults": [{"kind": "pp_deadlock", "at": "60s"}]}
    config["response"] = {"on_hang": "restart", "max_restarts": 1,
                          "evidence": {"py_spy": False, "flight_recorder_wait": "1s"}}
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "hang.yaml", config), run_dir)
    assert h.wait(timeout_s=120) == 1, h.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "fail" and len(summary["incidents"]) == 2 and summary["restarts"] == 1
    assert "max_restarts (1) reached" in summary["stop_reason"]
    assert summary["duration_s"] < 55
    recorded = events(run_dir)
    first_pid = next(e["root_pid"] for e in recorded if e["type"] == "target_ready")
    restarted_pid = next(e["root_pid"] for e in recorded if e["type"] == "restart_done")
    assert restarted_pid != first_pid
    types = [e["type"] for e in recorded]
    assert set(types) <= {t.value for t in EventType}, set(types) - {t.value for t in EventType}
    assert [t for t in types if t.startswith(("incident", "restart"))] == [
        "incident_started", "incident", "restart_started", "restart_done", "incident_started", "incident"]
    for number, incident in enumerate(summary["incidents"], start=1):
        assert incident["kind"] == "hang" and incident["rule"]
        assert incident["onset_at"] <= incident["detected_at"]
        assert incident["killed_pids"] and incident["evidence"] == f"incidents/{number}"
        assert (run_dir / "incidents" / str(number) / "incident.json").exists()
        for pid in incident["killed_pids"]:
            assert not pid_alive(pid)
    assert {first_pid, restarted_pid} <= set(summary["incidents"][0]["killed_pids"] + summary["incidents"][1]["killed_pids"])


def test_a_fatal_log_line_is_judged_when_it_is_read_not_at_the_next_detector_tick(tmp_path, harness) -> None:
    """With a 30 s detector interval only the wake on a settling sample can decide
    the watchdog line (written about 6 s in) before the first tick. The GPU rule is off:
    its sequential evidence is ripe by then too, and the wake would decide whichever
    the box's timing put first (seen once in CI)."""
    config = small_config(duration="40s")
    config["target"]["sim"] = {"time_scale": 20, "faults": [{"kind": "pp_deadlock", "at": "60s"}]}
    config["detector"] = {"interval": "30s", "pp_tail_stall": {"enabled": False}}
    config["response"] = {"on_hang": "stop", "evidence": {"py_spy": False, "flight_recorder_wait": "1s"}}
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "wake.yaml", config), run_dir)
    assert h.wait(timeout_s=90) == 1, h.stderr
    (decision,) = [e for e in events(run_dir) if e["type"] == "decision"]
    assert decision["rule"] == "log_signature"
    line_read_at = decision["evidence"]["signals"]["lines"][0]["ts"]
    assert decision["decided_at"] - line_read_at < 2.0


def test_a_hang_before_the_tail_ever_worked_is_dated_from_the_launched_server_being_ready(tmp_path, harness) -> None:
    """The first life's deadlock with the first step: no reading ever saw the tail
    working, yet the onset is an interval, from the moment the launched server answered
    ready (the hang cannot precede it) to the first stuck reading, not a point."""
    config = small_config(duration="40s")
    # Due 1 simulated second after start (50 ms wall): long before ready, so it fires with the first step.
    config["target"]["sim"] = {"time_scale": 20, "faults": [{"kind": "pp_deadlock", "at": "1s"}]}
    config["response"] = {"on_hang": "stop", "evidence": {"py_spy": False, "flight_recorder_wait": "1s"}}
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "first.yaml", config), run_dir)
    assert h.wait(timeout_s=120) == 1, h.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    [incident] = summary["incidents"]
    assert incident["rule"] == "pp_tail_stall", incident
    recorded = events(run_dir)
    ready = next(e["ts"] for e in recorded if e["type"] == "target_ready")
    load = next(e["ts"] for e in recorded if e["type"] == "load_started")
    earliest, latest = incident["onset_earliest_at"], incident["onset_latest_at"]
    assert earliest is not None and ready <= earliest <= load  # bounded by the ready server, not invented
    assert earliest < latest <= incident["detected_at"]
    assert incident["detection_latency_s"]["point"] is False
