"""Five short real nights of two simulator "builds": "buggy" deadlocks (a
``pp_deadlock`` fault with an MTBF trigger; the harness detects, kills and
restarts it, so one night holds several time-to-hang intervals), "fixed" has no
fault. ``soak history`` over the five run directories must name the fixed build
as the better one, and say at what confidence."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "run"))

from soakrun_helpers import small_config, soak_cmd, write_config  # noqa: E402

pytestmark = pytest.mark.timeout(600)


def night(tmp_path: Path, name: str, *, build: str, duration: str, seed: int, faults: list) -> Path:
    config = small_config(duration=duration, build=build, seed=seed)
    config["workload"]["tokenizer"] = {"kind": "estimate"}  # no calibration pass: load begins sooner
    # time_scale 20: a simulated minute passes in 3 s
    config["target"]["sim"] = {"time_scale": 20, "seed": seed, "faults": faults}
    config["response"] = {"on_hang": "restart", "max_restarts": 8,
                          "evidence": {"py_spy": False, "flight_recorder_wait": "0.5s"}}
    run_dir = tmp_path / "runs" / name
    done = subprocess.run(soak_cmd("run", str(write_config(tmp_path / f"{name}.yaml", config)), "--out", str(run_dir), "--no-html"),
                          capture_output=True, text=True, timeout=150)
    assert done.returncode == (1 if faults else 0), done.stderr
    return run_dir


def test_history_of_five_real_nights_names_the_fixed_build(tmp_path):
    # MTBF 80 simulated seconds, 4 s of wall time at time_scale 20; the seeds draw
    # 1.1 and 1.3 times that after each start of the simulator
    deadlock = [{"kind": "pp_deadlock", "mtbf": "80s"}]
    night(tmp_path, "n1-buggy", build="buggy", duration="16s", seed=6, faults=deadlock)
    night(tmp_path, "n2-fixed", build="fixed", duration="8s", seed=2, faults=[])
    night(tmp_path, "n3-buggy", build="buggy", duration="16s", seed=2, faults=deadlock)
    night(tmp_path, "n4-fixed", build="fixed", duration="8s", seed=4, faults=[])
    night(tmp_path, "n5-fixed", build="fixed", duration="8s", seed=5, faults=[])

    done = subprocess.run(soak_cmd("history", str(tmp_path / "runs"), "--window", "1s", "--baseline", "buggy"),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    data = json.loads((tmp_path / "runs" / "history.json").read_text())
    builds = {b["build"]: b for b in data["builds"]}
    buggy, fixed = builds["buggy"], builds["fixed"]
    assert buggy["runs"] == 2 and fixed["runs"] == 3 and data["baseline"] == "buggy"
    assert fixed["hangs"] == 0 and buggy["hangs"] >= 2
    # restarts split the buggy nights into several intervals; each hang ends one
    for run in (r for r in data["runs"] if r["build"] == "buggy"):
        summary = json.loads((Path(run["path"]) / "summary.json").read_text())
        assert run["hangs"] == sum(i["kind"] == "hang" for i in summary["incidents"]) >= 1
        # each incident as the night told it: its onset interval and detection latency too
        for seen, told in zip(run["incidents"], summary["incidents"], strict=True):
            assert seen["detection_latency_s"] == told["detection_latency_s"]
            assert (seen["onset_earliest_at"], seen["onset_latest_at"]) == (told.get("onset_earliest_at"),
                                                                           told.get("onset_latest_at"))
        assert sum(i["hang"] for i in run["intervals"]) == run["hangs"] and run["restarts"] == summary["restarts"]
        assert run["exposure_s"] == pytest.approx(sum(i["length_s"] for i in run["intervals"]))
        assert run["exposure_s"] < summary["duration_s"]  # the hung stretches are not time at risk
        assert all(0 <= t < 16 for t in run["times_to_hang_s"])
    # the exact one-sided rate-ratio test, from history's own exposure
    n, tb, tf = buggy["hangs"], buggy["exposure_s"], fixed["exposure_s"]
    p = (tb / (tb + tf)) ** n
    best = data["best"]
    assert best["build"] == "fixed" and best["baseline"] == "buggy"
    assert best["confidence"] == pytest.approx(1 - p)
    assert best["significant"] is (1 - p >= 0.95)
    assert f"{(1 - p) * 100:.1f}% confidence" in best["statement"] and "fixed" in done.stdout
    # the cost of the fix: throughput and latency between the builds, with intervals
    costs = {c["metric"]: c for c in data["costs"]["fixed"]}
    assert set(costs) == {"output_tokens_per_s", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99"}
    ttft = costs["ttft_p50"]
    assert ttft["n_a"] > 10 and ttft["n_b"] > 10 and ttft["delta_lower"] <= ttft["delta"] <= ttft["delta_upper"]
    print(done.stdout)
