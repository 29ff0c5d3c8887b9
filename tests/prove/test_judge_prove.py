"""The judge of a prove: run read back from disk (soak report on a run
directory): the plan from the ``prove_plan`` event, else from config.yaml's
section, and the time at risk counted once into summary.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from soak.judge import summarize

RUNS = Path(__file__).parents[1] / "fixtures" / "runs"


def _copy(tmp_path: Path, name: str, prove: dict | None) -> Path:
    run = tmp_path / name
    shutil.copytree(RUNS / name, run)
    if prove is not None:
        config = yaml.safe_load((run / "config.yaml").read_text())
        (run / "config.yaml").write_text(yaml.safe_dump({**config, "prove": prove}))
    return run


def test_a_recorded_run_judged_with_the_config_sections_plan(tmp_path) -> None:
    plain = summarize(_copy(tmp_path / "a", "fail", None))
    proved = summarize(_copy(tmp_path / "b", "fail", {"broken_mtbf": "20m", "target_mtbf": "200m"}))
    assert "proof" not in plain and plain["time_at_risk_s"] == proved["time_at_risk_s"] > 0
    proof = proved["proof"]
    assert proof["exposure_s"] <= proved["time_at_risk_s"] and proof["hangs"] == proved["hangs_at_risk"]
    assert proof["decision"] in ("undecided", "rejected", "accepted")
    assert proof["path"]["exposure_s"] == proved["time_at_risk_s"]


def test_the_prove_plan_event_outranks_the_config_and_a_broken_build_without_it_is_said(tmp_path) -> None:
    run = _copy(tmp_path, "pass", {"broken_build": "nightly-1", "history": "runs", "ratio": 10})
    assert summarize(run)["proof"] == {"decision": None,
                                       "note": "no prove plan recorded: the run ended before its load started"}
    event = {"ts": 1.0, "type": "prove_plan", "plan": {"broken_mtbf_s": 60.0, "target_mtbf_s": 600.0,
                                                        "alpha": 0.05, "beta": 0.05}}
    with (run / "events.jsonl").open("a") as f:
        f.write(json.dumps(event) + "\n")
    proof = summarize(run)["proof"]
    assert proof["plan"]["broken_mtbf_s"] == 60.0 and proof["plan"]["target_mtbf_s"] == 600.0
