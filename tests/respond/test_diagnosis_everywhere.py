"""The flight-recorder diagnosis reaches every place a person looks: the incident
record (incident.json), summary.json, junit.xml and the live view's incident line
(both carry the incident summary)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from soak.flightrec.dumps import summarize_dumps
from soak.report.junit import build_junit
from soak.records import IncidentRecord
from soak.respond.collect import diagnosis_line
from soak.judge import summarize

GATED = Path(__file__).resolve().parents[1] / "fixtures" / "flight_recorder" / "real" / "gloo_pp4_gated"


def test_the_diagnosis_of_real_gated_dumps_reaches_the_record_summary_and_junit(tmp_path):
    incident = tmp_path / "run" / "incidents" / "1"
    shutil.copytree(GATED, incident / "flight_recorder", ignore=shutil.ignore_patterns("*.md"))
    (incident / "flight_recorder_summary.json").write_text(
        json.dumps(summarize_dumps(incident / "flight_recorder").to_json()))

    line = diagnosis_line(incident / "flight_recorder_summary.json")
    assert line and "size mismatch" in line and "rank 3" in line

    record = IncidentRecord(number=1, kind="hang", rule="pp_tail_stall", onset_at=1.0, detected_at=4.0,
                            killed_pids=(11,), gpus_released=True, gpu_free_s=0.1, evidence="incidents/1",
                            summary=f"hang (pp_tail_stall): detected 3.0s after onset; flight recorder: {line}",
                            diagnosis=line)
    assert IncidentRecord.from_json(record.to_json()).diagnosis == line
    (incident / "incident.json").write_text(json.dumps({"status": "done", "record": record.to_json()}))
    (tmp_path / "run" / "events.jsonl").write_text(
        json.dumps({"ts": 0.0, "type": "run_started", "run_id": "r"}) + "\n")

    summary = summarize(tmp_path / "run")
    assert summary["incidents"][0]["diagnosis"] == line
    junit = build_junit(summary, name="night")
    assert line in junit.decode() if isinstance(junit, bytes) else line in junit


def test_no_dumps_no_diagnosis(tmp_path):
    assert diagnosis_line(tmp_path / "flight_recorder_summary.json") is None
    (tmp_path / "flight_recorder_summary.json").write_text("{not json")
    assert diagnosis_line(tmp_path / "flight_recorder_summary.json") is None
