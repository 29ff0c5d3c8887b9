"""Issue 12, the verdict's side: `soak run` as a real process against servers that
fail their requests (a small independent fake where the simulator cannot
misbehave that way), odd stream shapes, an incident racing the end, stalled or
unparsable /metrics, and requests cut by the drain. What a nightly relies on:
exit code, verdict, the reason in summary.json, junit.xml."""

from __future__ import annotations

import json
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from soakrun_helpers import attached_config, events, read_lines, small_config, write_config


def inject_after_load_start(h, fault: dict, after_s: float) -> float:
    """POST /sim/fault to the run's simulator ``after_s`` after its load_started event;
    returns how long after load start it fired."""
    deadline = time.monotonic() + 90
    started = base_url = None
    while started is None or base_url is None:
        assert h.popen.poll() is None and time.monotonic() < deadline, "the run ended before its load started"
        try:
            for event in events(h.run_dir):
                if event["type"] == "target_ready":
                    base_url = event["base_url"]
                elif event["type"] == "load_started":
                    started = event["ts"]
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    time.sleep(max(0.0, started + after_s - time.time()))
    request = urllib.request.Request(base_url + "/sim/fault", data=json.dumps(fault).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200
    return time.time() - started


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def junit_cases(run_dir: Path) -> dict[str, ET.Element]:
    suite = ET.parse(run_dir / "junit.xml").getroot()
    return {case.get("name"): case for case in suite.findall("testcase")}


@pytest.mark.parametrize("mode, outcome", [
    ("http500", "http_status"),
    ("http400", "http_status"),
    ("garbage", "malformed_stream"),
    ("cut", "reset"),
    ("odd_shape", "malformed_stream"),
])
def test_a_server_that_fails_every_request_fails_the_soak(tmp_path, fake_vllm, harness, mode, outcome) -> None:
    config = attached_config(fake_vllm(mode).url, duration="3s")
    run_dir = tmp_path / "run"
    page_too = mode == "http500"  # the page says what the summary says, whatever the failure
    h = harness(write_config(tmp_path / f"{mode}.yaml", config), run_dir, html=page_too)
    assert h.wait() == 1, h.stderr
    assert "Traceback" not in h.stderr and "Session is closed" not in h.stderr
    summary = summary_of(run_dir)
    assert summary["verdict"] == "fail" and summary["exit_code"] == 1
    assert summary["incidents"] == []
    req = summary["requests"]
    assert req["ok"] == 0 and req["failed"] > 3
    assert req["by_outcome"][outcome] == req["failed"]
    # Failing every request is also doing no work (issue 32): both criteria say so.
    assert summary["criteria"]["failed"] == ["error_rate", "work_evidence"]
    reason = summary["verdict_reasons"][0]
    assert reason.startswith("error rate 100.0% is above the 5.0% allowed") and outcome in reason
    assert "error rate 100.0%" in summary["stop_reason"]
    assert "soak run: fail (error rate 100.0%" in h.stderr
    cases = junit_cases(run_dir)
    assert cases["criteria.error_rate"].find("failure") is not None
    assert cases["criteria.no_success"].find("failure") is None  # 3 s of failures: inside the 2 min window
    if page_too:
        page = (run_dir / "report.html").read_text()
        assert "Failure criterion error_rate" in page and "MTBF above" not in page


def test_a_stretch_of_failures_ends_the_soak_early(tmp_path, fake_vllm, harness) -> None:
    config = attached_config(fake_vllm("http500").url, duration="60s",
                             criteria={"no_success": {"window": "1.5s", "min_failures": 3}})
    run_dir = tmp_path / "run"
    started = time.monotonic()
    h = harness(write_config(tmp_path / "stretch.yaml", config), run_dir)
    assert h.wait() == 1, h.stderr
    assert time.monotonic() - started < 40  # not the 60 s duration
    summary = summary_of(run_dir)
    assert summary["verdict"] == "fail"
    assert set(summary["criteria"]["failed"]) == {"error_rate", "no_success", "work_evidence"}
    assert summary["stop_reason"].startswith("criterion no_success: requests kept failing for")
    breach = next(r for r in summary["criteria"]["results"] if r["name"] == "no_success")["evidence"]["breach"]
    assert breach["length_s"] >= 1.5 and breach["failures"] >= 3
    types = [e["type"] for e in events(run_dir)]
    assert "criterion_fail" in types and "criterion_at_risk" in types
    assert "WARNING no_success failed" in h.stdout_path.read_text()


def test_a_healthy_fake_passes_with_its_counts(tmp_path, fake_vllm, harness) -> None:
    """The control: the same fake serving well passes, so the failures above are the server's."""
    config = attached_config(fake_vllm("ok").url, duration="3s")
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "ok.yaml", config), run_dir)
    assert h.wait() == 0, h.stderr
    summary = summary_of(run_dir)
    assert summary["verdict"] == "pass" and summary["criteria"]["passed"] is True
    assert summary["requests"]["ok"] > 3 and summary["requests"]["failed"] == 0
    assert summary["server_metrics"]["complete"] is True and summary["server_metrics"]["note"] is None
    assert all(case.find("failure") is None for case in junit_cases(run_dir).values())


def test_requests_cut_by_the_drain_are_not_failures(tmp_path, fake_vllm, harness) -> None:
    config = attached_config(fake_vllm("slow_some").url, duration="3s", load={"concurrency": 3, "drain": "0.5s"})
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "drain.yaml", config), run_dir)
    assert h.wait() == 0, h.stderr
    summary = summary_of(run_dir)
    req = summary["requests"]
    assert req["cut_by_drain"] >= 1 and req["failed"] == 0, req
    assert req["by_outcome"]["aborted"] == req["cut_by_drain"]
    assert summary["verdict"] == "pass" and summary["criteria"]["passed"] is True
    cut = [r for r in read_lines(run_dir / "requests.jsonl") if r["outcome"] == "aborted"]
    assert cut and all(r["cut_by"] == "drain" for r in cut)
    suite = ET.parse(run_dir / "junit.xml").getroot()
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["cut_by_drain"] == str(req["cut_by_drain"]) and props["requests_failed"] == "0"


def test_unparsable_metrics_are_warned_and_the_summary_says_which_span_counts(tmp_path, fake_vllm, harness) -> None:
    config = attached_config(fake_vllm("metrics_garbage").url, duration="9s", probes={"metrics_interval": "0.5s"})
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "metrics.yaml", config), run_dir, html=True)
    assert h.wait() == 0, h.stderr
    summary = summary_of(run_dir)
    metrics = summary["server_metrics"]
    assert metrics["complete"] is False and metrics["stale_after"] is not None
    assert metrics["covered_from"] <= metrics["covered_to"] == metrics["stale_after"]
    assert "unparsable /metrics text" in metrics["note"] and "stale after +" in metrics["note"]
    stale = [e for e in events(run_dir) if e["type"] == "metrics_stale"]
    assert len(stale) == 1 and "unparsable" in stale[0]["error"]
    assert "soak: warning: /metrics stale since" in h.stdout_path.read_text()
    assert "Server metrics: server token totals and the prefix-cache hit ratio cover" in (run_dir / "report.html").read_text()


def test_a_stalled_metrics_endpoint_is_warned_and_the_summary_says_which_span_counts(tmp_path, harness) -> None:
    config = small_config(duration="8s", probes={"metrics_interval": "0.5s", "timeout": "1s"})
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "stall.yaml", config), run_dir)
    inject_after_load_start(h, {"kind": "metrics_stall"}, 2.0)
    assert h.wait() in (0, 1), h.stderr
    summary = summary_of(run_dir)
    metrics = summary["server_metrics"]
    assert metrics["complete"] is False and metrics["stale_after"] is not None
    assert summary["ended_at"] - metrics["stale_after"] > 3
    assert "stale after +" in metrics["note"]
    assert summary["server_tokens"]["generated"] is not None  # the figures up to the stall, said to be so
    assert any(e["type"] == "metrics_stale" for e in events(run_dir))
    assert "soak: warning: /metrics stale since" in h.stdout_path.read_text()


def test_a_workload_that_cannot_fit_the_target_is_refused_naming_both_numbers(tmp_path, harness) -> None:
    config = small_config(duration="3s")
    config["target"]["sim"]["max_model_len"] = 1500  # the workload's prompts start at 2000 tokens
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "toolong.yaml", config), run_dir)
    assert h.wait() == 3, h.stderr
    lines = [line for line in h.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in h.stderr, h.stderr
    assert "max_model_len 1,500" in lines[0] and "largest prompt is" in lines[0]
    plan = json.loads((run_dir / "plan.json").read_text())
    assert f"{plan['largest_request']['prompt_tokens']:,}" in lines[0]
    assert not (run_dir / "requests.jsonl").exists() or (run_dir / "requests.jsonl").read_text() == ""


def test_a_deadlock_in_the_last_seconds_is_in_the_summary(tmp_path, harness) -> None:
    """The deadlock begins about a second before the duration ends; the decision
    and the kill land after it. summary.json still lists the incident."""
    config = small_config(duration="4s", load={"concurrency": 3, "drain": "10s"},
                          detector={"pp_tail_stall": {"window": "1s"}})
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "late.yaml", config), run_dir)
    fired = inject_after_load_start(h, {"kind": "pp_deadlock"}, 3.2)
    assert h.wait(timeout_s=120) == 1, h.stderr
    assert fired < 4.0  # it began inside the duration
    summary = summary_of(run_dir)
    assert summary["verdict"] == "fail"
    assert [i["number"] for i in summary["incidents"]] == [1]
    incident = summary["incidents"][0]
    assert incident["kind"] == "hang" and incident["evidence"] == "incidents/1"
    assert incident["killed_pids"], incident
    on_disk = json.loads((run_dir / "incidents" / "1" / "incident.json").read_text())
    assert on_disk["status"] == "done"
    recorded = events(run_dir)
    ended = next(e for e in recorded if e["type"] == "run_ended")
    assert ended["incidents"] == 1
    stopped = next(e for e in recorded if e["type"] == "load_stopped")
    decided = next(e for e in recorded if e["type"] == "decision")
    assert decided["ts"] >= stopped["ts"] - 1.0 or stopped["reason"].startswith("incident")
    assert ET.parse(run_dir / "junit.xml").getroot().find("testcase/failure").get("type") == "hang"


def test_the_summary_takes_incidents_from_disk_when_their_event_is_missing(tmp_path) -> None:
    """The run loop died between the response and its event: the record on disk still counts."""
    from soak.judge import summarize

    run_dir = tmp_path / "run"
    (run_dir / "incidents" / "1").mkdir(parents=True)
    (run_dir / "events.jsonl").write_text(
        '{"ts": 100.0, "type": "run_started", "run_id": "x"}\n'
        '{"ts": 110.0, "type": "run_ended", "verdict": "pass", "reason": "duration", "exit_code": 0}\n')
    (run_dir / "incidents" / "1" / "incident.json").write_text(json.dumps({
        "number": 1, "status": "killing",
        "decision": {"kind": "hang", "rule": "pp_tail_stall", "onset_at": 105.0, "decided_at": 108.0}}))
    summary = summarize(run_dir)
    assert summary["verdict"] == "fail"
    assert summary["incidents"][0]["rule"] == "pp_tail_stall"
    assert "response not finished" in summary["incidents"][0]["summary"]
    assert summary["verdict_reasons"] == ["incident 1: hang (rule pp_tail_stall)"]
