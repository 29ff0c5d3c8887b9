"""The log watcher: a pure line parser plus a few lines of tailing I/O.

``parse_log_line(line)`` knows the signatures of FACTS.md and returns a
``LogMatch`` (signature, fatal, parsed fields) or None. ``LogTailer`` reads the
lines appended to a file since the last call (following truncation and
rotation, bounded per call), and ``LogProbe`` turns matches into LogSamples.
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from soak.clock import Clock
from soak.samples import LogSample


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
        return LogMatch("shm_broadcast_wait", False, fields)
    rpc = _RPC_TIMEOUT.search(line)
    if rpc:
        fields["method"] = rpc.group("method")
        return LogMatch("sample_tokens_timeout", True, fields)
    if _ENGINE_DEAD.search(line):
        return LogMatch("engine_dead", True, fields)
    return None


class LogTailer:
    """Lines appended to ``path`` since the previous call; at most ``max_bytes`` a call."""

    def __init__(self, path: str | Path, *, from_start: bool = True, max_bytes: int = 1 << 20) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._offset: int | None = 0 if from_start else None
        self._inode: int | None = None
        self._partial = b""

    def read_lines(self) -> list[str]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return []
        if self._offset is None:  # start at the end of what is there now
            self._offset, self._inode = st.st_size, st.st_ino
            return []
        if self._inode is not None and st.st_ino != self._inode or st.st_size < self._offset:
            self._offset, self._partial = 0, b""  # rotated or truncated
        self._inode = st.st_ino
        if st.st_size == self._offset:
            return []
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            chunk = fh.read(self.max_bytes)
        self._offset += len(chunk)
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        if len(self._partial) > self.max_bytes:  # a runaway line: hand it on in pieces
            lines.append(self._partial)
            self._partial = b""
        return [raw.decode("utf-8", "replace").rstrip("\r") for raw in lines]


class LogProbe:
    name = "log"

    def __init__(self, path: str | Path, *, clock: Clock, interval_s: float = 0.25, from_start: bool = True) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._tailer = LogTailer(path, from_start=from_start)

    async def collect(self) -> list[LogSample]:
        lines = await asyncio.to_thread(self._tailer.read_lines)
        now = self._clock.now()
        out = []
        for line in lines:
            match = parse_log_line(line)
            if match is not None:
                out.append(LogSample(now, match.signature, strip_ansi(line), match.fatal, dict(match.fields)))
        return out

    async def aclose(self) -> None:
        pass
