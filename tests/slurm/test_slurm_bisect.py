"""soak bisect on a real Slurm: four simulated builds (b3 the first bad one), each
segment a batch job, two in flight at once on the 2-CPU node; and a bisect
SIGKILLed with jobs in flight resumes by cancelling them (its own ids only) and
reading their segments back as cut."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.xdist_group("slurm-bisect")

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "workloads" / "bisect-demo" / "base.yaml"


def bisect_file(tmp_path: Path, **over) -> Path:
    def sim(wall_mtbf: str) -> dict:
        return {"kind": "simulator", "sim": {"time_scale": 20, "faults": [{"kind": "pp_deadlock", "wall_mtbf": wall_mtbf}]}}

    doc = {"name": "slurm-bisect", "base": str(BASE), "segment": "5s", "stop_at": 0.95, "seed": 1,
           "budget": {"segments": 16}, "rates": {"mtbf_min": "1s", "mtbf_max": "1h", "max_ratio": None},
           "executor": {"kind": "slurm", "slots": 2, "overhead": "2m", "poll": "0.5s"},
           "builds": [{"label": f"b{i + 1}", "target": sim("10m" if i < 2 else "1s")} for i in range(4)], **over}
    path = tmp_path / "bisect.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def soak_bisect(cluster, *args: str) -> subprocess.Popen:
    env = {**cluster.env, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "soak", "bisect", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_four_builds_bisected_on_slurm_two_segments_at_once(slurm_cluster, tmp_path):
    out = tmp_path / "bisect"
    proc = soak_bisect(slurm_cluster, str(bisect_file(tmp_path)), "--out", str(out))
    text, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, text
    assert text.strip().splitlines()[-1].startswith("soak bisect: first bad build: b3 (posterior 0.9"), text
    doc = json.loads((out / "bisect.json").read_text())
    assert doc["now"]["state"] == "found"
    # two at once: some job was submitted while another was still in flight
    submitted = [line for line in text.splitlines() if "soak bisect: slurm job " in line and "->" in line]
    assert len(submitted) == len(doc["segments"]) or len(submitted) == len(doc["segments"]) + 1
    first_two = text.splitlines().index(submitted[1]) < min(
        i for i, line in enumerate(text.splitlines()) if ": COMPLETED" in line or ": FAILED" in line)
    assert first_two, text
    for seg in doc["segments"]:
        assert (Path(seg["run_dir"]) / "summary.json").is_file()
    assert not slurm_cluster.run("squeue", "-h").stdout.strip()  # nothing left queued


def test_a_killed_slurm_bisect_resumes_cancelling_its_own_jobs(slurm_cluster, tmp_path):
    out = tmp_path / "bisect"
    path = bisect_file(tmp_path, segment="60s",
                       builds=[{"label": f"b{i + 1}", "target": {"kind": "simulator", "sim": {"time_scale": 20}}}
                               for i in range(4)], budget={"segments": 2})
    proc = soak_bisect(slurm_cluster, str(path), "--out", str(out))
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        jobs = (out / ".slurm-jobs").read_text().split() if (out / ".slurm-jobs").is_file() else []
        loaded = [p for p in out.glob("segment-*") if (p / "requests.jsonl").is_file()
                  and (p / "requests.jsonl").stat().st_size > 0]
        if len(jobs) == 2 and len(loaded) == 2:
            break
        time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)  # no scancel from it: its two jobs keep running
    proc.communicate(timeout=30)
    assert len(slurm_cluster.run("squeue", "-h").stdout.split("\n")) >= 2
    again = soak_bisect(slurm_cluster, str(path), "--out", str(out))
    text, _ = again.communicate(timeout=120)
    assert "cancelled 2 job(s) the killed bisect left in flight" in text, text
    assert again.returncode == 5, text  # its two-segment budget spent: undecided
    doc = json.loads((out / "bisect.json").read_text())
    assert len(doc["segments"]) == 2 and all(seg["exposure_s"] > 0 for seg in doc["segments"]), doc["segments"]
    assert not slurm_cluster.run("squeue", "-h").stdout.strip()


@pytest.mark.parametrize("executor, said", [
    ({"kind": "slrum"}, "unknown kind 'slrum', known: local, slurm"),
    ({"kind": "slurm", "slots": 0}, "executor.slots: "),
    ({"kind": "slurm", "partiton": "gpu"}, "did you mean 'partition'?"),
])
def test_a_bad_executor_section_is_one_line_and_exit_2(tmp_path, capsys, executor, said):
    from soak.cli import main

    path = bisect_file(tmp_path, executor=executor)
    assert main(["bisect", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err and str(path) in err, err


def test_a_segment_cancelled_by_an_operator_is_cut_and_the_bisect_goes_on(slurm_cluster, tmp_path):
    out = tmp_path / "bisect"
    path = bisect_file(tmp_path, segment="30s", executor={"kind": "slurm", "slots": 1, "overhead": "2m", "poll": "0.5s"},
                       builds=[{"label": f"b{i + 1}", "target": {"kind": "simulator", "sim": {"time_scale": 20}}}
                               for i in range(4)], budget={"segments": 2})
    proc = soak_bisect(slurm_cluster, str(path), "--out", str(out))
    deadline = time.monotonic() + 90
    first = None
    while time.monotonic() < deadline and first is None:
        segment = out / "segment-000-build-0"
        jobs = (out / ".slurm-jobs").read_text().split() if (out / ".slurm-jobs").is_file() else []
        if jobs and not segment.exists():
            segment = next(iter(out.glob("segment-000-*")), segment)
        if jobs and (segment / "requests.jsonl").is_file() and (segment / "requests.jsonl").stat().st_size > 0:
            first = jobs[0]
        time.sleep(0.3)
    assert first is not None
    time.sleep(3)
    assert slurm_cluster.run("scancel", first).returncode == 0  # an operator, from outside the bisect
    text, _ = proc.communicate(timeout=180)
    assert proc.returncode == 5, text  # two segments spent, good builds only: undecided
    doc = json.loads((out / "bisect.json").read_text())
    assert [seg["ended_by"] for seg in doc["segments"]][0] == "cut: cancelled", doc["segments"]
    assert doc["segments"][0]["hangs"] == 0 and doc["segments"][0]["exposure_s"] > 2
    assert len(doc["segments"]) == 2  # it went on to the next segment


def test_sigterm_to_a_slurm_bisect_cancels_its_jobs_and_leaves_nothing_queued(slurm_cluster, tmp_path):
    out = tmp_path / "bisect"
    path = bisect_file(tmp_path, segment="60s",
                       builds=[{"label": f"b{i + 1}", "target": {"kind": "simulator", "sim": {"time_scale": 20}}}
                               for i in range(4)])
    proc = soak_bisect(slurm_cluster, str(path), "--out", str(out))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        jobs = (out / ".slurm-jobs").read_text().split() if (out / ".slurm-jobs").is_file() else []
        if len(jobs) == 2:
            break
        time.sleep(0.3)
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    text, _ = proc.communicate(timeout=90)
    assert proc.returncode == 130, text
    assert "resume with: soak bisect" in text
    assert not slurm_cluster.run("squeue", "-h").stdout.strip(), "a job was left queued or running"
