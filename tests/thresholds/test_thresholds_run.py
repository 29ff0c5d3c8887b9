"""Thresholds in real ``soak run``s against the simulator: a breach is exit 99 with
the run otherwise clean, an incident outranks it (exit 1), ``abort_on_fail`` ends
the run at the breached window; every threshold is a summary.json entry and a
JUnit testcase, and junit.xml validates against the Ant JUnit schema."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import xmlschema

from report_paths import JUNIT_XSD
from soakrun_helpers import events, small_config, write_config


@pytest.fixture(scope="module")
def schema():
    return xmlschema.XMLSchema(str(JUNIT_XSD))


def _cases(run_dir):
    suite = ET.parse(run_dir / "junit.xml").getroot()
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    # the soak's own case, by its class (its name is the run's)
    cases["test"] = next(c for c in suite.iter("testcase") if not c.get("classname", "").endswith(".thresholds"))
    return suite, cases


def test_a_breached_threshold_is_exit_99_a_summary_entry_and_a_failed_testcase(tmp_path, harness, schema):
    config = small_config(duration="4s", build="candidate-7")
    config["thresholds"] = {
        "ttft_p99": "< 90s",                     # holds
        "ttft_p95": "< 90s",                     # holds: p95 is a threshold like p99
        "error_rate": "< 1%",                    # holds: a healthy simulator fails nothing
        "output_tokens_per_s": "> 1000000",      # cannot hold
    }
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "t.yaml", config), run_dir)
    assert h.wait() == 99, h.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["incidents"] == [] and summary["verdict"] == "fail" and summary["exit_code"] == 99
    assert summary["stop_reason"].startswith("thresholds breached: output_tokens_per_s > 1000000")
    entry = summary["thresholds"]
    assert entry["passed"] is False and entry["breached"] == ["output_tokens_per_s > 1000000"]
    by = {r["name"]: r for r in entry["results"]}
    assert by["ttft_p99 < 90s"]["passed"] and by["error_rate < 1%"]["observed"] == 0
    ttft = summary["latency"]["ttft_s"]
    assert ttft["p90"] <= ttft["p95"] <= ttft["p99"] and by["ttft_p95 < 90s"]["observed"] == ttft["p95"]
    assert by["output_tokens_per_s > 1000000"]["observed"] == pytest.approx(
        summary["throughput"]["generated_tokens_per_s"])
    # the build the run exercised: the config's label, the simulator's /version, a digest
    assert summary["build"]["label"] == "candidate-7" and summary["build"]["build"] == "candidate-7"
    assert summary["build"]["vllm_version"] and len(summary["build"]["launch_digest"]) == 12

    schema.validate(str(run_dir / "junit.xml"))
    suite, cases = _cases(run_dir)
    # the soak, one case per failure criterion, the oracle's case where canaries were judged, the four thresholds
    criteria = [f"criteria.{c['name']}" for c in summary["criteria"]["results"]]
    assert "criteria.error_rate" in criteria and sorted(n for n in cases if n.startswith("criteria.")) == sorted(criteria)
    oracle = "oracle" in cases
    assert not oracle or cases["oracle"].find("failure") is None
    assert suite.get("tests") == str(1 + len(criteria) + oracle + 4) and suite.get("failures") == "1"
    assert cases["test"].find("failure") is None  # the soak itself: no incident
    assert cases["ttft_p99 < 90s"].find("failure") is None
    failure = cases["output_tokens_per_s > 1000000"].find("failure")
    assert failure is not None and "breaches > 1000000" in failure.get("message")

    # `soak report` reads the same from the recorded files
    done = subprocess.run([sys.executable, "-m", "soak", "report", str(run_dir)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads((run_dir / "summary.json").read_text())["thresholds"] == entry


def test_an_incident_outranks_a_breached_threshold(tmp_path, harness, schema):
    config = small_config(duration="30s")
    config["target"]["sim"] = {"time_scale": 20, "faults": [{"kind": "pp_deadlock", "at": "40s"}]}
    config["response"] = {"on_hang": "stop", "evidence": {"py_spy": False, "flight_recorder_wait": "1s"}}
    config["thresholds"] = {"output_tokens_per_s": "> 1000000"}
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "t.yaml", config), run_dir)
    assert h.wait(timeout_s=120) == 1, h.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["incidents"] and summary["exit_code"] == 1
    assert summary["thresholds"]["passed"] is False  # still recorded, still a failed testcase
    schema.validate(str(run_dir / "junit.xml"))
    suite, cases = _cases(run_dir)
    # The soak case, the threshold and, when the deadlock came before any request
    # finished (it does on a cold simulator), work_evidence: a night with no work.
    work_failed = cases["criteria.work_evidence"].find("failure") is not None
    assert summary["requests"]["ok"] == 0 or not work_failed
    assert suite.get("failures") == str(2 + work_failed) and cases["test"].find("failure") is not None


def test_abort_on_fail_ends_the_run_at_the_breached_window(tmp_path, harness, schema):
    config = small_config(duration="60s")
    config["thresholds"] = {
        "ttft_p50": {"threshold": "< 1us", "window": "1s", "abort_on_fail": True, "delay_abort_eval": "1s"},
        "error_rate": "< 1%",
    }
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "t.yaml", config), run_dir)
    assert h.wait(timeout_s=90) == 99, h.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["duration_s"] < 30  # stopped long before its 60 s
    assert summary["stop_reason"].startswith("threshold breached (abort_on_fail): ttft_p50 = ")
    breach = [e for e in events(run_dir) if e["type"] == "threshold_breached"]
    assert len(breach) == 1 and breach[0]["threshold"] == "ttft_p50 < 1us (every 1 s window)"
    entry = summary["thresholds"]
    assert entry["aborted_by"]["threshold"] == breach[0]["threshold"] and entry["passed"] is False
    names = {r["name"]: r for r in entry["results"]}
    assert not names["ttft_p50 < 1us"]["passed"] and not names["ttft_p50 < 1us (every 1 s window)"]["passed"]
    assert names["error_rate < 1%"]["passed"]
    schema.validate(str(run_dir / "junit.xml"))



def test_abort_on_fail_sees_the_servers_fresh_counters(tmp_path, harness):
    # The hit ratio comes from the server's counters, not the client's records: a window
    # that only ever saw scrapes from stale spans never judged it, so the run went on.
    config = small_config(duration="60s")
    config["thresholds"] = {
        "prefix_hit_ratio": {"threshold": "> 1.5", "window": "2s", "abort_on_fail": True, "delay_abort_eval": "1s"},
    }
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "t.yaml", config), run_dir)
    assert h.wait(timeout_s=90) == 99, h.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["duration_s"] < 30
    assert summary["stop_reason"].startswith("threshold breached (abort_on_fail): prefix_hit_ratio = ")

def test_thresholds_that_hold_keep_exit_0(tmp_path, harness, schema):
    config = small_config(duration="3s")
    config["thresholds"] = {"ttft_p99": "< 90s", "tpot_p50": "< 10s", "error_rate": "< 1%",
                            "output_tokens_per_s": "> 1", "requests_per_s": "> 0.1/s"}
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "t.yaml", config), run_dir)
    assert h.wait() == 0, h.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "pass" and summary["thresholds"]["passed"] is True
    schema.validate(str(run_dir / "junit.xml"))
    suite, cases = _cases(run_dir)
    # the soak, one case per failure criterion, the oracle's case where canaries were judged, the five thresholds
    assert suite.get("tests") == str(1 + len(summary["criteria"]["results"]) + ("oracle" in cases) + 5) and suite.get("failures") == "0"
