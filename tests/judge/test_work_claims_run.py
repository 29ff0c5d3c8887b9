"""The adversarial round's four servers, for real: ``python -m soak run`` against
the simulator with each lying fault (``soak.sim.claims``), judged by the run's
own end. Before issue 49 all four exited 0 with no note; now a replay cache, an
answer from another model and a collapsed work rate fail (exit 1) with their
figures, and usage that overclaims is noted while every figure stays what was
streamed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

WORKLOAD = {
    "kind": "synthetic_agentic", "min_context_tokens": 2000, "max_context_tokens": 6000,
    "start_context_tokens": {"dist": "uniform", "low": 2000, "high": 2400}, "shared_prefix_tokens": 1000,
    "tool_result_tokens": {"dist": "uniform", "low": 200, "high": 400}, "output_tokens": 12, "think_time_s": 0.1,
}


def soak(tmp_path: Path, fault: dict[str, Any], *, duration: str = "8s",
         criteria: dict[str, Any] | None = None) -> tuple[int, dict[str, Any], str]:
    config = {
        "name": fault["kind"], "duration": duration,
        "target": {"kind": "simulator", "sim": {"time_scale": 20, "faults": [fault]}},
        "workload": WORKLOAD, "load": {"concurrency": 3, "drain": "5s"},
        "exporter": {"enabled": False}, "view": {"mode": "plain", "plain_interval": "1s"},
        # a short run: the server comparison from 100 tokens on
        "criteria": {"server_work": {"min_tokens": 100}, **(criteria or {})},
    }
    path = tmp_path / f"{fault['kind']}.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    out = tmp_path / fault["kind"]
    proc = subprocess.run([sys.executable, "-m", "soak", "run", str(path), "--out", str(out)],
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    return proc.returncode, json.loads((out / "summary.json").read_text()), proc.stderr + proc.stdout


def criterion(summary: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in summary["criteria"]["results"] if r["name"] == name)


def test_usage_claiming_twice_the_tokens_is_noted_and_never_a_figure(tmp_path: Path) -> None:
    code, summary, said = soak(tmp_path, {"kind": "lying_usage", "factor": 2.0})
    assert code == 0, said
    claims = summary["claims"]
    assert claims["checked"] > 0 and claims["usage_disagreements"] == claims["checked"]
    assert claims["claimed_tokens"] > summary["tokens"]["generated"]  # the figure is the counted one
    assert summary["tokens"]["generated"] == claims["counted_tokens"]
    assert any("usage count(s) disagreed" in w for w in summary["warnings"])


def test_every_answer_the_same_cached_bytes_fails_on_the_servers_counters(tmp_path: Path) -> None:
    code, summary, said = soak(tmp_path, {"kind": "replay"})
    got = criterion(summary, "server_work")
    assert code == 1 and got["state"] == "fail", said
    assert got["evidence"]["server_generated"] < 0.5 * got["evidence"]["client_within"]
    assert "a replay cache or a proxy" in summary["stop_reason"]


def test_answers_from_another_model_fail_naming_it(tmp_path: Path) -> None:
    code, summary, said = soak(tmp_path, {"kind": "other_model", "model": "other-model"})
    got = criterion(summary, "wrong_model")
    assert code == 1 and got["state"] == "fail", said
    assert got["evidence"]["first_wrong"] == "other-model"
    assert got["reasons"][0].endswith("the first of them named 'other-model'")


@pytest.mark.parametrize("factor", [300.0])
def test_a_collapse_after_a_healthy_start_fails_live_with_its_reason(tmp_path: Path, factor: float) -> None:
    # Healthy for 60 requests (the load's own count: start-up time on a busy box varies), then every
    # engine step 300x slower.
    code, summary, said = soak(tmp_path, {"kind": "collapse", "after_requests": 60, "factor": factor}, duration="30s",
                               criteria={"work_rate": {"min_window": 2.0}})
    got = criterion(summary, "work_rate")
    assert code == 1 and got["state"] == "fail", (said, got)
    assert got["reasons"][0].startswith("work rate fell to ")
    assert summary["stop_reason"].startswith("criterion work_rate")  # judged live: the soak ended there
