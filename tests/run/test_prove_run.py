"""``soak run`` with a ``prove:`` section against the simulator, end to end: the
sequential test followed live, the run stopped at the decision, summary.json's
``proof``, the exit code (docs/prove.md, "contract addition"), junit.xml's
prove case and the end block's proof line.

Plans are test-sized (MTBFs of seconds): with θ1 1 s and θ0 10 s the test
accepts after ln(19) / (1 - 1/10) = 3.27 clean seconds."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from soakrun_helpers import events, small_config, write_config

from soak.events import EventType

EVIDENCE = {"py_spy": False, "flight_recorder_wait": "1s"}
# A live accept waits out the detection horizon (soak.run.proving.detection_horizon_s): with the
# 300-s rules off (the simulator's deadlock is found by its log line) it is 5 s + 1 s + 0.5 s.
QUICK_DETECTOR = {"generation_frozen": {"enabled": False}, "client_stall": {"enabled": False},
                  "log_signature": {"execute_model_timeout": "1s"}}
HORIZON_S = 6.5


def _junit_prove(run_dir) -> ET.Element:
    (case,) = [c for c in ET.parse(run_dir / "junit.xml").getroot().iter("testcase") if c.get("name") == "prove"]
    return case


def test_a_clean_build_is_accepted_and_the_run_stops_at_the_decision(tmp_path, harness) -> None:
    config = small_config(duration="60s")
    config["prove"] = {"broken_mtbf": "1s", "target_mtbf": "10s", "stop_at_decision": True}
    config["detector"] = QUICK_DETECTOR
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "prove.yaml", config), run_dir)
    assert h.wait(timeout_s=90) == 0, h.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    proof = summary["proof"]
    assert proof["decision"] == "accepted" and proof["hangs"] == 0
    assert abs(proof["exposure_s"] - 3.2716) < 0.01  # where it decided: the accept line
    assert proof["sentence"].startswith("fixed (α 5%, β 5%) after ")
    assert proof["plan"]["target_mtbf_s"] == 10.0 and proof["boundaries"]["accept"][0][1] == proof["exposure_s"]
    assert summary["verdict"] == "pass" and summary["exit_code"] == 0
    assert summary["stopped_by"].startswith("proof accepted: fixed")  # a stop reason like the others
    # stopped once no hang could still land before the line: the accept line plus the horizon;
    # the time at risk is what is known clean, the load less its last horizon, and it holds the line
    assert 3.27 + HORIZON_S <= summary["duration_s"] < 20
    assert 3.27 <= summary["time_at_risk_s"] <= summary["duration_s"] - HORIZON_S + 0.5
    types = [e["type"] for e in events(run_dir)]
    assert types.count(EventType.PROVE_PLAN.value) == 1 and types.count(EventType.PROOF_DECIDED.value) == 1
    assert list(_junit_prove(run_dir)) == []  # the prove case passed
    assert "proof       fixed: fixed (α 5%, β 5%) after" in h.stderr
    assert "verdict     PASS, exit 0 (the sequential test accepted: fixed)" in h.stderr


def test_a_deadlocking_build_is_rejected_exit_1(tmp_path, harness) -> None:
    config = small_config(duration="40s")
    # every simulator start deadlocks 60 simulated seconds (3 s at time scale 20) in
    config["target"]["sim"] = {"time_scale": 20, "faults": [{"kind": "pp_deadlock", "at": "60s"}]}
    config["response"] = {"on_hang": "stop", "evidence": EVIDENCE}
    # θ1 10 s, θ0 1000 s (ratio 100): one hang rejects when it lands by (1 - 0.639) / 0.0215 = 16.8 s
    config["prove"] = {"broken_mtbf": "10s", "target_mtbf": "1000s"}
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "prove.yaml", config), run_dir)
    assert h.wait(timeout_s=90) == 1, h.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    proof = summary["proof"]
    assert proof["decision"] == "rejected" and proof["hangs"] == 1 and proof["exposure_s"] < 16.8
    assert proof["path"]["hang_exposures_s"] == [proof["exposure_s"]]
    assert summary["verdict"] == "fail" and summary["hangs_at_risk"] == 1
    assert any(r.startswith("proof: not fixed") for r in summary["verdict_reasons"])
    (failure,) = list(_junit_prove(run_dir))
    assert failure.tag == "failure" and failure.get("type") == "prove_rejected"
    assert "proof       not fixed: not fixed (α 5%, β 5%): 1 hang within" in h.stderr


def test_a_run_too_short_to_decide_is_exit_5_and_passes(tmp_path, harness) -> None:
    config = small_config(duration="3s")
    config["prove"] = {"broken_mtbf": "20m", "ratio": 10}
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "prove.yaml", config), run_dir)
    assert h.wait(timeout_s=60) == 5, h.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["proof"]["decision"] == "undecided" and summary["verdict"] == "pass"
    assert summary["proof"]["sentence"] == "65 more clean minutes to accept; 2 hangs before minute 37 reject"
    assert summary["proof"]["needed"]["hangs"] == 2
    (error,) = list(_junit_prove(run_dir))
    assert error.get("type") == "prove_undecided"
    assert "verdict     UNDECIDED, exit 5 (the sequential test (prove:) ended undecided: soak more)" in h.stderr
    assert "why         proof: 65 more clean minutes to accept; 2 hangs before minute 37 reject" in h.stderr
    assert h.stderr.rstrip().splitlines()[-1].startswith("soak run: undecided (proof: 65 more clean minutes")


def test_an_accept_after_a_hang_is_a_pass_with_the_hang_listed(tmp_path, harness) -> None:
    """θ1 0.5 s, θ0 1 s, α 5%, β 0.1%: b = (2 - 1) / ln 2 = 1.443 hangs/s, a = -ln(0.95/0.001) / ln 2
    = -9.89, c = 4.32. Clean, it accepts at 9.89 / 1.443 = 6.85 s; with one hang at 7.55 s; no hang
    count below 5 rejects. The simulator deadlocks 130 simulated seconds (6.5 s) into each life, so
    the first hang lands before 6.5 s of load however fast the start-up (a box with nothing else
    running started in 0.07 s, and 140 s put the hang at 6.93, after the clean accept), and the
    restarted life is clean past 7.55 while the two start-ups take under 5.45 s together: one
    hang, then accepted."""
    config = small_config(duration="40s")
    config["target"]["sim"] = {"time_scale": 20, "faults": [{"kind": "pp_deadlock", "at": "130s"}]}
    config["response"] = {"on_hang": "restart", "max_restarts": 3, "evidence": EVIDENCE}
    config["prove"] = {"broken_mtbf": "0.5s", "target_mtbf": "1s", "beta": 0.001, "stop_at_decision": True}
    config["detector"] = QUICK_DETECTOR
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "prove.yaml", config), run_dir)
    assert h.wait(timeout_s=90) == 0, h.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    proof = summary["proof"]
    assert proof["decision"] == "accepted" and proof["hangs"] == 1, proof["path"]
    assert abs(proof["exposure_s"] - 7.55) < 0.01
    # the second life deadlocks after the line (exposure past 7.55) while the accept waits out its
    # horizon: found and listed, it changes nothing (the test had accepted before it began)
    assert summary["verdict"] == "pass" and summary["restarts"] in (1, 2)
    assert {i["kind"] for i in summary["incidents"]} == {"hang"}  # still listed
    cases = {c.get("name"): c for c in ET.parse(run_dir / "junit.xml").getroot().iter("testcase")}
    assert all(list(case) == [] for case in cases.values())  # the accepted test judged the hang
    assert "incidents   1. hang (log_signature)" in h.stderr and "proof       fixed:" in h.stderr
