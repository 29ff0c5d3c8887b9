"""``soak run`` (a real process) against the simulator: a ``corrupt_output`` fault
ends exit 1 with a ``corruption`` incident whose onset interval holds the fault's
onset, its evidence captured and nothing SIGKILLed; a healthy simulator whose
greedy answers flip at near ties ends exit 0 with no corruption."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

from tests.run.soakrun_helpers import attached_config, read_lines, small_config, soak_cmd, write_config

ORACLE = {"interval": "0.3s", "max_share": 0.3}


def run(tmp_path: Path, config: dict, timeout: float = 120.0) -> tuple[subprocess.CompletedProcess, Path]:
    path = write_config(tmp_path / "soak.yaml", config)
    out = tmp_path / "run"
    proc = subprocess.run(soak_cmd("run", str(path), "--out", str(out)), capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path)
    return proc, out


def canaries(out: Path) -> list[dict]:
    return [s for s in read_lines(out / "samples.jsonl") if s.get("kind") == "canary"]


def test_a_corrupting_server_fails_with_a_corruption_incident_at_its_onset(tmp_path, sim_process):
    sim = sim_process("--fault", "corrupt_output:at=200", time_scale=20)  # 10 s wall in: after the references
    config = attached_config(sim.base_url, duration="16s", oracle=ORACLE)
    proc, out = run(tmp_path, config)
    with urllib.request.urlopen(sim.base_url + "/sim/state", timeout=5) as resp:
        state = json.load(resp)
    assert proc.returncode == 1, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"] == "fail"
    [incident] = summary["incidents"]
    assert incident["kind"] == "corruption" and incident["rule"] == "corruption"
    assert incident["killed_pids"] == []
    onset = state["fault"]["onset_at"]
    assert state["fault"]["kind"] == "corrupt_output" and onset is not None
    assert incident["onset_earliest_at"] <= onset <= incident["onset_latest_at"], (incident, onset)
    evidence = json.loads((out / incident["evidence"] / "corruption.json").read_text())
    assert evidence["verdict"] in ("corrupt", "crosstalk")
    assert evidence["reference"]["tokens"] and evidence["answer"]["tokens"] and evidence["judgement"]["position"] is not None
    assert evidence["onset"]["earliest"] == incident["onset_earliest_at"]
    # The attached server was left running (its normal end), and still answers.
    assert sim.popen.poll() is None
    # Canaries are not workload: no request line is a canary's.
    requests = read_lines(out / "requests.jsonl")
    assert requests and all(r.get("session") for r in requests)
    assert all(c["share"] is not None for c in canaries(out))


def test_a_healthy_server_with_near_tie_flips_passes(tmp_path):
    config = small_config(duration="8s", oracle=ORACLE)
    config["target"]["sim"].update({"near_tie_rate": 0.2, "near_tie_flip": 0.5})
    proc, out = run(tmp_path, config)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"] == "pass" and summary["incidents"] == []
    judged = canaries(out)
    verdicts = {c["verdict"] for c in judged}
    assert {"reference"} <= verdicts and verdicts <= {"reference", "match", "explained", "unjudged"}, verdicts
    assert any(c["long"] for c in judged) and any(not c["long"] for c in judged)
    assert max(c["share"] for c in judged[1:]) <= 0.3 * 1.25


def test_a_recorded_reference_is_read_back_by_the_next_night(tmp_path):
    ref = tmp_path / "reference.jsonl"
    first = tmp_path / "one"
    first.mkdir()
    proc, out = run(first, small_config(duration="5s", oracle={**ORACLE, "record_reference": str(ref)}))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ref.is_file()
    recorded = {c["canary_id"] for c in canaries(out) if c["verdict"] == "reference"}
    second = tmp_path / "two"
    second.mkdir()
    proc, out = run(second, small_config(duration="5s", oracle={**ORACLE, "reference": str(ref)}))
    assert proc.returncode == 0, proc.stderr[-2000:]
    judged = canaries(out)
    from_file = [c for c in judged if c["canary_id"] in recorded]
    assert from_file and all(c["reference_source"] == "file" for c in from_file)
    assert all(c["verdict"] in ("match", "explained") for c in from_file), [c["verdict"] for c in from_file]
