"""CPU time per process from /proc/PID/stat: what the stage-CPU source reads.

``/proc/PID/stat`` gives utime and stime (clock ticks), the state letter and the
start time since boot (ticks), in one read without psutil's per-process
objects: the source reads a handful of workers twice a second.
``/proc/PID/task/*/schedstat`` gives the time its threads waited on a run queue:
on a box with fewer free cores than spinners, a spinning rank gets a fraction of
a core and waits the rest (measured: 0.14 s on a CPU and 0.88 s waiting in one
second of spinning on a loaded 2-core box), so CPU time alone reads it as half
idle; CPU time plus run-queue wait is what the rank asked for. The command line
comes from ``/proc/PID/cmdline`` (a process that calls setproctitle rewrites it,
which is where vLLM's ``VLLM::Worker_PP<r>`` title is read).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ProcCpu:
    """One process's CPU time at one instant. ``started`` (ticks since boot) tells a
    reused PID apart; ``cpu_s`` is utime + stime of the process (all its threads)."""

    pid: int
    started: int
    cpu_s: float
    state: str  # R, S, D, T, Z, ...
    cmdline: tuple[str, ...] = ()
    # Seconds its threads waited for a CPU while runnable (None: no schedstat).
    wait_s: float | None = None


def parse_stat(pid: int, text: str, *, ticks: int = _TICKS) -> ProcCpu | None:
    """``/proc/PID/stat`` -> ProcCpu; None for a line that does not parse. The name
    field is in parentheses and may hold spaces or parentheses: split after the last ')'."""
    close = text.rfind(")")
    if close < 0:
        return None
    fields = text[close + 1:].split()
    # after the name: state(3) ppid pgrp session tty tpgid flags minflt cminflt majflt
    # cmajflt utime(14) stime(15) cutime cstime priority nice threads itrealvalue starttime(22)
    try:
        state, utime, stime, started = fields[0], int(fields[11]), int(fields[12]), int(fields[19])
    except (IndexError, ValueError):
        return None
    return ProcCpu(pid=pid, started=started, cpu_s=(utime + stime) / ticks, state=state)


def parse_schedstat(raw: bytes | None) -> float | None:
    """``/proc/PID/schedstat`` (ns on a CPU, ns waiting on a run queue, slices) ->
    seconds waiting; None when absent (a kernel without schedstats) or garbled."""
    fields = (raw or b"").split()
    try:
        return int(fields[1]) / 1e9 if len(fields) >= 2 else None
    except ValueError:
        return None


def _threads_wait(pid: int) -> float | None:
    """Run-queue wait summed over the process's threads: the thread that spins is
    not always the main one (a progress thread, a burner beside a blocking loop)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return parse_schedstat(_read(f"/proc/{pid}/schedstat"))
    waits = [parse_schedstat(_read(f"/proc/{pid}/task/{tid}/schedstat")) for tid in tids[:4096]]
    known = [w for w in waits if w is not None]
    return sum(known) if known else None


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(65536)
    except OSError:
        return None


def read_cpu(pids: Iterable[int]) -> dict[int, ProcCpu]:
    """The CPU time of each of ``pids`` still alive now (a vanished PID is left out)."""
    out: dict[int, ProcCpu] = {}
    for pid in pids:
        stat = _read(f"/proc/{pid}/stat")
        if stat is None:
            continue
        parsed = parse_stat(pid, stat.decode("utf-8", "replace"))
        if parsed is None:
            continue
        raw = _read(f"/proc/{pid}/cmdline") or b""
        args = tuple(a for a in raw.decode("utf-8", "replace").split("\0") if a)[:16]
        out[pid] = ProcCpu(pid=pid, started=parsed.started, cpu_s=parsed.cpu_s, state=parsed.state, cmdline=args,
                           wait_s=_threads_wait(pid))
    return out


__all__ = ["ProcCpu", "parse_schedstat", "parse_stat", "read_cpu"]
