"""Watchdog line parsing: FACTS.md's lines and the real torch 2.11 log."""

from __future__ import annotations

from soak.report.watchdog import from_json, parse_line, parse_lines

from report_paths import FLIGHT


def test_facts_lines_parse_with_their_fields():
    w = parse_line("(Worker_PP3 pid=1234) [PG ID 8 PG GUID 85(pp_broadcast) Rank 3] failure detected by "
                   "watchdog at work sequence id: 40427")
    assert w.signature == "watchdog_failure"
    assert w.fields == {"pg_id": 8, "pg_guid": "85", "pg_desc": "pp_broadcast", "rank": 3, "seq": 40427,
                        "worker": "Worker_PP3", "pid": 1234}
    s = parse_line("PG status: last enqueued work: 40432, last started work: -1, last completed work: 40426")
    assert (s.signature, s.fields["last_enqueued"], s.fields["last_started"], s.fields["last_completed"]) == (
        "pg_status", 40432, -1, 40426)
    t = parse_line("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=40427, "
                   "OpType=BROADCAST, NumelIn=6, Timeout(ms)=60000) ran for 60012 milliseconds before timing out.")
    assert (t.fields["seq"], t.fields["op"], t.fields["timeout_ms"], t.fields["ran_ms"]) == (40427, "BROADCAST", 60000, 60012)
    assert parse_line("No available shared memory broadcast block found in 60 seconds.").fields == {"seconds": 60}
    assert parse_line("TimeoutError: RPC call to sample_tokens timed out.").fields == {"method": "sample_tokens"}
    assert parse_line("INFO Avg generation throughput: 94.1 tokens/s") is None


def test_real_torch_log_carries_the_pg_status_on_the_failure_line():
    lines = parse_lines((FLIGHT / "real" / "nccl_timeout" / "watchdog.log").read_text().splitlines())
    failure = next(w for w in lines if w.signature == "watchdog_failure")
    assert failure.fields["seq"] == 13 and failure.fields["pg_desc"] == "pp_broadcast"
    assert (failure.fields["last_enqueued"], failure.fields["last_completed"]) == (13, 12)
    assert any(w.signature == "collective_timeout" and w.fields["timeout_ms"] == 3000 for w in lines)


def test_watchdog_json_shapes():
    line = "TimeoutError: RPC call to sample_tokens timed out."
    assert [w.signature for w in from_json([line, {"line": line, "ts": 5.0}, {"x": 1}])] == ["rpc_timeout"] * 2
    assert from_json({"lines": [line]})[0].fields["method"] == "sample_tokens"
    assert from_json("junk") == []
