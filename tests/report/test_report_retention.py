"""Nightly retention: newest N runs and the newest failing run survive, nothing
outside the runs folder is touched, ``latest`` points at the newest run; and
deploy/nightly.sh wires soak run, soak report and retention together."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from soak.report.retention import prune

REPO = Path(__file__).resolve().parents[2]


def _run(runs: Path, name: str, started: float, verdict: str) -> Path:
    d = runs / name
    d.mkdir()
    (d / "events.jsonl").write_text(json.dumps({"ts": started, "type": "run_started"}) + "\n")
    incidents = [{"kind": "hang", "evidence": "incidents/1"}] if verdict == "fail" else []
    (d / "summary.json").write_text(json.dumps({"verdict": verdict, "started_at": started, "incidents": incidents}))
    (d / "samples.jsonl").write_text("{}\n" * 10)
    return d


def _layout(tmp_path: Path):
    runs = tmp_path / "runs"
    runs.mkdir()
    sibling = tmp_path / "runs-archive"  # beside the runs folder: must survive
    sibling.mkdir()
    (sibling / "events.jsonl").write_text("{}\n")
    made = [_run(runs, f"2026120{i}", 1_764_000_000 + i * 86400, "fail" if i in (1, 2) else "pass") for i in range(1, 8)]
    notes = runs / "notes"  # not a run directory
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me")
    os.symlink(sibling, runs / "archive-link")  # a link that looks like a run; never followed
    return runs, sibling, made, notes


def test_keeps_newest_n_and_newest_failure_and_nothing_else_is_touched(tmp_path):
    runs, sibling, made, notes = _layout(tmp_path)
    result = prune(runs, keep=3)
    survivors = sorted(p.name for p in runs.iterdir() if p.is_dir() and not p.is_symlink())
    # newest three (5, 6, 7) plus the newest failing run (2); the older failure (1) goes.
    assert survivors == ["20261202", "20261205", "20261206", "20261207", "notes"]
    assert result.newest_failure == made[1].resolve()
    assert sorted(p.name for p in result.deleted) == ["20261201", "20261203", "20261204"]
    assert (notes / "todo.txt").read_text() == "keep me"
    assert (sibling / "events.jsonl").is_file() and (runs / "archive-link").is_symlink()
    assert os.readlink(runs / "latest") == "20261207"
    # Idempotent, and a dry run deletes nothing.
    assert prune(runs, keep=3, dry_run=True).deleted == ()
    assert prune(runs, keep=3).deleted == ()


def test_retention_command_line_dry_run(tmp_path):
    runs, _, made, _ = _layout(tmp_path)
    done = subprocess.run([sys.executable, "-m", "soak.report.retention", str(runs), "--keep", "2", "--dry-run"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "would delete" in done.stdout and all(p.is_dir() for p in made)
    bad = subprocess.run([sys.executable, "-m", "soak.report.retention", str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


STUB_SOAK = """#!/usr/bin/env python3
import json, os, sys, time
cmd, rest = sys.argv[1], sys.argv[2:]
if cmd == "run":
    out = rest[rest.index("--out") + 1]
    os.makedirs(out)
    verdict = os.environ.get("STUB_VERDICT", "pass")
    now = time.time()
    with open(os.path.join(out, "events.jsonl"), "w") as fh:
        fh.write(json.dumps({"ts": now, "type": "run_started"}) + "\\n")
    with open(os.path.join(out, "summary.json"), "w") as fh:
        json.dump({"verdict": verdict, "started_at": now, "incidents": [{"kind": "hang"}] if verdict == "fail" else []}, fh)
    with open(os.path.join(os.environ["STUB_LOG"], "calls"), "a") as fh:
        fh.write(" ".join(sys.argv[1:]) + "\\n")
    if os.environ.get("STUB_DIE"):
        sys.exit(137)
    open(os.path.join(out, "report.html"), "w").close()
    sys.exit(1 if verdict == "fail" else 0)
if cmd == "report":
    open(os.path.join(rest[0], "report.html"), "w").write("rendered by report")
    sys.exit(0)
sys.exit(2)
"""


def test_nightly_script_runs_reports_prunes_and_links_latest(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "soak"
    stub.write_text(STUB_SOAK)
    stub.chmod(0o755)
    runs = tmp_path / "runs"
    outside = tmp_path / "keep-me"
    outside.mkdir()
    env = {**os.environ, "SOAK_CONFIG": "/etc/soak/x.yaml", "SOAK_RUNS_DIR": str(runs), "SOAK_KEEP": "2",
           "SOAK_BIN": str(stub), "SOAK_PYTHON": sys.executable, "SOAK_DURATION": "66m", "STUB_LOG": str(tmp_path)}
    codes = []
    for verdict, die in (("fail", ""), ("pass", ""), ("pass", "1"), ("pass", "")):
        done = subprocess.run(["bash", str(REPO / "deploy" / "nightly.sh")], env={**env, "STUB_VERDICT": verdict,
                              "STUB_DIE": die}, capture_output=True, text=True, timeout=60)
        codes.append(done.returncode)
    assert codes == [1, 0, 137, 0]
    calls = (tmp_path / "calls").read_text().splitlines()
    assert all(c.startswith("run /etc/soak/x.yaml --out ") and c.endswith("--duration 66m") for c in calls)
    dirs = sorted(p for p in runs.iterdir() if p.is_dir() and not p.is_symlink())
    # keep 2 newest + the failing first night
    assert len(dirs) == 3
    verdicts = [json.loads((d / "summary.json").read_text())["verdict"] for d in dirs]
    assert verdicts == ["fail", "pass", "pass"]
    # the night that died before its report got one from `soak report`
    assert any((d / "report.html").read_text() == "rendered by report" for d in dirs)
    assert os.readlink(runs / "latest") == dirs[-1].name
    assert outside.is_dir()


# A run as retention reads it: (files, when it started, whether it failed). mtime is 1e9.
RUNS_READ = [
    ("summary pass", {"summary.json": {"verdict": "pass", "started_at": 5.0, "incidents": []}}, 5.0, False),
    ("summary fail", {"summary.json": {"verdict": "fail", "started_at": 5.0, "incidents": []}}, 5.0, True),
    ("summary pass that lists an incident", {"summary.json": {"verdict": "pass", "incidents": [{"kind": "hang"}],
                                                              "started_at": 5.0}}, 5.0, True),
    ("cut off: dated by its first event", {"events.jsonl": [{"ts": 7.0, "type": "run_started"}]}, 7.0, False),
    ("cut off after an incident event", {"events.jsonl": [{"ts": 7.0, "type": "run_started"},
                                                          {"ts": 9.0, "type": "incident"}]}, 7.0, True),
    ("cut off with an incident's evidence", {"events.jsonl": [{"ts": 7.0, "type": "run_started"}],
                                             "incidents/1/incident.json": {"number": 1}}, 7.0, True),
    ("a damaged summary reads as none", {"summary.json": [1, 2], "events.jsonl": [{"ts": 7.0, "type": "x"}]}, 7.0,
     False),
    ("a torn first line: the next event dates it", {"events.jsonl": ["{torn", {"ts": 8.0, "type": "run_started"}]},
     8.0, False),
    ("nothing dated: the folder's mtime", {"requests.jsonl": []}, 1e9, False),
]


@pytest.mark.parametrize("what, files, started, failed", RUNS_READ, ids=[r[0] for r in RUNS_READ])
def test_a_run_is_dated_and_judged_from_what_it_recorded(tmp_path, what, files, started, failed):
    from soak.report.retention import find_runs

    run = tmp_path / "runs" / "night"
    run.mkdir(parents=True)
    for name, body in files.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".jsonl"):
            text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in body)
        else:
            text = json.dumps(body)
        (run / name).write_text(text)
    os.utime(run, (1e9, 1e9))
    (entry,) = find_runs(tmp_path / "runs")
    assert (entry.started_at, entry.failed) == (started, failed)
