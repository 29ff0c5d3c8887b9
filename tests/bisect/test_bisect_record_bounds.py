"""A bisect's own ``bisect.json`` is read bounded: nested past the depth, with
non-finite numbers, too large or not a regular file, ``soak bisect --out`` on
it is one line naming the file and exit 2, never a RecursionError traceback
(and never a wait on a FIFO)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from soak.cli import main

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "workloads" / "bisect-demo" / "base.yaml"


def _bisect_file(tmp_path: Path) -> Path:
    doc = {"name": "ci-bisect", "base": str(BASE), "segment": "5s", "stop_at": 0.95, "seed": 1,
           "budget": {"segments": 4}, "rates": {"mtbf_min": "1s", "mtbf_max": "1h", "max_ratio": None},
           "builds": [{"label": f"b{i + 1}", "target": {"kind": "simulator", "sim": {"time_scale": 20}}}
                      for i in range(2)]}
    path = tmp_path / "bisect.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize("content, said", [
    ("[" * 200_000 + "]" * 200_000, "nesting_depth"),
    ('{"builds": [{"label": "b1"}], "x": 1e999}', "out of range"),
    ('{"builds": NaN}', "NaN"),
])
def test_a_damaged_bisect_json_is_one_line_and_exit_2(tmp_path, capsys, content, said) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "bisect.json").write_text(content)
    assert main(["bisect", str(_bisect_file(tmp_path)), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bisect.json" in err and said in err, err
