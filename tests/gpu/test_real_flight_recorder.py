"""The flight-recorder reader against real dumps made by PyTorch on an H200.

These need no GPU and no torch: the dumps are checked-in files
(tests/fixtures/flight_recorder/real/README.md says how they were made).
"""

from __future__ import annotations

import re
from pathlib import Path

import soak.flightrec.dumps as fr

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "flight_recorder" / "real"


def _group(dump, desc):
    return next(g for g in dump.groups if g.desc == desc)


def test_pipe_dump_from_real_nccl_names_the_pending_broadcast():
    dump = fr.read_dump(REAL / "nccl_pipe" / "nccl_trace_rank_0")
    assert dump.rank == 0
    assert dump.version == "2.10"
    assert {g.desc for g in dump.groups} == {"default_pg", "pp_broadcast"}
    pp = _group(dump, "pp_broadcast")
    assert (pp.last_enqueued, pp.last_started, pp.last_completed) == (13, 12, 12)
    assert pp.pending == ("13 nccl:broadcast (scheduled)",)
    assert pp.ranks == (0,)
    default = _group(dump, "default_pg")
    assert default.last_enqueued == default.last_completed == 3 and default.pending == ()


def test_summary_of_a_real_dump_reports_the_collective_that_never_completed():
    summary = fr.summarize_dumps(REAL / "nccl_pipe")
    assert summary.errors == ()
    assert summary.ranks == (0,)
    first = summary.groups[0]  # the interesting group sorts first
    assert first.desc == "pp_broadcast"
    assert first.stuck_seq == 13
    assert first.behind_ranks == ()
    assert "13 never completed" in first.note
    # The JSON form the responder writes reads back to the same summary.
    assert fr.FlightRecorderSummary.from_json(summary.to_json()) == summary


def test_dump_written_by_the_watchdog_on_timeout_is_readable():
    dump = fr.read_dump(REAL / "nccl_timeout" / "nccl_trace_rank_0")
    pp = _group(dump, "pp_broadcast")
    assert pp.last_enqueued == 13 and pp.last_completed == 12
    assert dump.entry_count == 16
    # The log beside it is not taken for a dump.
    assert [p.name for p in fr.dump_files(REAL / "nccl_timeout")] == ["nccl_trace_rank_0"]


def test_the_real_watchdog_lines_carry_the_fields_the_log_rules_read():
    text = (REAL / "nccl_timeout" / "watchdog.log").read_text()
    timeout = re.search(
        r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+), OpType=(\w+), NumelIn=(\d+)"
        r".*?Timeout\(ms\)=(\d+)\) ran for (\d+) milliseconds before timing out",
        text,
    )
    assert timeout and timeout.groups() == ("13", "BROADCAST", "6", "3000", "3082")
    status = re.search(
        r"\[PG ID (\d+) PG GUID (\d+)\((\w+)\) Rank (\d+)\]\s+failure detected by watchdog at work sequence id: (\d+)"
        r" PG status: last enqueued work: (\d+), last completed work: (\d+)",
        text,
    )
    assert status and status.groups() == ("1", "1", "pp_broadcast", "0", "13", "13", "12")


def test_real_three_rank_dump_names_the_last_rank_behind():
    summary = fr.summarize_dumps(REAL / "gloo_pp3")
    assert summary.errors == ()
    assert summary.ranks == (0, 1, 2)
    pp = summary.groups[0]
    assert pp.desc == "pp_broadcast"
    assert pp.behind_ranks == (2,)
    assert pp.stuck_seq == 55
    assert [(r.rank, r.last_enqueued, r.last_completed) for r in pp.rows] == [(0, 55, 54), (1, 55, 54), (2, 54, 54)]
    assert "rank 2 never enqueued collective 55" in pp.note


def test_the_log_watcher_parses_the_real_watchdog_timeout_line():
    from soak.probes.logwatch import parse_log_line

    matches = [m for line in (REAL / "nccl_timeout" / "watchdog.log").read_text().splitlines()
               if (m := parse_log_line(line)) is not None]
    timeout = next(m for m in matches if m.signature == "nccl_watchdog_timeout")
    assert {k: timeout.fields[k] for k in ("seq", "op_type", "numel_in", "timeout_ms", "ran_for_ms")} == {
        "seq": 13, "op_type": "BROADCAST", "numel_in": 6, "timeout_ms": 3000, "ran_for_ms": 3082}
    failure = next(m for m in matches if m.signature == "nccl_watchdog_failure")
    assert failure.fields["pg_name"] == "pp_broadcast" and failure.fields["seq"] == 13
