"""The run's watch on the target's side: its one outbound session (the run's own
reads and the probes'), the GPU source (opened once, kept across restarts), and
the probes of the target's current life on one scheduler (rebuilt for each life)."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping

from soak.events import Emit, EventType
from soak.load.progress import ProgressTracker
from soak.net import OutboundSession
from soak.net import session as outbound_session
from soak.probes.scheduler import ProbeScheduler
from soak.records import GpuSourceLike, TargetFacts
from soak.run.parts import GpuSourceFactory, ProbesFactory
from soak.samples import Sample

# The /metrics read that brackets the load: a missed one only widens the server-side deltas.
BRACKET_SCRAPE_S = 10.0


class Probing:
    def __init__(self, *, gpu_source: GpuSourceFactory, probes: ProbesFactory, progress: ProgressTracker,
                 on_sample: Callable[[Sample], None], emit: Emit) -> None:
        self._gpu_factory = gpu_source
        self._probes_factory = probes
        self._progress = progress
        self._on_sample = on_sample
        self._emit = emit
        self._session: OutboundSession | None = None
        self.gpu_source: GpuSourceLike | None = None
        self.scheduler: ProbeScheduler | None = None
        self.canaries: Any = None  # soak.probes.canary.CanaryProbe, once the load runs

    @property
    def session(self) -> OutboundSession:
        """The run's session for its own reads of the server (and the probes')."""
        if self._session is None:
            self._session = outbound_session()  # a 3xx is a failed read naming its Location, never followed
        return self._session

    async def open_gpu_source(self, base_url: str) -> GpuSourceLike | None:
        session = self.session
        if self.gpu_source is None:
            self.gpu_source = await self._gpu_factory(base_url, session=session)
        return self.gpu_source

    def start(self, facts: TargetFacts, *, log_from_start: bool) -> None:
        """The probes of the target's current life, sampling."""
        probes = self._probes_factory(facts, session=self.session, gpu_source=self.gpu_source,
                                      progress=self._progress, log_from_start=log_from_start)
        self.scheduler = ProbeScheduler(list(probes), emit=self._on_sample)
        self.scheduler.start()

    def start_canaries(self, oracle: Any, *, workload: Any, facts: TargetFacts, seed: int, concurrency: int,
                       api_key: str | None, clock: Any) -> Any:
        """The correctness oracle's canaries, beside the load (None: off)."""
        from soak.probes.build import build_canary_probe

        if self.canaries is None:
            self.canaries = build_canary_probe(
                oracle, workload=workload, model=facts.model or "", base_url=facts.base_url, session=self.session,
                clock=clock, on_sample=self._on_sample, emit=self._emit, seed=seed, concurrency=concurrency,
                tracker=self._progress, api_key=api_key)
            if self.canaries is not None:
                self.canaries.start()
        return self.canaries

    async def stop_canaries(self, *, record_to: str | None = None, header: Mapping[str, Any] | None = None,
                            clean: bool = True, grace_s: float = 0.0) -> None:
        """The canaries stopped (one in flight has ``grace_s`` to be answered, as the
        load's requests have their drain); their references recorded to ``record_to``
        when this run saw nothing wrong (a wrong answer, an incident) — never a bad night's."""
        probe = self.canaries
        if probe is None:
            return
        await probe.aclose(grace_s=grace_s)
        if record_to is None:
            return
        if not clean or probe.bad:
            self._emit(EventType.WARNING, message=f"oracle.record_reference {record_to}: not recorded, "
                                                  "this run was not clean")
            return
        count = probe.write_reference(record_to, header=dict(header or {}))
        self._emit(EventType.WARNING, message=f"oracle.record_reference: {count} canary references "
                                              f"recorded to {record_to}")

    async def close_probes(self) -> None:
        if self.scheduler is not None:
            await self.scheduler.close()

    async def scrape_metrics(self) -> None:
        """One /metrics read now, fed in like any sample."""
        probes = self.scheduler.probes if self.scheduler is not None else ()
        for probe in probes:
            if probe.name == "metrics":
                try:
                    for sample in await asyncio.wait_for(probe.collect(), BRACKET_SCRAPE_S):
                        self._on_sample(sample)
                except Exception as exc:
                    self._emit(EventType.METRICS_SCRAPE_FAILED, error=f"{type(exc).__name__}: {exc}")

    async def close_gpu_source(self) -> None:
        if self.gpu_source is not None:
            try:
                await self.gpu_source.aclose()
            except Exception:
                pass

    async def close_session(self) -> None:
        if self._session is not None:
            await self._session.close()
