"""Parse the NCCL watchdog and vLLM hang lines of a server log into records.

Pure: lines in, ``WatchdogLine`` records out. The signatures are the ones of
FACTS.md (PyTorch ProcessGroupNCCL's watchdog, vLLM's shm_broadcast and
multiproc executor); a worker's ``(Worker_PP3 pid=1234)`` prefix is kept as
``worker``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

_WORKER = re.compile(r"\((?P<worker>Worker[\w]*) pid=(?P<pid>\d+)\)")
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("watchdog_failure", re.compile(
        r"\[PG ID (?P<pg_id>\d+) PG GUID (?P<pg_guid>[^\s(\]]+)(?:\((?P<pg_desc>[^)]*)\))? Rank (?P<rank>\d+)\]"
        r"\s+failure detected by watchdog at work sequence id: (?P<seq>\d+)")),
    ("pg_status", re.compile(
        r"(?:\[PG ID (?P<pg_id>\d+) PG GUID (?P<pg_guid>[^\s(\]]+)(?:\((?P<pg_desc>[^)]*)\))? Rank (?P<rank>\d+)\] )?"
        r"PG status: last enqueued work: (?P<last_enqueued>-?\d+),(?: last started work: (?P<last_started>-?\d+),)?"
        r" last completed work: (?P<last_completed>-?\d+)")),
    ("collective_timeout", re.compile(
        r"(?:\[Rank (?P<rank>\d+)\] )?Watchdog caught collective operation timeout: WorkNCCL\("
        r"SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)(?:, NumelIn=(?P<numel_in>\d+))?(?:, NumelOut=(?P<numel_out>\d+))?"
        r"(?:, Timeout\(ms\)=(?P<timeout_ms>\d+))?\)(?: ran for (?P<ran_ms>\d+) milliseconds before timing out)?")),
    ("shm_broadcast_wait", re.compile(
        r"No available shared memory broadcast block found in (?P<seconds>\d+) seconds")),
    ("rpc_timeout", re.compile(r"RPC call to (?P<method>\w+) timed out")),
    ("engine_dead", re.compile(r"EngineDeadError|EngineCore encountered an issue")),
)
_PG_STATUS = dict(_PATTERNS)["pg_status"]
_INT_FIELDS = {"pg_id", "rank", "seq", "last_enqueued", "last_started", "last_completed", "numel_in",
               "numel_out", "timeout_ms", "ran_ms", "seconds", "pid"}


@dataclass(frozen=True)
class WatchdogLine:
    signature: str
    line: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    ts: float | None = None


def parse_line(line: str, *, ts: float | None = None) -> WatchdogLine | None:
    for signature, pattern in _PATTERNS:
        m = pattern.search(line)
        if m is None:
            continue
        fields: dict[str, Any] = {k: v for k, v in m.groupdict().items() if v is not None}
        if signature == "watchdog_failure":  # torch >= 2.6 puts the PG status on the same line
            status = _PG_STATUS.search(line, m.end())
            if status:
                fields.update({k: v for k, v in status.groupdict().items() if v is not None and k not in fields})
        w = _WORKER.search(line)
        if w:
            fields.update(w.groupdict())
        for key in _INT_FIELDS & fields.keys():
            fields[key] = int(fields[key])
        return WatchdogLine(signature, line.rstrip("\n"), fields, ts)
    return None


def parse_lines(lines: Iterable[str]) -> list[WatchdogLine]:
    out = []
    for line in lines:
        parsed = parse_line(line)
        if parsed is not None:
            out.append(parsed)
    return out


def from_json(obj: Any) -> list[WatchdogLine]:
    """Whatever the responder wrote to watchdog.json: a list of lines, of
    ``{"line", "ts"?, ...}`` objects, or ``{"lines": [...]}``."""
    if isinstance(obj, Mapping):  # the responder's {"from_samples": [...], "from_log_tail": [...]}
        obj = [*(obj.get("lines") or obj.get("matches") or []), *(obj.get("from_samples") or []),
               *(obj.get("from_log_tail") or [])]
    out = []
    for item in obj if isinstance(obj, list) else []:
        if isinstance(item, str):
            parsed = parse_line(item)
        elif isinstance(item, Mapping) and isinstance(item.get("line"), str):
            ts = item.get("ts")
            parsed = parse_line(item["line"], ts=ts if isinstance(ts, (int, float)) else None)
        else:
            parsed = None
        if parsed is not None:
            out.append(parsed)
    return out
