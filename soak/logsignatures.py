"""The log signatures of FACTS.md: which line of a vLLM/torch server log says what.

``parse_log_line(line)`` returns a ``LogMatch`` (signature, fatal, parsed fields)
or None. Pure, and a leaf: the log probe matches the lines it tails with it, the
responder re-parses an incident's log tail (``watchdog.json``), and the report
reads both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class LogMatch:
    signature: str
    fatal: bool
    fields: Mapping[str, Any] = field(default_factory=dict)


# vLLM 0.11.x colours the ``(Worker_PP3 pid=1234)`` prefix (``\033[1;36m...\033[0;0m``);
# 0.33's ColoredFormatter colours level and time on a terminal. Every form is stripped
# before matching: CSI sequences (colours, cursor moves) and stray OSC/escape bytes.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
# A bare ``Worker`` before its parallel groups are set up (0.33), ``Worker_DP0_PP3_TP1``,
# ``APIServer``, ``EngineCore_DP0``.
_WORKER = re.compile(r"\((?P<worker>[A-Za-z]+(?:_[A-Za-z0-9_]+)?) pid=(?P<pid>\d+)\)")
_PG = re.compile(
    r"\[PG ID (?P<pg_id>\d+) PG GUID (?P<pg_guid>[^\s(\]]+)(?:\((?P<pg_name>[^)]*)\))? Rank (?P<rank>\d+)\]"
)
_WATCHDOG_FAILURE = re.compile(r"failure detected by watchdog at work sequence id: (?P<seq>\d+)")
_PG_STATUS = re.compile(
    # torch 2.11 prints no "last started work" unless TORCH_NCCL_ENABLE_TIMING is set
    r"last enqueued work: (?P<last_enqueued>-?\d+),(?: last started work: (?P<last_started>-?\d+),)?"
    r" last completed work: (?P<last_completed>-?\d+)"
)
_WATCHDOG_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\((?P<args>[^)]*\)?[^)]*)\)")
_RANK = re.compile(r"\[Rank (?P<rank>\d+)\]")
_RAN_FOR = re.compile(r"ran for (?P<ran_for_ms>\d+) milliseconds before timing out")
_WORK_ARG = re.compile(r"(?P<key>[A-Za-z]+(?:\(ms\))?)=(?P<value>[^,]+)")
_SHM = re.compile(r"No available shared memory broadcast block found in (?P<wait_s>\d+(?:\.\d+)?) seconds?")
# vLLM 0.11.0 times out only ``execute_model``; 0.11.1+ either that or ``sample_tokens``.
_RPC_TIMEOUT = re.compile(r"RPC call to (?P<method>sample_tokens|execute_model) timed out")
_ENGINE_DEAD = re.compile(r"EngineDeadError|EngineCore encountered an issue")
# vLLM's jit_monitor: ``Triton kernel JIT compilation during inference: <kernel>. This causes ...``
# (a warning); builds with TileLang kernels say ``TileLang JIT compilation ...``.
_JIT_PHRASE = "JIT compilation during inference"
# Matched only around the phrase, with bounded names: a pattern that opens on an
# unbounded run of letters backtracks quadratically through a hostile megabyte line.
_JIT = re.compile(r"(?P<compiler>[A-Za-z]{1,32})(?: kernel)? JIT compilation during inference"
                  r"(?::\s{0,8}(?P<kernel>[A-Za-z0-9_.]{0,255}[A-Za-z0-9_]))?")
_JIT_BEFORE, _JIT_AFTER = 48, len(_JIT_PHRASE) + 300

# Signature names other parts branch on.
SHM_BROADCAST_WAIT = "shm_broadcast_wait"
# A precursor, never a verdict: a kernel compiled mid-serve (the trigger vllm#53577 names).
JIT_COMPILE = "jit_compile"

# WorkNCCL(...) argument names -> field names
_WORK_FIELDS = {
    "SeqNum": "seq",
    "OpType": "op_type",
    "NumelIn": "numel_in",
    "NumelOut": "numel_out",
    "Timeout(ms)": "timeout_ms",
}


def _int_or_str(value: str) -> int | str:
    value = value.strip()
    try:
        return int(value)
    except ValueError:
        return value


def strip_ansi(line: str) -> str:
    """``line`` without terminal escape sequences (vLLM colours its log prefixes)."""
    return _ANSI.sub("", line) if "\x1b" in line else line


def parse_log_line(line: str) -> LogMatch | None:
    """The signature a line carries, or None. Pure. ANSI colour codes are ignored.

    ``sample_tokens_timeout`` is the multiproc executor's RPC timeout, whichever
    method timed out (``fields["method"]``: ``sample_tokens`` or ``execute_model``).
    """
    line = strip_ansi(line)
    fields: dict[str, Any] = {}
    worker = _WORKER.search(line)
    if worker:
        fields["worker"] = worker.group("worker")
        fields["pid"] = int(worker.group("pid"))
    pg = _PG.search(line)
    if pg:
        fields["pg_id"] = int(pg.group("pg_id"))
        fields["pg_guid"] = pg.group("pg_guid")
        if pg.group("pg_name"):
            fields["pg_name"] = pg.group("pg_name")
        fields["rank"] = int(pg.group("rank"))
    status = _PG_STATUS.search(line)
    if status:
        fields.update({k: int(v) for k, v in status.groupdict().items() if v is not None})

    timeout = _WATCHDOG_TIMEOUT.search(line)
    if timeout:
        for m in _WORK_ARG.finditer(timeout.group("args")):
            key = _WORK_FIELDS.get(m.group("key"))
            if key:
                fields[key] = _int_or_str(m.group("value"))
        rank = _RANK.search(line)
        if rank and "rank" not in fields:
            fields["rank"] = int(rank.group("rank"))
        ran = _RAN_FOR.search(line)
        if ran:
            fields["ran_for_ms"] = int(ran.group("ran_for_ms"))
        return LogMatch("nccl_watchdog_timeout", True, fields)
    failure = _WATCHDOG_FAILURE.search(line)
    if failure:
        fields["seq"] = int(failure.group("seq"))
        return LogMatch("nccl_watchdog_failure", True, fields)
    if status and "PG status" in line:
        return LogMatch("nccl_pg_status", False, fields)
    shm = _SHM.search(line)
    if shm:
        fields["wait_s"] = float(shm.group("wait_s"))
        return LogMatch(SHM_BROADCAST_WAIT, False, fields)
    rpc = _RPC_TIMEOUT.search(line)
    if rpc:
        fields["method"] = rpc.group("method")
        return LogMatch("sample_tokens_timeout", True, fields)
    if _ENGINE_DEAD.search(line):
        return LogMatch("engine_dead", True, fields)
    at = line.find(_JIT_PHRASE)
    jit = _JIT.search(line, max(0, at - _JIT_BEFORE), at + _JIT_AFTER) if at >= 0 else None
    if jit:
        fields["compiler"] = jit.group("compiler")
        if jit.group("kernel"):
            fields["kernel"] = jit.group("kernel")
        return LogMatch(JIT_COMPILE, False, fields)
    return None
