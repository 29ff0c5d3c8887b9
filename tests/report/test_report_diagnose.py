"""soak diagnose on real dumps: the right group, collective, ranks and mismatch class."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from soak.cli import main as soak_main
from soak.flightrec.diagnose import RankPlace, diagnose
from soak.report.diagnose_cli import load

FR = Path(__file__).resolve().parents[1] / "fixtures" / "flight_recorder"
REAL = FR / "real"


def _diag(folder: Path, **kw):
    dumps, _ = load(folder)
    return diagnose(dumps, **kw)


def _group(d, desc):
    return next(g for g in d.groups if g.desc == desc)


def test_gloo_pp3_skipped_broadcast_names_rank_2_one_behind():
    d = _diag(REAL / "gloo_pp3")
    g = _group(d, "pp_broadcast")
    assert d.diverged and g.kind == "missing"
    assert (g.seq, g.odd_ranks, g.reference_ranks, g.offsets) == (55, (2,), (0, 1), {2: 1})
    assert d.line.startswith("pp_broadcast: rank 2 is 1 collective behind ranks 0, 1 at seq 55")


def test_pp8_rank_7_behind_with_stage_gpu_pid():
    places = {r: RankPlace(r, stage=r, gpu=r, pid=1000 + r) for r in range(8)}
    d = _diag(FR / "pp8_deadlock", places=places)
    g = _group(d, "pp_broadcast")
    assert (g.kind, g.seq, g.odd_ranks, g.offsets[7]) == ("missing", 40427, (7,), 6)
    assert "rank 7 is 6 collectives behind ranks 0-6 at seq 40427" in d.line
    assert "rank 7: stage 7, GPU 7, PID 1007" in d.line


@pytest.mark.parametrize("name", ["nccl_pipe", "nccl_timeout"])
def test_h200_single_rank_dumps_no_divergence_but_collective_13_pending(name):
    d = _diag(REAL / name)
    assert not d.diverged
    assert d.line.startswith("no divergence")
    assert "pp_broadcast collective 13 not completed" in d.line


def test_gloo_healthy_set_says_no_divergence():
    d = _diag(REAL / "gloo_pp4_healthy")
    assert not d.diverged and d.line.startswith("no divergence (4 ranks")


def test_gated_broadcast_is_a_size_mismatch_with_the_last_rank_one_behind():
    d = _diag(REAL / "gloo_pp4_gated")
    g = _group(d, "pp_broadcast")
    assert (g.kind, g.odd_ranks, g.reference_ranks, g.offsets.get(3)) == ("size", (3,), (0, 1, 2), 1)
    assert "broadcast [[" in d.line and ", 5]] Long" in d.line


def test_race_is_a_size_mismatch_with_the_others_a_step_ahead():
    d = _diag(REAL / "gloo_pp3_race")
    g = _group(d, "pp_broadcast")
    assert (g.kind, g.odd_ranks, g.reference_ranks, g.offsets.get(2)) == ("size", (2,), (0, 1), 3)


def test_size_and_dtype_classes_on_edited_real_dumps(tmp_path):
    dumps, _ = load(REAL / "gloo_pp4_healthy")
    seq = max(e["collective_seq_id"] for e in dumps[1]["entries"]) - 2
    edited = json.loads(json.dumps(dumps, default=list))
    edited = {int(k): v for k, v in edited.items()}
    entry = next(e for e in edited[1]["entries"] if e["collective_seq_id"] == seq)
    entry["input_dtypes"] = ["Float"]
    d = diagnose(edited)
    g = _group(d, "pp_broadcast")
    assert (g.kind, g.seq, g.odd_ranks) == ("dtype", seq, (1,))
    entry["input_dtypes"] = dumps[1]["entries"][0]["input_dtypes"]
    entry["profiling_name"] = "gloo:all_reduce"
    assert _group(diagnose(edited), "pp_broadcast").kind == "op"


def test_cli_exit_codes_and_json(capsys):
    assert soak_main(["diagnose", str(REAL / "gloo_pp3")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("pp_broadcast: rank 2 is 1 collective behind") and "rank" in out[2]
    assert soak_main(["diagnose", "--json", str(REAL / "gloo_pp4_healthy")]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["diverged"] is False and obj["line"].startswith("no divergence")
    assert soak_main(["diagnose", str(FR / "not_a_dump")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not_a_dump" in err and "Traceback" not in err


def test_incident_dir_maps_ranks_to_stage_gpu_pid(tmp_path, capsys):
    import shutil

    inc = tmp_path / "run" / "incidents" / "1"
    shutil.copytree(REAL / "gloo_pp3", inc / "flight_recorder")
    procs = [{"pid": 4242 + r, "name": f"VLLM::Worker_PP{r}", "cmdline": []} for r in range(3)]
    (inc / "processes.json").write_text(json.dumps({"root": None, "processes": procs}))
    assert soak_main(["diagnose", str(tmp_path / "run")]) == 1
    line = capsys.readouterr().out.splitlines()[0]
    assert "(rank 2: stage 2, GPU 2, PID 4244)" in line


def test_eight_rank_race_names_the_last_rank_as_fr_trace_does():
    """gloo_pp8_race: `make_gloo.py OUT --pp-size 8 --fault pp_race` (torch 2.13.0+cpu);
    fr_trace.txt beside it is PyTorch's analyzer on the same dumps (pg_config filled in)."""
    folder = REAL / "gloo_pp8_race"
    d = _diag(folder)
    g = _group(d, "pp_broadcast")
    assert (g.kind, g.seq, g.odd_ranks, g.reference_ranks) == ("size", 91, (7,), tuple(range(7)))
    theirs = (folder / "fr_trace.txt").read_text()
    assert theirs.startswith("Collective sequence number: 91 has errors")
    assert "Culprit rank 7; Error type: SIZE_OR_SYNTAX_MISMATCH" in theirs.split("Collective sequence number: 92")[0]
