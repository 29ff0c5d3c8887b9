"""The response to an incident: evidence, SIGKILL of the target's tree, GPUs free.

Order (each step bounded, a failing step noted and never blocking the next):
1. the evidence bundle in ``incidents/N/`` (``soak.respond.collect``);
2. SIGKILL to every process that belongs to the target: the tree as recorded
   over the run and freshly walked, plus the GPU source's compute processes that
   provably belong to it (``soak.respond.takedown``, ``soak.respond.target_tree``);
3. a bounded wait until the GPUs list no target process and their memory is
   back within tolerance (``soak.respond.gpu``).

The responder does not restart: the run loop asks ``next_action()`` and calls
``target.restart()``.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any, Callable, Sequence

from soak.clock import Clock
from soak.records import GpuSourceLike
from soak.records import Decision, IncidentKind, IncidentRecord, IncidentStatus, detection_latency
from soak.onset import latency_words
from soak.redact import Redactor
from soak.respond import evidence as ev
from soak.respond.collect import EvidenceCollector, incident_diagnosis
from soak.respond.config import ResponseConfig
from soak.respond.corruption import NO_KILL_NOTE, corruption_file, corruption_summary
from soak.respond.flight import FlightRecorderPaths, default_flight_recorder_paths, ownership_variable
from soak.respond.gpu import GpuRelease
from soak.proc.facts import Member
from soak.proc.kill import KillResult
from soak.proc.snapshots import ProcSnapshots
from soak.respond.takedown import Kill, Takedown
from soak.respond.target_tree import TargetLike, TargetTree
from soak.samples import Sample


class Responder:
    """Handles the incidents of one run. ``start()`` begins the periodic tree
    snapshots (optional but recommended: they catch workers that reparent
    before the kill); ``aclose()`` is idempotent."""

    def __init__(
        self,
        config: ResponseConfig,
        *,
        run_dir: Path,
        target: TargetLike,
        gpu_source: GpuSourceLike | None,
        clock: Clock,
        recent_samples: Callable[[], Sequence[Sample]],
        ownership_token: str | None = None,
        flight_recorder_paths: FlightRecorderPaths | None = None,
        redactor: Redactor | None = None,
        on_write_error: Callable[[BaseException], None] | None = None,
        proc: ProcSnapshots | None = None,
    ) -> None:
        self._redactor = redactor
        self._on_write_error = on_write_error
        self._config = config
        self._run_dir = Path(run_dir)
        self._target = target
        self.targets = TargetTree(
            target, marker=(ownership_variable, ownership_token) if ownership_token else None,
            find_root_by_port=config.find_root_by_port, proc=proc if proc is not None else ProcSnapshots(),
        )
        self._recent_samples = recent_samples
        self._takedown = Takedown(config, targets=self.targets, gpu_source=gpu_source, clock=clock,
                                  recent_samples=recent_samples)
        self._evidence = EvidenceCollector(
            config.evidence, target=target, has_gpu_source=gpu_source is not None, recent_samples=recent_samples,
            flight_recorder_paths=flight_recorder_paths or default_flight_recorder_paths(self._run_dir),
            redactor=redactor,
        )
        self._task: asyncio.Task | None = None
        self._inflight: set[asyncio.Future] = set()
        self._closed = False
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        if self._task is None and not self._closed:
            await asyncio.to_thread(self.targets.check_kill_target)
            await asyncio.to_thread(self.targets.track)
            await self._takedown.learn_gpu_baselines()
            self._task = asyncio.create_task(self._track_forever(), name="soak-respond-tree")

    async def _track_forever(self) -> None:
        interval = max(self._config.tree_snapshot_interval, 0.05)
        while True:
            await asyncio.sleep(interval)
            if self._lock.locked():
                continue  # a kill is in progress; it snapshots itself
            try:
                await asyncio.to_thread(self.targets.track)
            except Exception:
                # /proc races (a process vanishing mid-walk) must not end tracking.
                continue

    async def aclose(self) -> None:
        """Stop tracking; first let a response in flight finish its kill (bounded)."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        inflight = [t for t in self._inflight if not t.done()]
        if inflight:
            cfg = self._config
            bound = cfg.evidence.budget + cfg.kill_timeout + cfg.gpu_release_timeout + 5.0
            await asyncio.wait(inflight, timeout=bound)

    async def release_shm(self) -> dict | None:
        """After the target stopped (end of run): remove the /dev/shm segments its
        tree held. vLLM 0.32's own SIGTERM shutdown leaves its broadcast rings
        behind (hundreds of MB). Nothing happens while any process of the tree
        still runs (an attached server the run does not stop, a survivor)."""
        pids = self.targets.shm_releasable()
        if pids is None:
            return None
        result = await asyncio.to_thread(self.targets.shm.cleanup, pids)
        return result.to_json() if (result.removed or result.kept) else None

    # --- the response --------------------------------------------------------------

    async def handle(self, decision: Decision, number: int) -> IncidentRecord:
        """Evidence, kill, GPUs free. Once begun, the response runs to its end even
        when the caller is cancelled (a run ending mid-incident): a hung tree must
        not be left half-killed. ``aclose()`` waits for it."""
        task = asyncio.ensure_future(self._handle_locked(decision, number))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        return await asyncio.shield(task)

    async def _handle_locked(self, decision: Decision, number: int) -> IncidentRecord:
        async with self._lock:
            return await self._handle(decision, number)

    async def _handle(self, decision: Decision, number: int) -> IncidentRecord:
        rel = f"incidents/{number}"
        bundle = self._open_bundle(self._run_dir / rel)
        header: dict[str, Any] = {
            "number": number,
            "status": IncidentStatus.COLLECTING.value,
            "decision": {
                "kind": decision.kind.value,
                "rule": decision.rule,
                "onset_at": decision.onset_at,
                "decided_at": decision.decided_at,
                "reasons": list(decision.reasons),
                "evidence": ev.plain(decision.evidence),
            },
            "target": {
                "base_url": self._target.base_url,
                "root_pid": self._target.root_pid,
                "log_path": str(self._target.log_path) if self._target.log_path else None,
            },
        }
        self._save(bundle, header)
        survey = await self._takedown.survey()
        if decision.kind is IncidentKind.CORRUPTION:
            return await self._corruption(decision, number, rel, bundle, header, survey)

        # 1. Evidence.
        if self._config.evidence.enabled:
            header["status"] = IncidentStatus.EVIDENCE.value
            await self._evidence.collect(bundle, detected_at=decision.decided_at, members=survey.members,
                                         root=self.targets.tree.root, gpu_sample=survey.gpu_sample,
                                         gpu_error=survey.gpu_error)
        else:
            bundle.record("evidence", ok=True, elapsed_s=0.0, note="disabled by config")
        header["steps"] = bundle.steps
        header["status"] = IncidentStatus.KILLING.value
        self._save(bundle, header)

        # 2. SIGKILL.
        kill = await self._takedown.kill()
        if kill.shm is not None:
            ev.write_json(bundle.dir / "shm_cleanup.json", kill.shm.to_json())

        # 3. GPUs free.
        release = await self._takedown.wait_gpus_free(kill, survey)
        if release.last is not None:
            try:
                bundle.write_json(bundle.dir / "gpus_after.json", release.last)
            except OSError as exc:
                self._write_failed(exc)

        record = self._record(decision, number, rel, bundle, kill, release,
                              notes=[*survey.notes, *kill.notes, *release.notes])
        header["status"] = IncidentStatus.DONE.value
        header["steps"] = bundle.steps
        header["record"] = record.to_json()
        self._save(bundle, header)
        return record

    async def _corruption(self, decision: Decision, number: int, rel: str, bundle: ev.Bundle, header: dict,
                          survey: Any) -> IncidentRecord:
        """The usual bundle plus corruption.json; no SIGKILL (soak.respond.corruption)."""
        if self._config.evidence.enabled:
            header["status"] = IncidentStatus.EVIDENCE.value
            await self._evidence.collect(bundle, detected_at=decision.decided_at, members=survey.members,
                                         root=self.targets.tree.root, gpu_sample=survey.gpu_sample,
                                         gpu_error=survey.gpu_error)
        try:
            bundle.write_json(bundle.dir / "corruption.json", ev.plain(corruption_file(decision)))
        except OSError as exc:
            self._write_failed(exc)
        interval = decision.evidence.get("onset_interval") or {}
        latency = detection_latency(detected_at=decision.decided_at, onset_at=decision.onset_at,
                                    onset_earliest_at=interval.get("earliest"), onset_latest_at=interval.get("latest"))
        record = IncidentRecord(
            number=number, kind=decision.kind, rule=decision.rule, onset_at=decision.onset_at,
            detected_at=decision.decided_at, killed_pids=(), gpus_released=None, gpu_free_s=None, evidence=rel,
            summary=corruption_summary(decision, latency_words(latency)), reasons=decision.reasons,
            notes=tuple(bundle.notes() + [*survey.notes, NO_KILL_NOTE]),
            onset_earliest_at=interval.get("earliest"), onset_latest_at=interval.get("latest"),
            extra={"corruption": "corruption.json"},
        )
        header["status"] = IncidentStatus.DONE.value
        header["steps"] = bundle.steps
        header["record"] = record.to_json()
        self._save(bundle, header)
        return record

    def _record(self, decision: Decision, number: int, rel: str, bundle: ev.Bundle, kill: Kill,
                release: GpuRelease, *, notes: list[str]) -> IncidentRecord:
        kind, rule = decision.kind, decision.rule
        onset_at, detected_at = decision.onset_at, decision.decided_at
        killed, result, shm = kill.killed, kill.result, kill.shm
        gpu_free_s = release.free_at - kill.killed_at if release.free_at is not None else None
        if gpu_free_s is not None and gpu_free_s < 0:
            gpu_free_s = 0.0
        diagnosis, clause = incident_diagnosis(bundle.dir)
        interval = decision.evidence.get("onset_interval") or {}
        latency = detection_latency(detected_at=detected_at, onset_at=onset_at,
                                    onset_earliest_at=interval.get("earliest"), onset_latest_at=interval.get("latest"))
        summary = _summary(kind, rule, latency_words(latency), killed, release, gpu_free_s, result)
        if clause:
            summary += f"; {clause}"
        jit = ev.jit_precursor_note(ev.jit_precursors(
            self._recent_samples() or (), since=detected_at - self._config.evidence.samples_window, until=detected_at),
            onset_at)
        if jit:
            summary += f"; {jit}"
        return IncidentRecord(
            number=number,
            kind=kind,
            rule=rule,
            onset_at=onset_at,
            detected_at=detected_at,
            killed_pids=tuple(sorted(info.pid for info in killed)),
            gpus_released=release.released,
            gpu_free_s=None if gpu_free_s is None else round(gpu_free_s, 3),
            evidence=rel,
            summary=summary,
            reasons=decision.reasons,
            killed_at=kill.killed_at if killed else None,
            gpus_free_at=release.free_at,
            survivors=tuple(result.survivors) if result is not None else (),
            notes=tuple(bundle.notes() + notes),
            diagnosis=diagnosis,
            onset_earliest_at=(decision.evidence.get("onset_interval") or {}).get("earliest"),
            onset_latest_at=(decision.evidence.get("onset_interval") or {}).get("latest"),
            extra={
                "killed": [i.to_json() for i in killed],
                **({"shm_removed": [seg.path for seg in shm.removed]} if shm is not None else {}),
            },
        )

    def _open_bundle(self, directory: Path) -> ev.Bundle:
        try:
            return ev.Bundle(directory, redactor=self._redactor)
        except OSError as exc:  # no room for the bundle: the kill still happens
            self._write_failed(exc)
            bundle = ev.Bundle.__new__(ev.Bundle)
            bundle.dir, bundle.redactor, bundle.steps = directory, self._redactor, {}
            return bundle

    def _save(self, bundle: ev.Bundle, header: dict) -> None:
        """incident.json, rewritten whole; a failed write (disk full) never stops the kill."""
        try:
            bundle.write_json(bundle.dir / "incident.json", header)
        except OSError as exc:
            self._write_failed(exc)

    def _write_failed(self, exc: BaseException) -> None:
        if self._on_write_error is not None:
            self._on_write_error(exc)


def _summary(kind: IncidentKind, rule: str, latency: str, killed: Sequence[Member],
             release: GpuRelease, gpu_free_s: float | None, result: KillResult | None) -> str:
    text = f"{kind.value} ({rule}): {latency}; SIGKILL to {len(killed)} processes"
    if result is not None and result.survivors:
        text += f", {len(result.survivors)} survived"
    if release.released:
        text += f"; GPUs free {gpu_free_s:.2f}s after the kill" if gpu_free_s is not None else "; GPUs free"
    elif release.no_gpus:
        text += "; no GPUs (stage CPU), every process gone"
    elif release.released is None:
        text += "; GPU release not confirmed by the GPU source"
    else:
        text += "; GPUs still held"
    return text
