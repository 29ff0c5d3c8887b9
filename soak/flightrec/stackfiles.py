"""An incident bundle's py-spy stacks and process states, read into ``stacks.Worker``s,
and the one diagnosis file (``diagnosis.json``) the responder writes beside them.

Files read (``incidents/N/``): ``processes.json`` (the tree the responder saw:
pid, name, cmdline), ``process_states.json`` (each PID's /proc state letter and
CPU just before py-spy attached), ``py-spy-<pid>.txt``. Every read is bounded;
a file that cannot be read counts as absent.

``diagnosis.json`` (schema version 1), what ``bench/real_vllm_hangs.py`` and
``soak diagnose`` read::

    {"version": 1,
     "source": "flight_recorder" | "py-spy" | "none",   # what named the rank
     "line": str,                                       # the one diagnosis line
     "faulty": {"rank", "stage", "pid"} | null,          # the rank that is behind
     "group": "pp" | ... | null, "seq": int | null,      # seq: flight recorder only
     "reason": "missing_send" | "spinning" | "stopped" | ... | "diverged" | "none",
     "blocked": {"rank", "stage", "pid", "call", "vllm_line"} | null,
     "flight_recorder": str,                             # what the flight recorder gave, one line
     "stacks": StackDiagnosis.to_json() | null}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from soak.bounds import InputRejected, read_file
from soak.flightrec.stacks import MAX_FIELD, Place, Stack, StackDiagnosis, Worker, diagnose_stacks, parse_py_spy
from soak.jsonl import read_json
from soak.printable import printable
from soak.metric_names import ProcessRole, parse_process_title

DIAGNOSIS_FILE = "diagnosis.json"
STATES_FILE = "process_states.json"
MAX_STACK_BYTES = 4 * 1024 * 1024


def _title(proc: Mapping[str, Any]) -> str:
    cmdline = proc.get("cmdline") or []
    return " ".join([str(proc.get("name") or ""), " ".join(map(str, cmdline if isinstance(cmdline, list) else []))])


def workers_from_bundle(incident: Path) -> list[Worker]:
    """The vLLM workers of the tree in ``incident/processes.json``, with their stacks."""
    obj = read_json(incident / "processes.json")
    procs = obj.get("processes") if isinstance(obj, dict) else None
    states = read_json(incident / STATES_FILE)
    states = states.get("pids") if isinstance(states, dict) else None
    states = states if isinstance(states, dict) else {}
    workers: list[Worker] = []
    seen: set[int] = set()
    for proc in procs if isinstance(procs, list) else []:
        if not isinstance(proc, dict) or not isinstance(proc.get("pid"), int) or proc["pid"] in seen:
            continue
        pid = proc["pid"]
        state = states.get(str(pid)) if isinstance(states.get(str(pid)), dict) else {}
        stack = _stack(incident / f"py-spy-{pid}.txt")
        # The title at the incident: the tree's record may hold the command line a worker
        # had before vLLM titled it (a process first seen at start-up).
        titles = [state.get("title") if isinstance(state.get("title"), str) else None,
                  stack.title if stack is not None else None, _title(proc)]
        # Made printable before it is read, so the title named is the title shown.
        title = next((t for t in (printable(t, limit=MAX_FIELD) for t in titles if t) if _is_worker(t)), None)
        if title is None:
            continue
        seen.add(pid)
        letter = state.get("state") if isinstance(state.get("state"), str) else None
        cpu = state.get("cpu") if isinstance(state.get("cpu"), (int, float)) else None
        workers.append(Worker(pid=pid, title=title, state=letter, stack=stack if stack and stack.threads else None,
                              cpu=cpu))
    return workers


def _is_worker(title: str) -> bool:
    parsed = parse_process_title(title)
    return parsed is not None and parsed.role is ProcessRole.WORKER


def _stack(path: Path) -> Stack | None:
    """The dump as parsed; its header's title even where py-spy failed (a stopped process)."""
    try:
        text = read_file(path, limit=MAX_STACK_BYTES, devices=False).decode("utf-8", "replace")
    except (OSError, InputRejected):
        return None
    return parse_py_spy(text)


def stack_diagnosis(incident: Path) -> StackDiagnosis | None:
    """The stacks' diagnosis of an incident bundle; None where it holds no worker stacks."""
    workers = workers_from_bundle(incident)
    if not any(w.stack is not None or w.state == "T" for w in workers):
        return None
    return diagnose_stacks(workers)


def _who(p: Place | None) -> dict[str, Any] | None:
    return None if p is None else {"rank": p.rank, "stage": p.stage, "pid": p.pid}


def diagnosis_record(*, flight_recorder: str, fr_line: str | None, fr_detail: Mapping[str, Any] | None,
                     places: Mapping[int, Mapping[str, Any]] | None,
                     stacks: StackDiagnosis | None) -> dict[str, Any]:
    """``diagnosis.json``'s content: the flight recorder's divergence when it found one,
    else the stacks' (pure; ``places``: rank -> {stage, pid} from the tree)."""
    base: dict[str, Any] = {"version": 1, "source": "none", "line": None, "faulty": None, "group": None,
                            "seq": None, "reason": "none", "blocked": None, "flight_recorder": flight_recorder,
                            "stacks": stacks.to_json() if stacks is not None else None}
    diverged = [g for g in (fr_detail or {}).get("groups") or () if isinstance(g, dict) and g.get("kind") != "none"]
    if fr_line and diverged:
        g = diverged[0]
        odd = g.get("odd_ranks") or []
        rank = odd[0] if odd and isinstance(odd[0], int) else None
        where = (places or {}).get(rank, {}) if rank is not None else {}
        base.update(source="flight_recorder", line=fr_line, group=g.get("desc") or g.get("group"), seq=g.get("seq"),
                    reason="diverged",
                    faulty=None if rank is None else {"rank": rank, "stage": where.get("stage"), "pid": where.get("pid")})
        return base
    if stacks is not None and stacks.named:
        blocked = stacks.blocked
        base.update(source="py-spy", line=stacks.line, group=stacks.group, reason=stacks.reason.value,
                    faulty=_who(stacks.faulty),
                    blocked=None if blocked is None else {**(_who(blocked) or {}), "call": blocked.call,
                                                          "vllm_line": blocked.vllm_frame})
        return base
    # No rank named: the flight recorder's line when it had dumps, else what the stacks show.
    base["line"] = fr_line or (stacks.line if stacks is not None else None)
    return base


def read_diagnosis(incident: Path) -> dict[str, Any] | None:
    obj = read_json(incident / DIAGNOSIS_FILE)
    return obj if isinstance(obj, dict) and obj.get("version") == 1 else None


