"""From a validated config to a ready-to-run ``SoakRun``: the only place that
knows which concrete part each stage gets (target, workload, probes, detector,
responder, exporter, live view)."""

from __future__ import annotations

import os
import re
import secrets
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence, TextIO


from soak.clock import Clock, run_clock
from soak.config import RunConfig, redacted_config
from soak.errors import ArgumentError, HarnessFault, PortInUse
from soak.events import EventType
from soak.export.live import LiveView
from soak.load.progress import ProgressTracker
from soak.net import OutboundSession
from soak.records import GpuSourceLike
from soak.probes.scheduler import Probe
from soak.records import RunSink, TargetFacts, TargetKind
from soak.redact import Redactor
from soak.respond.responder import Responder
from soak.run.heap import HeapTuning
from soak.run.loop import ReportOptions, RunOptions, SoakRun
from soak.run.parts import RunIdentity, RunParts
from soak.run.target import api_key_from_env, build_target
from soak.samples import GpuSample, Sample
from soak.store.store import RunStore
from soak.target.config import AttachedTarget, LaunchedTarget, SimulatorTarget, target_layout
from soak.workload import Workload

if TYPE_CHECKING:
    from soak.export.exporter import Exporter


def new_run_id(name: str, now: float) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "soak"
    return f"{safe}-{stamp}"


def new_ownership_token(run_id: str) -> str:
    """The run id plus 64 random bits: unique to this harness process on this box."""
    return f"{run_id}-{secrets.token_hex(8)}"


def prepare_run_dir(out: Path | None, run_id: str) -> Path:
    """``--out DIR`` is the run directory itself (new or empty); default ``runs/<run id>``.
    A directory that cannot be made or written (read-only, full) is the harness's
    own I/O failure: ``HarnessFault``, exit 4, before anything starts."""
    run_dir = Path(out) if out is not None else Path("runs") / run_id
    try:
        if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
            raise ArgumentError(f"--out {run_dir}: exists and is not an empty directory")
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".soak-write-test"
        with open(probe, "wb") as fh:
            fh.write(b"x")
        probe.unlink()
    except OSError as exc:
        raise HarnessFault(f"run directory {run_dir}: cannot write it: {exc.strerror or exc}") from exc
    return run_dir


def workload_factory(config: RunConfig, *, config_path: Path, block_size: int):
    """``model -> Workload``; called once before anything starts (to fail early on
    a bad workload) and again with the model the target serves."""
    from soak.workload import build_workload

    base_dir = config_path.resolve().parent
    corpora: dict = {}

    def make(model: str | None) -> Workload:
        return build_workload(
            config.workload,
            base_dir=base_dir,
            seed=config.seed,
            model=model or provisional_model(config),
            block_size=block_size,
            config_path=config_path,
            corpora=corpora,
        )

    return make


def provisional_model(config: RunConfig) -> str:
    target = config.target
    if target.model:
        return target.model
    if isinstance(target, SimulatorTarget):
        return target.sim.model
    return "model"


def build_soak_run(
    config: RunConfig,
    *,
    config_path: Path,
    out: Path | None,
    view_mode: str | None = None,
    environ: Mapping[str, str] | None = None,
    clock: Clock | None = None,
    stream: TextIO | None = None,
    exporter_port: int | None = None,
    guard: bool | None = None,
    report_html: bool = True,
    report_command: Sequence[str] | None = None,
    report_timeout_s: float | None = None,
    heap: HeapTuning | None = None,
) -> SoakRun:
    environ = dict(os.environ if environ is None else environ)
    # The run's labels stay on the monotonic time line through wall-clock steps (soak.clock).
    clock = run_clock(clock)
    layout = target_layout(config.target)
    make_workload = workload_factory(config, config_path=config_path, block_size=layout.block_size)
    make_workload(None)  # a bad workload or trace file fails here, before anything starts
    from soak.run.proving import resolve_plan

    proof_plan = resolve_plan(config.prove, config_path=config_path)  # history read once, before the target
    api_key = api_key_from_env(config.target.api_key_env, environ)
    target_config = config.target
    redactor = Redactor.for_run(
        environ=environ,
        api_key_env=target_config.api_key_env,
        command=target_config.command if isinstance(target_config, LaunchedTarget) else (),
        env=target_config.env if isinstance(target_config, LaunchedTarget) else None,
    )

    # stderr and stdout (soak.cli's redacting streams) hide what this run's redactor knows.
    from soak.redact import follow_in_streams

    follow_in_streams(redactor, sys.stdout, sys.stderr)

    # What can fail for want of the environment fails before the run directory exists.
    exporter = _start_exporter(config, clock, exporter_port) if config.exporter.enabled else None
    run_id = new_run_id(config.name, clock.now())
    try:
        run_dir = prepare_run_dir(out, run_id)
        store = RunStore(run_dir, clock=clock, redactor=redactor)
    except OSError as exc:
        if exporter is not None:
            exporter.close()
        raise HarnessFault(f"run directory: cannot write it: {exc.strerror or exc}") from exc
    except BaseException:
        if exporter is not None:
            exporter.close()
        raise

    from soak.respond.flight import (
        attached_flight_recorder_paths,
        default_flight_recorder_paths,
        flight_recorder_env,
        ownership_env,
        ownership_variable,
    )

    # The marker every process of our target inherits, and the responder and the
    # guardian kill by. The run id alone is not unique: two soaks of one config
    # started in the same second (cron, a CI matrix) would each take the other's
    # server for their own.
    ownership_token = new_ownership_token(run_id)
    extra_env: dict[str, str] = {}
    pipe_stem = None
    if isinstance(target_config, AttachedTarget):
        fr_paths = attached_flight_recorder_paths(target_config.pid, run_dir=run_dir)
        pipe_stem = config.response.evidence.flight_recorder_pipe_stem or fr_paths.pipe_stem
    else:
        fr_paths = None
        extra_env.update(ownership_env(ownership_token))
        wants_fr = config.response.evidence.flight_recorder and (
            not isinstance(target_config, LaunchedTarget) or target_config.flight_recorder)
        if wants_fr:
            fr_paths = default_flight_recorder_paths(run_dir)
            dump_dir = Path(fr_paths.dump_prefix).parent
            dump_dir.mkdir(parents=True, exist_ok=True)
            extra_env.update(flight_recorder_env(dump_dir, fr_paths.pipe_stem))
            pipe_stem = fr_paths.pipe_stem
    ours = layout.kind is not TargetKind.ATTACHED
    guardian = None
    if ours and (guard if guard is not None else True):
        from soak.run.guardian import Guardian

        guardian = Guardian(marker=(ownership_variable, ownership_token))
    late: dict[str, SoakRun] = {}

    def log_failed(exc: BaseException) -> None:
        if "run" in late:
            late["run"].fault(exc, where="writing server.log")

    def target_waiting(reason: str) -> None:
        if "run" in late:  # the one line a never-ready target gives, at its first failed poll
            late["run"].event(EventType.TARGET_WAITING, message=reason)

    target = build_target(
        target_config,
        run_dir=run_dir,
        environ=environ,
        extra_env=extra_env,
        flight_recorder_pipe_stem=pipe_stem,
        clock=clock,
        redactor=redactor,
        guardian=guardian,
        on_log_error=log_failed,
        on_waiting=target_waiting,
    )

    sinks: list[RunSink] = []
    view = config.view
    sinks.append(
        LiveView(clock=clock, mode=view_mode or view.mode, refresh_s=view.refresh,
                 plain_interval_s=view.plain_interval, stream=stream,
                 exporter_url=exporter.url if exporter is not None and exporter.port else None)
    )
    if exporter is not None:
        sinks.append(exporter)

    from soak.detect.detector import Detector
    from soak.probes.build import build_gpu_source, build_probes, open_gpu_source
    from soak.proc.snapshots import ProcSnapshots

    is_sim = layout.kind is TargetKind.SIMULATOR
    # One /proc reader for the harness: the process probe and the responder's tree
    # walk share its passes (each walked /proc on its own schedule before).
    proc = ProcSnapshots()

    async def gpu_source(base_url: str, *, session: OutboundSession) -> GpuSourceLike | None:
        source = build_gpu_source(config.probes, base_url=base_url, session=session, clock=clock,
                                  is_simulator=is_sim, root_pid=lambda: target.root_pid, proc=proc,
                                  topology=layout.topology)
        # NVML missing: GpuUnavailable, exit 3 (``auto`` on vLLM's CPU build: stage CPU)
        return await open_gpu_source(source, config.probes, is_simulator=is_sim, clock=clock,
                                     root_pid=lambda: target.root_pid, proc=proc, topology=layout.topology)

    # The target's root PID has one path to the parts that act on its processes:
    # the target itself, read by the probes (rebuilt for each life) and the responder.
    def probes(facts: TargetFacts, *, session: OutboundSession, gpu_source: GpuSourceLike | None,
               progress: ProgressTracker, log_from_start: bool) -> list[Probe]:
        return build_probes(
            config.probes,
            base_url=facts.base_url,
            session=session,
            clock=clock,
            gpu_source=_Unclosed(gpu_source) if gpu_source is not None else None,
            root_pid=target.root_pid,
            returncode=target.returncode,
            log_path=target.log_path,
            log_from_start=log_from_start,
            progress=progress,
            version_profile=facts.version_profile,
            proc=proc,
        )

    def responder(facts: TargetFacts, *, gpu_source: GpuSourceLike | None,
                  recent_samples: Callable[[], Sequence[Sample]],
                  on_write_error: Callable[[BaseException], None]) -> Responder:
        return Responder(
            config.response,
            run_dir=run_dir,
            target=target,
            gpu_source=gpu_source,
            clock=clock,
            recent_samples=recent_samples,
            ownership_token=ownership_token if ours else None,
            flight_recorder_paths=fr_paths,
            redactor=redactor,
            on_write_error=on_write_error,
            proc=proc,
        )

    async def calibrate(workload: Workload, facts: TargetFacts) -> Callable[[str], int] | None:
        """Count the workload; return the counter of answers' text when it is exact and
        in-process (the answers' token counts then come from what was streamed, never a claim)."""
        from soak.workload import TargetCounter, make_counter
        from soak.workload.counters import LocalTokenizerCounter, SimCounter

        counter = make_counter(config.workload.tokenizer, target_is_simulator=is_sim, base_url=facts.base_url,
                               model=facts.model or "", config_path=config_path)
        try:
            await workload.calibrate(counter)
        finally:
            if isinstance(counter, TargetCounter):  # the one counter with a session of its own
                await counter.aclose()
        return counter.count_text_sync if isinstance(counter, (SimCounter, LocalTokenizerCounter)) else None

    soak_run = SoakRun(
        config=config,
        redacted_config=redacted_config(config),
        identity=RunIdentity(run_id=run_id, run_dir=run_dir, config_path=config_path),
        target=target,
        layout=layout,
        parts=RunParts(
            workload=make_workload,
            calibrate=calibrate,
            detector=Detector(config.detector, topology=layout.topology),
            gpu_source=gpu_source,
            probes=probes,
            responder=responder,
            redactor=redactor,
            guardian=guardian,
        ),
        store=store,
        sinks=sinks,
        clock=clock,
        options=RunOptions(api_key=api_key, heap=heap, proof_plan=proof_plan,
                           report=ReportOptions(command=report_command, timeout_s=report_timeout_s,
                                                html=report_html)),
    )
    late["run"] = soak_run
    return soak_run


class _Unclosed:
    """The GPU source as the GPU probe sees it: the responder still needs the
    source after the probes are closed (and rebuilt on a restart)."""

    def __init__(self, source: GpuSourceLike) -> None:
        self._source = source

    async def open(self) -> None:
        pass  # opened once, by the run

    async def read(self) -> GpuSample:
        return await self._source.read()

    async def aclose(self) -> None:
        pass


def _start_exporter(config: RunConfig, clock: Clock, port: int | None = None) -> Exporter:
    """The exporter, listening. ``port`` (``--exporter-port``) overrides the config's.
    A port the operator chose (flag or config) that is taken is exit 3; the
    default 9464 taken (another soak, another exporter) falls back to a free
    port, which the start line names."""
    from prometheus_client import CollectorRegistry

    from soak.export.exporter import Exporter

    settings = config.exporter
    chosen = port is not None or "port" in settings.model_fields_set
    if port is not None:
        settings = settings.model_copy(update={"port": port})
    exporter = Exporter(settings, registry=CollectorRegistry(), clock=clock)
    try:
        exporter.start()
    except (OSError, PortInUse) as exc:
        if chosen or settings.port == 0:
            raise PortInUse(f"{exc} (--exporter-port 0 picks a free port)") from exc
        settings = settings.model_copy(update={"port": 0})
        exporter = Exporter(settings, registry=CollectorRegistry(), clock=clock)
        exporter.start()
    return exporter
