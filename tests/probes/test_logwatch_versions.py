"""The log watcher reads vLLM 0.11.0's, 0.11.2's and 0.33's lines: ANSI-coloured
prefixes, both RPC timeouts, a bare ``Worker`` and grouped worker prefixes."""

from __future__ import annotations

import pytest

from soak.probes.logwatch import LogProbe, parse_log_line, strip_ansi
from soak.clock import ManualClock

CYAN, RESET = "\x1b[1;36m", "\x1b[0;0m"


@pytest.mark.parametrize("method", ["execute_model", "sample_tokens"])
def test_both_rpc_timeouts_are_fatal(method):
    m = parse_log_line(f"{CYAN}(EngineCore_DP0 pid=812){RESET} TimeoutError: RPC call to {method} timed out.")
    assert m is not None and m.signature == "sample_tokens_timeout" and m.fatal
    assert m.fields == {"worker": "EngineCore_DP0", "pid": 812, "method": method}


def test_other_rpc_names_are_not_a_hang_signature():
    assert parse_log_line("TimeoutError: RPC call to get_kv_cache_spec timed out.") is None


def test_ansi_everywhere_in_the_line_is_ignored():
    line = (f"{CYAN}(Worker_DP0_PP3_TP1 pid=51230){RESET} \x1b[32mINFO\x1b[0m \x1b[90m12-02 16:43:28\x1b[0m "
            "[shm_broadcast.py:466] No available shared memory broadcast block found in 60 seconds.")
    m = parse_log_line(line)
    assert m is not None and m.signature == "shm_broadcast_wait"
    assert m.fields == {"worker": "Worker_DP0_PP3_TP1", "pid": 51230, "wait_s": 60.0}
    assert "\x1b" not in strip_ansi(line)


def test_bare_worker_and_api_server_prefixes():
    m = parse_log_line("(Worker pid=9) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.")
    assert m.fields["worker"] == "Worker" and m.signature == "engine_dead"
    m = parse_log_line(f"{CYAN}(APIServer pid=7){RESET} ERROR 12-02 16:46:29 [async_llm.py:480] EngineDeadError")
    assert m.fields == {"worker": "APIServer", "pid": 7}


async def test_the_probe_records_lines_without_colour(tmp_path):
    path = tmp_path / "server.log"
    path.write_text(f"{CYAN}(EngineCore_DP0 pid=5){RESET} TimeoutError: RPC call to execute_model timed out.\n")
    probe = LogProbe(path, clock=ManualClock(), from_start=True)
    (sample,) = await probe.collect()
    assert sample.line == "(EngineCore_DP0 pid=5) TimeoutError: RPC call to execute_model timed out."
    assert sample.signature == "sample_tokens_timeout" and sample.fields["method"] == "execute_model"
