"""The log watcher: the pure line parser on FACTS.md's lines, and tailing a file a
real subprocess writes to."""

from __future__ import annotations

import subprocess
import sys

import pytest

from soak.clock import ManualClock
from soak.probes.logwatch import LogProbe, LogTailer, parse_log_line

FAILURE = (
    "(Worker_PP7 pid=51234) [rank7]:[E1202 16:42:28.123456789 ProcessGroupNCCL.cpp:632] [PG ID 8 PG GUID "
    "85(pp_broadcast) Rank 7] failure detected by watchdog at work sequence id: 40427"
)
STATUS = (
    "(Worker_PP7 pid=51234) [rank7]:[E1202 16:42:28.123456789 ProcessGroupNCCL.cpp:2066] [PG ID 8 PG GUID "
    "85(pp_broadcast) Rank 7] PG status: last enqueued work: 40432, last started work: -1, last completed work: 40426"
)
TIMEOUT = (
    "(Worker_PP3 pid=51230) [rank3]:[E1202 16:42:28.123 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=40427, OpType=BROADCAST, NumelIn=6, NumelOut=6, "
    "Timeout(ms)=60000) ran for 60005 milliseconds before timing out."
)
SHM = (
    "(EngineCore_DP0 pid=51200) INFO 12-02 16:41:28 [shm_broadcast.py:466] No available shared memory broadcast "
    "block found in 60 seconds. This typically happens when some processes are hanging or doing some "
    "time-consuming work (e.g. compilation, weight/kv cache quantization)."
)
RPC = "(EngineCore_DP0 pid=51200) ERROR 12-02 16:46:28 [core.py:710] TimeoutError: RPC call to sample_tokens timed out."
DEAD = (
    "(APIServer pid=51100) ERROR 12-02 16:46:29 [async_llm.py:480] vllm.v1.engine.exceptions.EngineDeadError: "
    "EngineCore encountered an issue. See stack trace (above) for the root cause."
)
STATS = (
    "(APIServer pid=51100) INFO 12-02 16:40:00 [loggers.py:127] Engine 000: Avg prompt throughput: 9810.2 tokens/s, "
    "Avg generation throughput: 41.0 tokens/s, Running: 7 reqs, Waiting: 0 reqs, GPU KV cache usage: 81.2%, "
    "Prefix cache hit rate: 94.1%"
)


def test_watchdog_failure_line_fields():
    m = parse_log_line(FAILURE)
    assert (m.signature, m.fatal) == ("nccl_watchdog_failure", True)
    assert m.fields == {"worker": "Worker_PP7", "pid": 51234, "pg_id": 8, "pg_guid": "85",
                        "pg_name": "pp_broadcast", "rank": 7, "seq": 40427}


def test_pg_status_line_fields():
    m = parse_log_line(STATUS)
    assert (m.signature, m.fatal) == ("nccl_pg_status", False)
    assert (m.fields["last_enqueued"], m.fields["last_started"], m.fields["last_completed"]) == (40432, -1, 40426)
    assert m.fields["pg_name"] == "pp_broadcast"


def test_watchdog_timeout_line_fields():
    m = parse_log_line(TIMEOUT)
    assert (m.signature, m.fatal) == ("nccl_watchdog_timeout", True)
    f = m.fields
    assert (f["seq"], f["op_type"], f["numel_in"], f["numel_out"], f["timeout_ms"]) == (40427, "BROADCAST", 6, 6, 60000)
    assert (f["rank"], f["ran_for_ms"], f["worker"]) == (3, 60005, "Worker_PP3")


@pytest.mark.parametrize(
    "line, signature, fatal",
    [(SHM, "shm_broadcast_wait", False), (RPC, "sample_tokens_timeout", True), (DEAD, "engine_dead", True)],
)
def test_other_signatures(line, signature, fatal):
    m = parse_log_line(line)
    assert (m.signature, m.fatal) == (signature, fatal)


def test_ordinary_lines_do_not_match():
    assert parse_log_line(STATS) is None
    assert parse_log_line("") is None
    assert parse_log_line("INFO: 127.0.0.1:5000 - \"POST /v1/chat/completions HTTP/1.1\" 200 OK") is None


def test_tailer_reads_appended_lines_holding_a_partial_one(tmp_path):
    path = tmp_path / "server.log"
    tail = LogTailer(path)
    assert tail.read_lines() == []  # no file yet
    path.write_bytes(b"one\ntw")
    assert tail.read_lines() == ["one"]
    with open(path, "ab") as fh:
        fh.write(b"o\r\nthree\n")
    assert tail.read_lines() == ["two", "three"]
    assert tail.read_lines() == []


def test_tailer_follows_truncation_and_rotation(tmp_path):
    path = tmp_path / "server.log"
    path.write_text("a\nb\n")
    tail = LogTailer(path)
    assert tail.read_lines() == ["a", "b"]
    path.write_text("c\n")  # truncated and rewritten shorter
    assert tail.read_lines() == ["c"]
    path.rename(tmp_path / "server.log.1")
    path.write_text("d\n")  # a new file under the name
    assert tail.read_lines() == ["d"]


def test_tailer_can_start_at_the_end(tmp_path):
    path = tmp_path / "given.log"
    path.write_text(DEAD + "\n")  # an old crash in a given file is not this run's
    tail = LogTailer(path, from_start=False)
    assert tail.read_lines() == []
    with open(path, "a") as fh:
        fh.write("new\n")
    assert tail.read_lines() == ["new"]


def test_tailer_bounds_each_read(tmp_path):
    path = tmp_path / "big.log"
    path.write_text("x" * 100 + "\n" + "y\n")
    tail = LogTailer(path, max_bytes=16)
    lines = []
    for _ in range(20):
        lines += tail.read_lines()
    # a runaway line comes out in bounded pieces, nothing lost, and the next line after it
    assert lines[-1] == "y"
    assert "".join(lines[:-1]) == "x" * 100
    assert all(len(line) <= 32 for line in lines)


async def test_log_probe_on_a_file_a_subprocess_writes(tmp_path):
    path = tmp_path / "server.log"
    script = "import sys\nfor line in sys.argv[2:]:\n    open(sys.argv[1], 'a').write(line + '\\n')\n"
    lines = [STATS, SHM, FAILURE, STATUS, TIMEOUT, RPC, DEAD]
    subprocess.run([sys.executable, "-c", script, str(path), *lines], check=True, timeout=30)
    clock = ManualClock(1_800_000_000.0)
    probe = LogProbe(path, clock=clock)
    samples = await probe.collect()
    assert [s.signature for s in samples] == [
        "shm_broadcast_wait", "nccl_watchdog_failure", "nccl_pg_status", "nccl_watchdog_timeout",
        "sample_tokens_timeout", "engine_dead",
    ]
    assert all(s.ts == 1_800_000_000.0 for s in samples)
    assert samples[3].fields["op_type"] == "BROADCAST" and samples[3].fatal
    assert await probe.collect() == []
