"""The flight-recorder reader on dumps in PyTorch's layouts (tests/fixtures/flight_recorder)."""

from __future__ import annotations

import json
import pickle

import pytest

from soak.flightrec import dumps as fr

from report_paths import FLIGHT


def test_pp8_deadlock_names_the_last_stage_as_behind():
    summary = fr.summarize_dumps(FLIGHT / "pp8_deadlock")
    assert summary.ranks == tuple(range(8)) and summary.versions == ("2.4",) and summary.errors == ()
    pp = summary.groups[0]
    assert pp.label == "85:pp_broadcast"
    assert pp.behind_ranks == (7,)
    assert pp.stuck_seq == 40427
    assert pp.max_enqueued == 40432 and pp.max_completed == 40426
    rows = {r.rank: r for r in pp.rows}
    assert (rows[0].last_enqueued, rows[0].last_completed) == (40432, 40426)
    assert (rows[7].last_enqueued, rows[7].last_completed, rows[7].behind) == (40426, 40426, True)
    assert rows[0].pending[0] == "40427 nccl:broadcast (started)"
    default = next(g for g in summary.groups if g.desc == "default_pg")
    assert default.behind_ranks == () and default.stuck_seq is None


def test_old_dump_without_pg_status_is_rebuilt_from_entries():
    summary = fr.summarize_dumps(FLIGHT / "v1_no_pg_status")
    (group,) = summary.groups
    assert group.behind_ranks == (1,)
    rows = {r.rank: r for r in group.rows}
    assert rows[0].last_enqueued == 12 and rows[1].last_enqueued == 11
    assert rows[0].last_completed == 10
    dump = fr.read_dump(FLIGHT / "v1_no_pg_status" / "trace_1")
    assert dump.groups[0].from_entries


def test_json_form_with_numbers_as_strings_reads_the_same():
    summary = fr.summarize_dumps(FLIGHT / "json_form")
    (group,) = summary.groups
    assert [(r.rank, r.last_enqueued, r.last_completed) for r in group.rows] == [(0, 7, 7), (1, 7, 7)]
    assert group.note == "in step"


def test_a_pickle_that_imports_code_is_refused_not_run(tmp_path):
    summary = fr.summarize_dumps(FLIGHT / "not_a_dump")
    assert summary.groups == ()
    assert len(summary.errors) == 1 and "refusing global os.system" in summary.errors[0]
    with pytest.raises(fr.FlightRecorderError):
        fr.read_dump(FLIGHT / "not_a_dump" / "nccl_trace_rank_0")


def test_missing_member_rank_is_reported_and_json_round_trips(tmp_path):
    for rank in (0, 1, 2):  # a 4-rank group, rank 3 left no dump
        dump = {"version": "2.5", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
                "pg_status": {"0": {"last_enqueued_collective": 5, "last_started_collective": -1,
                                    "last_completed_collective": 5}}, "entries": []}
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump))
    (tmp_path / "nccl_trace_rank_0.pipe").write_text("")  # the FIFO's name is not a dump
    summary = fr.summarize_dumps(tmp_path)
    assert summary.ranks == (0, 1, 2)
    assert summary.groups[0].missing_ranks == (3,)
    assert "no dump from rank 3" in summary.groups[0].note
    assert fr.FlightRecorderSummary.from_json(json.loads(json.dumps(summary.to_json()))) == summary


def test_garbage_file_is_an_error_line(tmp_path):
    (tmp_path / "nccl_trace_rank_0").write_bytes(b"\x00not a pickle")
    summary = fr.summarize_dumps(tmp_path)
    assert summary.groups == () and "not a flight-recorder dump" in summary.errors[0]
