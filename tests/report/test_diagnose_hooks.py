"""The diagnosis line everywhere a person looks, beyond report.html and
flight_recorder_summary.json: incident.json (the responder's IncidentRecord),
the live view's incident line, summary.json (incidents[].diagnosis) and junit.xml."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

from soak.respond.evidence import flight_recorder_summary
from soak.records import IncidentRecord
from soak.respond.collect import diagnosis_line

FIX = Path(__file__).resolve().parents[1] / "fixtures"
GATED = FIX / "flight_recorder" / "real" / "gloo_pp4_gated"


def _run_with_dumps(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(FIX / "runs" / "real_fail", run)
    shutil.copytree(GATED, run / "incidents" / "1" / "flight_recorder")
    for name in ("summary.json", "report.html", "junit.xml"):
        (run / name).unlink(missing_ok=True)
    inc = run / "incidents" / "1"
    (inc / "flight_recorder_summary.json").write_text(json.dumps(flight_recorder_summary(inc / "flight_recorder")))
    return run


def test_the_responder_takes_the_line_from_the_summary_it_wrote(tmp_path):
    run = _run_with_dumps(tmp_path)
    line = diagnosis_line(run / "incidents" / "1" / "flight_recorder_summary.json")
    assert line and "size mismatch" in line and "rank 3" in line
    record = IncidentRecord(number=1, kind="hang", rule="r", onset_at=1.0, detected_at=2.0, killed_pids=(),
                            gpus_released=True, gpu_free_s=0.1, evidence="incidents/1",
                            summary=f"hang; {line}", diagnosis=line)
    assert record.to_json()["diagnosis"] == line
    assert IncidentRecord.from_json(record.to_json()).diagnosis == line
    assert diagnosis_line(tmp_path / "flight_recorder_summary.json") is None  # none: no line, no exception
    (tmp_path / "flight_recorder_summary.json").write_text("[1, 2")
    assert diagnosis_line(tmp_path / "flight_recorder_summary.json") is None


def test_summary_json_and_junit_carry_it(tmp_path):
    run = _run_with_dumps(tmp_path)
    line = diagnosis_line(run / "incidents" / "1" / "flight_recorder_summary.json")
    lines = []
    for raw in (run / "events.jsonl").read_text().splitlines():
        obj = json.loads(raw)
        if obj.get("type") == "incident":  # as the run loop records the responder's record
            obj["diagnosis"] = line
            obj["summary"] = f"{obj['summary']}; {line}"
        lines.append(json.dumps(obj))
    (run / "events.jsonl").write_text("\n".join(lines) + "\n")
    p = subprocess.run([sys.executable, "-m", "soak", "report", str(run)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads((run / "summary.json").read_text())["incidents"][0]["diagnosis"] == line
    assert "size mismatch" in (run / "junit.xml").read_text()
    assert "size mismatch" in (run / "report.html").read_text()


def test_the_live_view_incident_line_shows_it():
    from soak.clock import ManualClock
    from soak.export.live import LiveView

    out = io.StringIO()
    view = LiveView(clock=ManualClock(0.0), mode="plain", refresh_s=1.0, plain_interval_s=60.0, stream=out)
    line = "pp_broadcast: size mismatch at seq 122: ranks 0-2 posted broadcast [[2, 3]] Int"
    view.on_incident(IncidentRecord(number=1, kind="hang", rule="r", onset_at=1.0, detected_at=2.0,
                                    killed_pids=(), gpus_released=True, gpu_free_s=0.1, evidence="incidents/1",
                                    summary=f"hang; {line}", diagnosis=line))
    view.close()
    assert f"incident 1: hang; {line}" in out.getvalue()
