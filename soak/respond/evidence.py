"""The evidence bundle, ``incidents/N/``: each step bounded, each failure noted.

Files (ARCHITECTURE.md): ``incident.json``, ``samples.jsonl``, ``gpus.json``,
``processes.json``, ``metrics.txt``, ``log_tail.txt``, ``watchdog.json``,
``py-spy-<pid>.txt``, ``process_states.json``, ``flight_recorder/``,
``flight_recorder_summary.json``, ``diagnosis.json``.
Every file is written whole to a temporary name and renamed, so a harness killed
mid-incident leaves complete files or none.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, Sequence

from soak.flightrec.dumps import summarize_dumps
from soak.fsio import write_atomic
from soak.logsignatures import JIT_COMPILE, parse_log_line
from soak.plain import plain
from soak.samples import LogSample, Sample, to_json


def write_json(path: Path, obj: Any) -> None:
    write_atomic(path, (json.dumps(plain(obj), indent=2, sort_keys=False) + "\n").encode())


class Bundle:
    """One incident's directory and the outcome of every step that fills it.

    Every file goes through ``write_bytes``/``write_json``, which pass the run's
    redactor (``soak.redact``): command lines, log tails and py-spy dumps carry
    what the server was given."""

    def __init__(self, directory: Path, *, redactor: Any = None) -> None:
        self.dir = directory
        self.redactor = redactor
        self.steps: dict[str, dict[str, Any]] = {}
        self.dir.mkdir(parents=True, exist_ok=True)

    def write_bytes(self, path: Path, data: bytes) -> None:
        if self.redactor is not None:
            data = self.redactor.bytes(data)
        write_atomic(path, data)

    def write_json(self, path: Path, obj: Any) -> None:
        self.write_bytes(path, (json.dumps(plain(obj), indent=2, sort_keys=False) + "\n").encode())

    def notes(self) -> list[str]:
        return [f"{name}: {s['note']}" for name, s in self.steps.items() if s.get("note")]

    def record(self, name: str, *, ok: bool, elapsed_s: float, note: str | None = None, **extra: Any) -> None:
        entry: dict[str, Any] = {"ok": ok, "elapsed_s": round(elapsed_s, 3)}
        if note:
            entry["note"] = note
        entry.update(extra)
        self.steps[name] = entry

    async def step(self, name: str, make: Callable[[], Awaitable[Any]], timeout_s: float) -> Any:
        """Run one step with a deadline; a failure is recorded, never raised."""
        started = time.monotonic()
        try:
            result = await asyncio.wait_for(make(), max(timeout_s, 0.01))
        except asyncio.TimeoutError:
            self.record(name, ok=False, elapsed_s=time.monotonic() - started, note=f"timed out after {timeout_s:.1f}s")
            return None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.record(name, ok=False, elapsed_s=time.monotonic() - started, note=f"{type(exc).__name__}: {exc}")
            return None
        if name not in self.steps:
            self.record(name, ok=True, elapsed_s=time.monotonic() - started)
        else:  # the step recorded its own details
            self.steps[name]["elapsed_s"] = round(time.monotonic() - started, 3)
        return result


# --- the steps -------------------------------------------------------------------


def write_samples(bundle: Bundle, samples: Sequence[Sample], *, since: float) -> int:
    lines = [json.dumps(to_json(s)) for s in samples if s.ts >= since]
    bundle.write_bytes(bundle.dir / "samples.jsonl", ("\n".join(lines) + ("\n" if lines else "")).encode())
    return len(lines)


async def fetch_metrics(base_url: str, timeout_s: float) -> str:
    from soak import net

    from soak.bounds import fetch

    async with net.session() as session:  # a 3xx: RedirectRefused, never followed
        # Bounded in total time and decompressed bytes (BoundExceeded names the bound hit).
        resp = await fetch(session, base_url.rstrip("/") + "/metrics", total_s=timeout_s)
        if resp.status != 200:
            raise RuntimeError(f"/metrics answered HTTP {resp.status}")
        return resp.text()


def read_tail(path: Path, max_bytes: int) -> str:
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - max_bytes))
        data = fh.read()
    if size > max_bytes:
        # Drop the partial first line.
        cut = data.find(b"\n")
        data = data[cut + 1:] if cut >= 0 else data
    return data.decode("utf-8", errors="replace")


def watchdog_entries(samples: Iterable[Sample], log_tail: str | None) -> dict[str, Any]:
    """The log signatures seen: from the log probe's samples, and the tail re-parsed."""
    seen = []
    for s in samples:
        if isinstance(s, LogSample):
            seen.append({"ts": s.ts, "signature": s.signature, "fatal": s.fatal, "fields": plain(s.fields), "line": s.line})
    from_tail = []
    for line in (log_tail or "").splitlines():
        parsed = parse_log_line(line)
        if parsed:
            from_tail.append({"line": line, **plain(parsed)})
    return {
        "from_samples": seen,
        "from_log_tail": from_tail,
        "parser": f"{parse_log_line.__module__}.{parse_log_line.__name__}",
    }


def jit_precursors(samples: Iterable[Sample], *, since: float, until: float) -> list[LogSample]:
    """vLLM's jit_monitor lines seen in ``[since, until]``: kernels compiled mid-serve
    before the hang (the trigger vllm#53577 names), oldest first."""
    return sorted((s for s in samples if isinstance(s, LogSample) and s.signature == JIT_COMPILE
                   and since <= s.ts <= until), key=lambda s: s.ts)


def jit_precursor_note(precursors: Sequence[LogSample], onset_at: float) -> str | None:
    """One clause for the incident's summary, or None when no kernel compiled."""
    if not precursors:
        return None
    last = precursors[-1]
    kernel = last.fields.get("kernel") or "a kernel"
    where = f" on {last.fields['worker']}" if last.fields.get("worker") else ""
    offset = onset_at - last.ts
    when = f"{offset:.1f}s before onset" if offset >= 0 else f"{-offset:.1f}s after onset"
    more = f" ({len(precursors)} in the window)" if len(precursors) > 1 else ""
    return f"JIT compile during inference {when}: {kernel}{where}{more} (a precursor, not a verdict)"


def find_py_spy(command: str) -> str | None:
    if os.sep in command:
        return command if os.access(command, os.X_OK) else None
    found = shutil.which(command)
    if found:
        return found
    beside = Path(sys.executable).parent / command
    return str(beside) if os.access(beside, os.X_OK) else None


async def py_spy_dump(exe: str, pid: int, *, native: bool, timeout_s: float, dest: Path,
                      redact: Callable[[bytes], bytes] | None = None) -> tuple[bool, str | None]:
    """``py-spy dump --pid P`` into ``dest``; (ok, note)."""
    args = [exe, "dump", "--pid", str(pid)]
    if native:
        args.append("--native")
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except (asyncio.TimeoutError, asyncio.CancelledError):
        # Our own helper, by its handle: it must not outlive the step.
        proc.kill()
        await proc.wait()
        dest.write_bytes(b"")
        raise
    if redact is not None:
        out = redact(out)
    write_atomic(dest, out)
    if proc.returncode != 0:
        text = out.decode(errors="replace")
        first = text.strip().splitlines()
        note = f"exit {proc.returncode}: {first[0] if first else ''}"[:300]
        if ptrace_refused(text):
            note += "; " + PTRACE_HINT
        return False, note
    return True, None


# py-spy reads another process's memory through ptrace: Yama (ptrace_scope 1, the
# Ubuntu default, allows only descendants; the server is not the harness's child when
# attached), a container without CAP_SYS_PTRACE, or ptrace_scope 3 refuse it.
PTRACE_HINT = (
    "ptrace was refused, so no stack was captured: allow it with "
    "`sudo sysctl kernel.yama.ptrace_scope=0` (or run soak as root / with CAP_SYS_PTRACE; "
    "in a container add --cap-add SYS_PTRACE)"
)
_PTRACE_REFUSED = ("Operation not permitted", "Permission denied", "EPERM", "ptrace", "os error 1)", "os error 13)")


def ptrace_refused(output: str) -> bool:
    """Whether py-spy's output says the kernel refused to let it read the process."""
    return any(marker in output for marker in _PTRACE_REFUSED)


def flight_recorder_summary(directory: Path) -> Any:
    """The per-rank table of the dumps in ``directory`` (``soak.flightrec.dumps``), as JSON."""
    return summarize_dumps(directory).to_json()


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, utime+stime in ticks) from /proc/<pid>/stat, None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read(4096).decode("ascii", "replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # the command may hold spaces and parentheses
    try:
        return fields[0], int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None


def _title_now(pid: int) -> str | None:
    """The process's title now: the tree's record keeps the command line it had when
    first seen, and vLLM titles its workers (setproctitle) after they start."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read(4096)
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip() or None


def process_states(pids: Sequence[int], *, interval_s: float = 0.25) -> dict[str, Any]:
    """Each PID's state letter and cores busy over ``interval_s``, read before py-spy
    pauses the processes: a stopped worker (T) and a spinning one (R, ~1 core) look
    alike in a stack, and py-spy cannot tell a stop."""
    first = {pid: _proc_stat(pid) for pid in pids}
    started = time.monotonic()
    time.sleep(interval_s)
    elapsed = max(time.monotonic() - started, 1e-3)
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[str, Any] = {}
    for pid in pids:
        a, b = first.get(pid), _proc_stat(pid)
        if b is None:
            continue
        cpu = round((b[1] - a[1]) / ticks / elapsed, 2) if a is not None else None
        # The state at the first read: py-spy has not attached yet.
        out[str(pid)] = {"state": (a or b)[0], "cpu": cpu, "title": _title_now(pid)}
    return {"interval_s": interval_s, "pids": out}
