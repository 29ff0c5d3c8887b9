"""From a validated config to a ready-to-run ``SoakRun``: the only place that
knows which concrete part each stage gets (target, workload, probes, detector,
responder, exporter, live view)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO

from soak.clock import Clock, SystemClock
from soak.config import RunConfig, redacted_config
from soak.errors import ArgumentError, HarnessFault, PortInUse
from soak.redact import Redactor
from soak.run.config import server_layout
from soak.run.live import LiveView
from soak.run.loop import SoakRun
from soak.run.target import api_key_from_env, build_target
from soak.store.store import RunStore


def new_run_id(name: str, now: float) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "soak"
    return f"{safe}-{stamp}"


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

    def make(model: str | None) -> Any:
        return build_workload(
            config.workload,
            base_dir=base_dir,
            seed=config.seed,
            model=model or provisional_model(config),
            block_size=block_size,
            config_path=config_path,
        )

    return make


def provisional_model(config: RunConfig) -> str:
    target = config.target
    if target.model:
        return target.model
    if target.kind == "simulator":
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
    report_command: Sequence[str] | None = None,
    report_timeout_s: float | None = None,
) -> SoakRun:
    environ = dict(os.environ if environ is None else environ)
    clock = clock or SystemClock()
    layout = server_layout(config.target)
    make_workload = workload_factory(config, config_path=config_path, block_size=layout["block_size"])
    make_workload(None)  # a bad workload or trace file fails here, before anything starts
    api_key = api_key_from_env(config.target.api_key_env, environ)
    redactor = Redactor.for_run(
        environ=environ,
        api_key_env=config.target.api_key_env,
        command=getattr(config.target, "command", ()) or (),
        env=getattr(config.target, "env", None),
    )

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

    extra_env: dict[str, str] = {}
    pipe_stem = None
    fr_paths = None
    if config.target.kind != "attached":
        from soak.respond.flight import default_flight_recorder_paths, flight_recorder_env, ownership_env

        extra_env.update(ownership_env(run_id))
        wants_fr = config.response.evidence.flight_recorder and getattr(config.target, "flight_recorder", True)
        if wants_fr:
            fr_paths = default_flight_recorder_paths(run_dir)
            dump_dir = Path(fr_paths.dump_prefix).parent
            dump_dir.mkdir(parents=True, exist_ok=True)
            extra_env.update(flight_recorder_env(dump_dir, fr_paths.pipe_stem))
            pipe_stem = fr_paths.pipe_stem
    else:
        from soak.respond.flight import attached_flight_recorder_paths

        fr_paths = attached_flight_recorder_paths(getattr(config.target, "pid", None), run_dir=run_dir)
        pipe_stem = config.response.evidence.flight_recorder_pipe_stem or fr_paths.pipe_stem
    guardian = None
    if config.target.kind != "attached" and (guard if guard is not None else True):
        from soak.respond.flight import ownership_variable
        from soak.run.guardian import Guardian

        guardian = Guardian(marker=(ownership_variable, run_id))
    late: dict[str, SoakRun] = {}

    def log_failed(exc: BaseException) -> None:
        if "run" in late:
            late["run"].fault(exc, where="writing server.log")

    target = build_target(
        config.target,
        run_dir=run_dir,
        environ=environ,
        extra_env=extra_env,
        flight_recorder_pipe_stem=pipe_stem,
        clock=clock,
        redactor=redactor,
        guardian=guardian,
        on_log_error=log_failed,
    )

    sinks: list[Any] = []
    view = config.view
    sinks.append(
        LiveView(clock=clock, mode=view_mode or view.mode, refresh_s=view.refresh,
                 plain_interval_s=view.plain_interval, stream=stream,
                 exporter_url=exporter.url if exporter is not None and exporter.port else None)
    )
    if exporter is not None:
        sinks.append(exporter)

    from soak.detect.detector import Detector
    from soak.detect.types import Topology

    topology = Topology.pipeline(layout["pp_size"], layout["tp_size"])
    is_sim = config.target.kind == "simulator"

    def gpu_source(run: SoakRun) -> Any:
        from soak.probes.build import build_gpu_source

        return build_gpu_source(config.probes, base_url=run.target.base_url, session=run.probe_session,
                                clock=run.clock, is_simulator=is_sim)

    def probes(run: SoakRun) -> list[Any]:
        from soak.probes.build import build_probes

        return build_probes(
            config.probes,
            base_url=run.target.base_url,
            session=run.probe_session,
            clock=run.clock,
            gpu_source=_Unclosed(run.gpu_source) if run.gpu_source is not None else None,
            root_pid=run.target.root_pid,
            returncode=run.target.returncode,
            log_path=run.target.log_path,
            log_from_start=run.restarts == 0,
            progress=run.tracker,
            version_profile=run.version_profile,
        )

    def responder(run: SoakRun) -> Any:
        from soak.respond.responder import Responder

        return Responder(
            config.response,
            run_dir=run.run_dir,
            target=run.target,
            gpu_source=run.gpu_source,
            clock=run.clock,
            recent_samples=run.recent_samples,
            ownership_token=run_id if config.target.kind != "attached" else None,
            flight_recorder_paths=fr_paths,
            redactor=redactor,
            on_write_error=lambda exc: run.fault(exc, where="writing incident evidence"),
        )

    def counter(run: SoakRun) -> Any:
        from soak.workload import make_counter

        tokenizer = getattr(config.workload, "tokenizer", None)
        return make_counter(tokenizer, target_is_simulator=is_sim, base_url=run.target.base_url,
                            model=run.model or "", config_path=config_path)

    soak_run = SoakRun(
        redactor=redactor,
        guardian=guardian,
        config=config,
        run_id=run_id,
        run_dir=run_dir,
        workload_factory=make_workload,
        target=target,
        store=store,
        redacted_config=redacted_config(config),
        clock=clock,
        sinks=sinks,
        api_key=api_key,
        detector_factory=lambda run: Detector(config.detector, topology=topology),
        probes_factory=probes,
        responder_factory=responder,
        gpu_source_factory=gpu_source,
        counter_factory=counter,
        topology=topology,
        block_size=layout["block_size"],
        config_path=config_path,
        report_command=report_command,
        report_timeout_s=report_timeout_s,
    )
    late["run"] = soak_run
    return soak_run


class _Unclosed:
    """The GPU source as the GPU probe sees it: the responder still needs the
    source after the probes are closed (and rebuilt on a restart)."""

    def __init__(self, source: Any) -> None:
        self._source = source

    async def read(self) -> Any:
        return await self._source.read()

    async def aclose(self) -> None:
        pass


def _start_exporter(config: RunConfig, clock: Clock, port: int | None = None) -> Any:
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
