"""bisect.json (soak/bisect/record.py): every segment with the posterior after
it, where the bisect stands, written atomically and read back as written."""

from __future__ import annotations

import json
from pathlib import Path

from soak.bisect.executor import Build, SegmentResult
from soak.bisect.posterior import model, posterior
from soak.bisect.record import bisect_document, write_bisect_json

MIN = 60.0


def test_the_document_after_every_segment(tmp_path: Path) -> None:
    builds = [Build(i, f"v0.{i}") for i in range(4)]
    results = [SegmentResult(2, tmp_path / "segment-000-build-2", 12 * MIN, 1, "hang"),
               SegmentResult(1, tmp_path / "segment-001-build-1", 30 * MIN, 0, "time")]
    m = model(builds=4)
    doc = bisect_document(builds, results, model=m, segment_s=30 * MIN)
    assert [s["label"] for s in doc["segments"]] == ["v0.2", "v0.1"]
    assert doc["segments"][0]["posterior"] == list(posterior([r.segment for r in results[:1]], model=m).first_bad)
    assert doc["segments"][1]["posterior"] == list(posterior([r.segment for r in results], model=m).first_bad)
    assert doc["now"]["state"] == "searching" and doc["now"]["next"]["build"] in range(4)
    write_bisect_json(tmp_path / "bisect.json", doc)
    back = json.loads((tmp_path / "bisect.json").read_text())
    assert back["segments"][0]["run_dir"] == str(results[0].run_dir) and back["now"] == json.loads(json.dumps(doc["now"]))
