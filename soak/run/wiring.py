"""From a validated config to a ready-to-run ``SoakRun``: the only place that
knows which concrete part each stage gets (target, workload, probes, detector,
responder, exporter, live view)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, Mapping, TextIO

from soak.clock import Clock, SystemClock
from soak.config import RunConfig, redacted_config
from soak.errors import ArgumentError, PortInUse
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
    """``--out DIR`` is the run directory itself (new or empty); default ``runs/<run id>``."""
    run_dir = Path(out) if out is not None else Path("runs") / run_id
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise ArgumentError(f"--out {run_dir}: exists and is not an empty directory")
    run_dir.mkdir(parents=True, exist_ok=True)
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
) -> SoakRun:
    environ = dict(os.environ if environ is None else environ)
    clock = clock or SystemClock()
    layout = server_layout(config.target)
    make_workload = workload_factory(config, config_path=config_path, block_size=layout["block_size"])
    make_workload(None)  # a bad workload or trace file fails here, before anything starts
    api_key = api_key_from_env(config.target.api_key_env, environ)

    run_id = new_run_id(config.name, clock.now())
    run_dir = prepare_run_dir(out, run_id)
    store = RunStore(run_dir, clock=clock)

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
        pipe_stem = config.response.evidence.flight_recorder_pipe_stem
    target = build_target(
        config.target,
        run_dir=run_dir,
        environ=environ,
        extra_env=extra_env,
        flight_recorder_pipe_stem=pipe_stem,
        clock=clock,
    )

    sinks: list[Any] = []
    view = config.view
    sinks.append(
        LiveView(clock=clock, mode=view_mode or view.mode, refresh_s=view.refresh,
                 plain_interval_s=view.plain_interval, stream=stream)
    )
    if config.exporter.enabled:
        sinks.append(_start_exporter(config, clock))

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
        )

    def counter(run: SoakRun) -> Any:
        from soak.workload import make_counter

        tokenizer = getattr(config.workload, "tokenizer", None)
        return make_counter(tokenizer, target_is_simulator=is_sim, base_url=run.target.base_url,
                            model=run.model or "", config_path=config_path)

    return SoakRun(
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
    )


class _Unclosed:
    """The GPU source as the GPU probe sees it: the responder still needs the
    source after the probes are closed (and rebuilt on a restart)."""

    def __init__(self, source: Any) -> None:
        self._source = source

    async def read(self) -> Any:
        return await self._source.read()

    async def aclose(self) -> None:
        pass


def _start_exporter(config: RunConfig, clock: Clock) -> Any:
    from prometheus_client import CollectorRegistry

    from soak.export.exporter import Exporter

    exporter = Exporter(config.exporter, registry=CollectorRegistry(), clock=clock)
    try:
        exporter.start()
    except OSError as exc:
        raise PortInUse(
            f"exporter: cannot listen on {config.exporter.host}:{config.exporter.port}: {exc.strerror or exc}"
        ) from exc
    return exporter
