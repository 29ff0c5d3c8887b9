"""The evidence of one incident, collected into its bundle (``soak.respond.evidence``):
the samples of the last window, the GPU reading, the processes, /metrics, the log
tail, py-spy stacks, the flight recorder's dumps (asked for through the ranks'
pipes, waited for within bounds) and the watchdog lines. Every step has its own
deadline inside the evidence budget; a failing step is noted in the bundle and
never blocks the others.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

from soak.flightrec.stackfiles import DIAGNOSIS_FILE, STATES_FILE, diagnosis_record, read_diagnosis, stack_diagnosis
from soak.jsonl import read_json
from soak.printable import printable
from soak.proc.facts import Member
from soak.proc.read import running
from soak.redact import Redactor
from soak.respond import evidence as ev
from soak.respond.config import EvidenceConfig
from soak.respond.flight import FlightRecorderPaths, collect_dumps, dump_files, request_dumps
from soak.respond.target_tree import TargetLike
from soak.samples import GpuSample, Sample


class EvidenceCollector:
    """Fills the bundles of one run's incidents. It remembers the flight-recorder
    dumps already collected, so an incident takes only the dumps that are new."""

    def __init__(self, config: EvidenceConfig, *, target: TargetLike, has_gpu_source: bool,
                 recent_samples: Callable[[], Sequence[Sample]], flight_recorder_paths: FlightRecorderPaths,
                 redactor: Redactor | None) -> None:
        self._config = config
        self._target = target
        # py-spy's output passes the run's redactor like every file of the bundle
        self._redact = redactor.bytes if redactor is not None else None
        self._has_gpu_source = has_gpu_source
        self._recent_samples = recent_samples
        self._fr_paths = flight_recorder_paths
        self._collected_dumps: dict[str, float] = {}

    async def collect(
        self,
        bundle: ev.Bundle,
        *,
        detected_at: float,
        members: Sequence[Member],
        root: Member | None,
        gpu_sample: GpuSample | None,
        gpu_error: str | None,
    ) -> None:
        """Every step at once, each within its own bound and the budget; the
        watchdog lines after them (they need the log tail)."""
        cfg = self._config
        started = time.monotonic()
        budget = cfg.budget

        def left(limit: float) -> float:
            return max(0.01, min(limit, budget - (time.monotonic() - started)))

        samples = list(self._recent_samples() or ())

        async def samples_step() -> None:
            n = await asyncio.to_thread(ev.write_samples, bundle, samples, since=detected_at - cfg.samples_window)
            bundle.record("samples", ok=True, elapsed_s=0.0, count=n)

        async def gpus_step() -> None:
            if not self._has_gpu_source:
                bundle.record("gpus", ok=True, elapsed_s=0.0, note="no GPU source")
                return
            if gpu_sample is None:
                bundle.write_json(bundle.dir / "gpus.json", {"error": gpu_error})
                raise RuntimeError(gpu_error or "no GPU reading")
            bundle.write_json(bundle.dir / "gpus.json", gpu_sample)
            if gpu_error:
                raise RuntimeError(gpu_error)

        async def processes_step() -> None:
            bundle.write_json(
                bundle.dir / "processes.json",
                {"root": root.to_json() if root else None, "processes": [m.to_json() for m in members]},
            )

        async def metrics_step() -> None:
            text = await ev.fetch_metrics(self._target.base_url, cfg.metrics_timeout)
            bundle.write_bytes(bundle.dir / "metrics.txt", text.encode())

        log_tail: dict[str, str] = {}

        async def log_step() -> None:
            path = self._target.log_path
            if path is None:
                bundle.record("log_tail", ok=True, elapsed_s=0.0, note="the target has no log file")
                return
            text = await asyncio.to_thread(ev.read_tail, Path(path), cfg.log_tail_bytes)
            log_tail["text"] = text
            bundle.write_bytes(bundle.dir / "log_tail.txt", text.encode())

        async def py_spy_step() -> None:
            if not cfg.py_spy:
                bundle.record("py_spy", ok=True, elapsed_s=0.0, note="disabled by config")
                return
            exe = ev.find_py_spy(cfg.py_spy_command)
            if exe is None:
                bundle.record("py_spy", ok=True, elapsed_s=0.0, note=f"{cfg.py_spy_command} not installed; skipped")
                return
            limit = asyncio.Semaphore(4)
            results: dict[int, str | None] = {}
            pids = [m.pid for m in members if running(m.pin)]
            states = await asyncio.to_thread(ev.process_states, pids)
            bundle.write_json(bundle.dir / STATES_FILE, states)

            async def one(pid: int) -> None:
                async with limit:
                    try:
                        ok, note = await ev.py_spy_dump(
                            exe, pid, native=cfg.py_spy_native, timeout_s=left(cfg.py_spy_timeout),
                            dest=bundle.dir / f"py-spy-{pid}.txt",
                            redact=self._redact,
                        )
                    except asyncio.TimeoutError:
                        ok, note = False, "timed out"
                    except OSError as exc:
                        ok, note = False, str(exc)
                    results[pid] = None if ok else note

            await asyncio.gather(*(one(pid) for pid in pids))
            failed = {pid: note for pid, note in results.items() if note}
            bundle.record(
                "py_spy",
                ok=not failed,
                elapsed_s=0.0,
                dumped=sorted(pid for pid, note in results.items() if not note),
                note=("; ".join(f"{pid}: {note}" for pid, note in sorted(failed.items()))[:1000] if failed else None),
            )

        fr_said: dict[str, str] = {"line": "not collected"}

        async def flight_step() -> None:
            if not cfg.flight_recorder:
                fr_said["line"] = "disabled by config"
                bundle.record("flight_recorder", ok=True, elapsed_s=0.0, note="disabled by config")
                return
            stem = self._target.flight_recorder_pipe_stem or cfg.flight_recorder_pipe_stem or self._fr_paths.pipe_stem
            prefix = cfg.flight_recorder_dump_prefix or self._fr_paths.dump_prefix
            before = dict(self._collected_dumps)
            written, pipe_notes = request_dumps(stem)
            dumps = await collect_dumps(
                prefix, expected=len(written), before=before, wait_s=left(cfg.flight_recorder_wait),
                dest=bundle.dir / "flight_recorder",
            )
            self._collected_dumps.update(dump_files(prefix))
            summary_note = None
            if dumps:
                try:
                    summary = await asyncio.to_thread(ev.flight_recorder_summary, bundle.dir / "flight_recorder")
                except Exception as exc:
                    summary_note = f"summary failed: {type(exc).__name__}: {exc}"
                else:
                    bundle.write_json(bundle.dir / "flight_recorder_summary.json", summary)
            missing = len(written) - len(dumps) if len(dumps) < len(written) else 0
            note_parts = []
            fr_said["line"] = f"{len(dumps)} dump{'s' if len(dumps) != 1 else ''}" if dumps else NO_DUMP
            if not written:
                note_parts.append("no rank pipe open" + (f" ({'; '.join(pipe_notes)})" if pipe_notes else f" under {stem}")
                                  + ("" if dumps else f": {NO_PIPE_WHY}"))
            if missing:
                note_parts.append(f"{missing} of {len(written)} asked ranks did not dump in time")
            if summary_note:
                note_parts.append(summary_note)
            bundle.record(
                "flight_recorder",
                ok=not missing,
                elapsed_s=0.0,
                pipes_written=len(written),
                dumps=[p.name for p in dumps],
                note="; ".join(note_parts) or None,
            )

        steps: list[tuple[str, Callable[[], Awaitable[Any]], float]] = [
            ("samples", samples_step, budget),
            ("gpus", gpus_step, budget),
            ("processes", processes_step, budget),
            ("metrics", metrics_step, cfg.metrics_timeout),
            ("log_tail", log_step, budget),
            ("py_spy", py_spy_step, cfg.py_spy_timeout + 1.0),
            ("flight_recorder", flight_step, cfg.flight_recorder_wait + 1.0),
        ]
        await asyncio.gather(*(bundle.step(name, make, left(limit)) for name, make, limit in steps))
        # The watchdog lines need the log tail; the diagnosis needs the stacks and the dumps.
        await bundle.step(
            "watchdog",
            lambda: asyncio.to_thread(_write_watchdog, bundle, samples, log_tail.get("text")),
            left(budget),
        )
        await bundle.step("diagnosis", lambda: asyncio.to_thread(write_diagnosis, bundle, fr_said["line"]),
                          left(budget))


# torch opens the dump pipe in ProcessGroupNCCL only (the CPU build's libtorch has no
# TORCH_NCCL_DEBUG_INFO_PIPE_FILE at all); gloo records collectives, never send/recv,
# and hands its buffer only to _dump_fr_trace() called inside the process (FACTS.md).
NO_PIPE_WHY = ("torch serves the dump pipe for NCCL groups only; gloo groups (the CPU build) "
               "cannot be asked from outside and record no send/recv")
NO_DUMP = "no dump: no rank opened a dump pipe (gloo groups have none and record no send/recv)"


def write_diagnosis(bundle: ev.Bundle, flight_recorder: str) -> None:
    """``diagnosis.json``: the flight recorder's divergence, else the stacks' faulty rank."""
    fr = read_json(bundle.dir / "flight_recorder_summary.json")
    fr = fr if isinstance(fr, dict) else {}
    detail = fr.get("diagnosis_detail") if isinstance(fr.get("diagnosis_detail"), dict) else None
    fr_line = str(fr["diagnosis"])[:500] if fr.get("diagnosis") else None
    if fr_line:
        flight_recorder = f"{flight_recorder}: {fr_line}"
    stacks = stack_diagnosis(bundle.dir)
    places = {w.rank: {"stage": w.stage, "pid": w.pid} for w in (stacks.places if stacks else ()) if w.rank is not None}
    bundle.write_json(bundle.dir / DIAGNOSIS_FILE, diagnosis_record(
        flight_recorder=flight_recorder, fr_line=fr_line, fr_detail=detail, places=places, stacks=stacks))


def _write_watchdog(bundle: ev.Bundle, samples: Sequence[Sample], tail: str | None) -> None:
    bundle.write_json(bundle.dir / "watchdog.json", ev.watchdog_entries(samples, tail))


def diagnosis_line(path: Path) -> str | None:
    """The diagnosis the flight-recorder step wrote beside the dumps, if any."""
    data = read_json(path)  # bounded in size and nesting; None where it cannot be read
    line = data.get("diagnosis") if isinstance(data, dict) else None
    # The file sits in a run directory anyone may have edited: printable, bounded.
    return printable(str(line), limit=500) if line else None


def incident_diagnosis(incident: Path) -> tuple[str | None, str | None]:
    """(the record's diagnosis line, the clause for the incident's summary) from
    ``diagnosis.json``; the flight recorder's own line where that file is absent."""
    found = read_diagnosis(incident)
    if found is None:
        line = diagnosis_line(incident / "flight_recorder_summary.json")
        return line, (f"flight recorder: {line}" if line else None)
    line = str(found["line"])[:800] if found.get("line") else None
    fr = str(found.get("flight_recorder") or "")[:300]
    if found.get("source") == "flight_recorder":
        return line, f"flight recorder: {line}"
    if found.get("source") == "py-spy":
        return line, f"py-spy: {line} (flight recorder: {fr})" if fr else f"py-spy: {line}"
    # Neither named a rank: the flight recorder's own line (dumps in step), as before;
    # what the stacks show stays in diagnosis.json and `soak diagnose`.
    fr_line = diagnosis_line(incident / "flight_recorder_summary.json")
    return fr_line, (f"flight recorder: {fr_line}" if fr_line else None)
