"""``soak bisect`` as a user runs it: bad input is one line and exit 2; four
simulated builds (b3 the first bad one) bisected end to end through real
``soak run`` segments, named at 0.95; and a bisect SIGKILLed mid-way resumed
from its run directories to the same answer with no segment lost.

The two live tests run 4-6 short segments each (about 6 s of start-up and
report per segment on an idle machine, twice that on a busy one): 45-70 s
apiece, the price of one real bisect in CI. The builds are simulator configs
with their own wall_mtbf (good 10 min, bad 1 s); the bisect's seed fixes every
segment's draw, seed 1 one that takes 5 segments when nothing is killed (the
pure core's replay of the same draws)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from soak.cli import main

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "workloads" / "bisect-demo" / "base.yaml"


def _sim(wall_mtbf: str) -> dict:
    return {"kind": "simulator", "sim": {"time_scale": 20, "faults": [{"kind": "pp_deadlock", "wall_mtbf": wall_mtbf}]}}


def _bisect_file(tmp_path: Path, **over) -> Path:
    doc = {"name": "ci-bisect", "base": str(BASE), "segment": "5s", "stop_at": 0.95, "seed": 1,
           "budget": {"segments": 14},
           "rates": {"mtbf_min": "1s", "mtbf_max": "1h", "max_ratio": None},
           "builds": [{"label": f"b{i + 1}", "target": _sim("10m" if i < 2 else "1s")} for i in range(4)], **over}
    path = tmp_path / "bisect.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _soak(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "soak", "bisect", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.mark.parametrize("change, said", [
    ({"segmnet": "5s"}, "unknown key; did you mean 'segment'?"),
    ({"stop_at": 1.5}, "stop_at: "),
    ({"prior": [1, 2]}, "prior: needs 4 weights"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys, change, said) -> None:
    path = _bisect_file(tmp_path, **change)
    assert main(["bisect", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and said in err, err


def test_a_build_without_a_target_names_the_build(tmp_path: Path, capsys) -> None:
    doc = yaml.safe_load(_bisect_file(tmp_path).read_text())
    doc["builds"][2] = {"label": "b3"}
    doc["builds"][3]["target"]["sim"]["faults"][0]["wall_mtbf"] = "-1s"
    (tmp_path / "bisect.yaml").write_text(yaml.safe_dump(doc))
    assert main(["bisect", str(tmp_path / "bisect.yaml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "builds.2" in err or "builds[2]" in err, err
    assert main(["bisect", str(_bisect_file(tmp_path)), "--out", str(tmp_path / "new"), "--resume"]) == 2
    assert "no segments to resume" in capsys.readouterr().err


def _segment_dirs(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith("segment-") and p.is_dir())


def test_four_simulated_builds_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "bisect"
    proc = _soak(str(_bisect_file(tmp_path)), "--out", str(out))
    text, _ = proc.communicate(timeout=240)
    lines = text.strip().splitlines()
    assert proc.returncode == 0, text
    assert lines[-1].startswith("soak bisect: first bad build: b3 (posterior 0.9"), text
    doc = json.loads((out / "bisect.json").read_text())
    assert doc["now"]["state"] == "found" and doc["now"]["posterior"]["best"] == 2
    assert len(doc["segments"]) == len(_segment_dirs(out)) == sum(l.startswith("segment ") for l in lines)
    for seg in doc["segments"]:  # every segment an ordinary run directory with its report
        assert (Path(seg["run_dir"]) / "summary.json").is_file() and (Path(seg["run_dir"]) / "report.html").is_file()
        assert yaml.safe_load((Path(seg["run_dir"]) / "config.yaml").read_text())["build"] == seg["label"]
    # the simulator's wall_mtbf is in the harness's seconds: a hang's time at risk is the onset it drew
    for seg in doc["segments"]:
        config = yaml.safe_load((out / "configs" / f"{Path(seg['run_dir']).name}.yaml").read_text())
        sim = config["target"]["sim"]
        mean = {"10m": 600.0, "1s": 1.0}[sim["faults"][0]["wall_mtbf"]]
        drawn = random.Random(f"soak-sim-fault/{sim['seed']}/0/wall").expovariate(1 / mean)
        if seg["hangs"]:
            # never before the draw; after it by the detector's lag, longer on a loaded CI
            assert drawn - 0.5 < seg["exposure_s"] < drawn + 3.0, (seg, drawn)
        else:
            assert drawn > 5.0 - 1.0 and seg["exposure_s"] > 5.0 - 1.0
    html = (out / "bisect.html").read_text()
    assert "first bad build: b3" in html and html.count('class="build-line"') == 4


def test_a_killed_bisect_resumes_to_the_same_answer(tmp_path: Path) -> None:
    out = tmp_path / "bisect"
    # what the user knows of the rates (good hours, bad seconds) makes it 3-4 segments: CI time
    path = _bisect_file(tmp_path, rates={"mtbf_min": "0.5s", "mtbf_max": "1h", "max_ratio": None,
                                         "good_mtbf": ["1m", "1h"], "bad_mtbf": ["0.5s", "5s"]})
    proc = _soak(str(path), "--out", str(out))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the second segment under load
        dirs = _segment_dirs(out) if out.exists() else []
        events = out / dirs[-1] / "events.jsonl" if len(dirs) == 2 else None
        requests = out / dirs[-1] / "requests.jsonl" if len(dirs) == 2 else None
        # evidence in the second segment: an ok request (time at risk that counts) or its hang
        if (requests is not None and requests.is_file() and '"outcome":"ok"' in requests.read_text().replace(": ", ":")
                or events is not None and events.is_file() and '"incident' in events.read_text()):
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # no goodbye: no bisect.json update, the segment in flight orphaned
    proc.communicate(timeout=30)
    before = _segment_dirs(out)
    assert len(before) == 2
    again = _soak(str(path), "--out", str(out))
    text, _ = again.communicate(timeout=240)
    assert again.returncode == 0, text
    assert text.splitlines()[0].startswith("soak bisect: resuming ") and "2 segments read back" in text.splitlines()[0]
    assert text.strip().splitlines()[-1].startswith("soak bisect: first bad build: b3 (posterior 0.9"), text
    doc = json.loads((out / "bisect.json").read_text())
    after = _segment_dirs(out)
    assert after[:2] == before and len(doc["segments"]) == len(after)  # the cut segment counted, none lost
    cut = doc["segments"][1]
    assert cut["run_dir"].endswith(before[1]) and cut["exposure_s"] > 0


def test_sigterm_stops_the_segment_and_exits_130_and_a_spent_budget_exits_5(tmp_path: Path) -> None:
    out = tmp_path / "bisect"
    path = _bisect_file(tmp_path, budget={"segments": 1})
    proc = _soak(str(path), "--out", str(out))
    deadline = time.monotonic() + 60
    while not (out / ".running").is_file() and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int((out / ".running").read_text().split()[0])
    events = Path((out / ".running").read_text().split()[2]) / "events.jsonl"
    while time.monotonic() < deadline + 60:  # the segment's soak run under load, not still importing
        if events.is_file() and '"load_started"' in events.read_text().replace(": ", ":"):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    text, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, text
    assert "interrupted" in text.splitlines()[-1] and "resume with: soak bisect" in text.splitlines()[-1]
    assert not Path(f"/proc/{child}").exists() and (out / "bisect.json").is_file()
    # the same folder, resumed: the stopped segment is the one the budget allows, so nothing more runs
    again = _soak(str(path), "--out", str(out))
    text, _ = again.communicate(timeout=60)
    assert again.returncode == 5, text
    assert "undecided, the budget (segment count) is spent" in text.splitlines()[-1]
    assert json.loads((out / "bisect.json").read_text())["stopped_by"] == "segment bound"


def test_an_unreadable_segment_is_set_aside_and_its_number_reused(tmp_path: Path) -> None:
    from soak.bisect.cli import _set_aside
    from soak.bisect.segments import read_segments

    out = tmp_path / "bisect"
    out.mkdir()
    (out / "segment-000-build-1").mkdir()  # the bisect died before this run wrote anything
    assert read_segments(out, on_skip=lambda exc: _set_aside(exc, print)) == ()
    assert sorted(p.name for p in out.iterdir()) == ["segment-000-build-1.unreadable"]
    assert read_segments(out) == ()


def test_set_aside_finds_the_segment_from_a_file_inside_it(tmp_path: Path) -> None:
    from soak.bisect.cli import _set_aside
    from soak.errors import ConfigError

    seg = tmp_path / "segment-003-build-0"
    (seg / "incidents" / "1").mkdir(parents=True)
    _set_aside(ConfigError("damaged", path=seg / "incidents" / "1" / "incident.json"), print)
    assert (tmp_path / "segment-003-build-0.unreadable").is_dir() and not seg.exists()
    _set_aside(ConfigError("damaged", path=tmp_path / "elsewhere.json"), print)  # no segment: nothing renamed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["segment-003-build-0.unreadable"]


def _first_record(tmp_path: Path, path: Path) -> dict:
    """The bisect.json this bisect file makes before any segment, as a finished run leaves it."""
    from soak.bisect.cli import BISECT_JSON_LIMIT  # noqa: F401  (the bound the reader holds)
    from soak.bisect.executor import Build
    from soak.bisect.local import config_digest
    from soak.bisect.record import bisect_document
    from soak.bisect.spec import load_bisect

    spec = load_bisect(path)
    builds = [Build(i, label) for i, label in enumerate(spec.labels)]
    return bisect_document(builds, (), model=spec.model, segment_s=spec.config.segment,
                           digests=[config_digest(c) for c in spec.segment_configs])


@pytest.mark.parametrize("change, said", [
    ({"segment": "7s"}, "other settings (segment (5s then, 7s now))"),
    ({"prior": [1, 1, 1, 5]}, "other settings (prior)"),
    ({"rates": {"mtbf_min": "1s", "mtbf_max": "2h", "max_ratio": None}}, "other settings (rates)"),
    ({"builds": [{"label": f"b{i + 1}", "target": _sim("10m" if i < 1 else "1s")} for i in range(4)]},
     "other settings (the target or run config of b2)"),
])
def test_a_resume_under_changed_settings_is_refused_by_name(tmp_path: Path, capsys, change, said) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "bisect.json").write_text(json.dumps(_first_record(tmp_path, _bisect_file(tmp_path))))
    (out / "segment-000-build-2").mkdir()
    assert main(["bisect", str(_bisect_file(tmp_path, **change)), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err
    # unchanged (or only the budget) it goes on: no refusal before the segments are read
    from soak.bisect.cli import _check_out
    from soak.bisect.spec import load_bisect

    same = _bisect_file(tmp_path, budget={"segments": 30})
    _check_out(out, load_bisect(same).labels, resume=True, expect=_first_record(tmp_path, same))


def test_a_hostile_bisect_json_is_refused_in_one_printable_line(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "segment-000-build-0").mkdir()
    (out / "bisect.json").write_text(json.dumps({"builds": [{"label": "b1\x1b[2J\nsoak bisect: found b9"}]}))
    assert main(["bisect", str(_bisect_file(tmp_path)), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and "a bisect of other builds" in err
    with open(out / "bisect.json", "wb") as f:  # a file past the bound is not read whole
        f.truncate((64 << 20) + 1)
    assert main(["bisect", str(_bisect_file(tmp_path)), "--out", str(out)]) == 2
    assert "over 64 MiB" in capsys.readouterr().err
