"""Parse the NCCL watchdog and vLLM hang lines of a server log into records.

Pure: lines in, ``WatchdogLine`` records out. The signatures are the ones of
FACTS.md (PyTorch ProcessGroupNCCL's watchdog, vLLM's shm_broadcast and
multiproc executor); a worker's ``(Worker_PP3 pid=1234)`` prefix is kept as
``worker``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from soak.logsignatures import parse_log_line

# The line parser is the log probe's (one set of patterns for the live watcher
# and the report); the report keeps its own short names for signatures and fields.
_SIGNATURES = {
    "nccl_watchdog_failure": "watchdog_failure",
    "nccl_pg_status": "pg_status",
    "nccl_watchdog_timeout": "collective_timeout",
    "shm_broadcast_wait": "shm_broadcast_wait",
    "sample_tokens_timeout": "rpc_timeout",
    "engine_dead": "engine_dead",
}
_FIELDS = {"pg_name": "pg_desc", "op_type": "op", "ran_for_ms": "ran_ms", "wait_s": "seconds"}


@dataclass(frozen=True)
class WatchdogLine:
    signature: str
    line: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    ts: float | None = None


def parse_line(line: str, *, ts: float | None = None) -> WatchdogLine | None:
    match = parse_log_line(line)
    if match is None:
        return None
    fields = {_FIELDS.get(k, k): v for k, v in match.fields.items()}
    if isinstance(fields.get("seconds"), float) and fields["seconds"].is_integer():
        fields["seconds"] = int(fields["seconds"])
    return WatchdogLine(_SIGNATURES.get(match.signature, match.signature), line.rstrip("\n"), fields, ts)


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
