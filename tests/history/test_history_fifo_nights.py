"""One bad run never blocks the others: a run directory where a FIFO stands in
for a sample segment, the config or an incident file (a reader that opened it
would wait for a writer for ever) is reported within seconds by ``soak report``
and ``soak history``, and every other night is still reported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "history"
LIMIT_S = 60  # seconds on a loaded CI box; before the fix these never end


def soak(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "soak", *args], capture_output=True, text=True, timeout=LIMIT_S,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL)


def test_soak_history_reports_every_night_around_fifos(tmp_path) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(FIXTURES, runs, ignore=shutil.ignore_patterns("*.py"))
    os.mkfifo(runs / "n06-fixed-clean" / "samples-001.jsonl")
    os.mkfifo(runs / "n06-fixed-clean" / "samples-002.jsonl.gz")
    (runs / "n05-fixed-clean" / "config.yaml").unlink()
    os.mkfifo(runs / "n05-fixed-clean" / "config.yaml")
    (runs / "n04-fixed-clean" / "incidents" / "1").mkdir(parents=True)
    os.mkfifo(runs / "n04-fixed-clean" / "incidents" / "1" / "incident.json")
    proc = soak("history", str(runs), cwd=tmp_path)
    assert proc.returncode in (0, 2), proc.stderr
    assert "Traceback" not in proc.stderr
    data = json.loads((runs / "history.json").read_text())
    paths = {Path(r["path"]).name for r in data["runs"]}
    assert {"n01-unfixed-hang", "n02-unfixed-restarts", "n03-unfixed-cutoff", "n07-fixed-aborted",
            "n08-unlabelled", "n06-fixed-clean"} <= paths


def test_soak_report_on_a_run_with_a_fifo_segment_and_config_finishes(tmp_path) -> None:
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "n06-fixed-clean", run)
    os.mkfifo(run / "samples-001.jsonl")
    (run / "samples.jsonl").write_text('{"kind":"gpu","ts":1764690000.5}\n')
    proc = soak("report", str(run), cwd=tmp_path)
    assert proc.returncode in (0, 2), proc.stderr
    assert "Traceback" not in proc.stderr
    if proc.returncode == 2:
        assert len(proc.stderr.strip().splitlines()) == 1
    else:
        assert (run / "report.html").is_file()
    (run / "config.yaml").unlink()
    os.mkfifo(run / "config.yaml")
    proc = soak("report", str(run), cwd=tmp_path)
    assert proc.returncode in (0, 2) and "Traceback" not in proc.stderr, proc.stderr
