"""The onset interval travels from the decision to the incident record and summary.json (issue 37)."""

from __future__ import annotations

import json

from soak.records import IncidentKind, IncidentRecord
from soak.store.summary import disk_incidents


def record(**kw) -> IncidentRecord:
    return IncidentRecord(number=1, kind=IncidentKind.HANG, rule="pp_tail_stall", onset_at=1000.25,
                          detected_at=1001.7, killed_pids=(), gpus_released=None, gpu_free_s=None,
                          evidence="incidents/1", summary="hang", **kw)


def test_the_record_keeps_the_interval_through_json():
    r = record(onset_earliest_at=999.0, onset_latest_at=1000.25)
    back = IncidentRecord.from_json(json.loads(json.dumps(r.to_json())))
    assert (back.onset_earliest_at, back.onset_latest_at) == (999.0, 1000.25)
    # a record written before issue 37 reads back with no interval
    old = {k: v for k, v in r.to_json().items() if not k.startswith("onset_e") and k != "onset_latest_at"}
    assert IncidentRecord.from_json(old).onset_earliest_at is None


def test_summary_incidents_carry_the_interval(tmp_path):
    bundle = tmp_path / "incidents" / "1"
    bundle.mkdir(parents=True)
    r = record(onset_earliest_at=999.0, onset_latest_at=1000.25)
    (bundle / "incident.json").write_text(json.dumps({"number": 1, "status": "done", "record": r.to_json()}))
    [entry] = disk_incidents(tmp_path)
    assert (entry["onset_earliest_at"], entry["onset_latest_at"]) == (999.0, 1000.25)
    assert entry["onset_at"] == 1000.25
