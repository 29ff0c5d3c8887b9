"""The soak loop: target up, load on, probes sampling, detector judging, responder
acting, everything recorded; then a bounded drain, a clean box and a verdict.

``SoakRun`` is told, never probed: keyword-only options, the target's layout
(``soak.records.TargetLayout``) and its parts (``RunParts``: the workload, the
detector, and factories for the parts that need a live target). Once the target
answers, the loop reads its facts once (``TargetFacts``: URL, model,
max_model_len, vLLM version profile, root PID) and hands that record to the
factories, so no part reaches into the run object.

Order of the end, whatever ended the run (duration, request cap, incident,
Ctrl-C/SIGTERM, an error): stop sending, drain (cut short on interrupt), stop
the probes, the detector and the client, stop the target's tree, record
``run_ended``, write summary.json from the recorded files, render the report,
close the sinks. ``aclose()`` is idempotent.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Protocol, Sequence

import aiohttp

from soak.bounds import fetch
from soak.clock import Clock, SystemClock, WallStepWatch, raw_wall, run_clock
from soak.config import RunConfig
from soak.criteria.rules import CriteriaDecision, CriterionState, RequestTally, judge
from soak.detect.detector import Detector
from soak.errors import (
    ConfigError,
    EnvironmentProblem,
    HarnessFault,
    SoakError,
    TargetNotReady,
    UsageError,
    WorkloadDoesNotFit,
)
from soak.load.client import StreamingClient
from soak.load.generator import LoadGenerator
from soak.load.progress import ProgressTracker
from soak.net import OutboundSession
from soak.net import session as outbound_session
from soak.probes.gpu import GpuFreshness
from soak.probes.scheduler import Probe, ProbeScheduler
from soak.records import Decision, GpuSourceLike, RunInfo, RunSink, TargetFacts, TargetKind, TargetLayout, Verdict
from soak.redact import Redactor
from soak.respond.responder import Responder
from soak.run.heap import HeapTuning
from soak.run.signals import handled as handled_signals
from soak.run.signals import interrupt_reason
from soak.run.sinks import FanOut
from soak.run.target import Target
from soak.samples import CutCause, GpuSample, RequestRecord, Sample, ServerSample
from soak.store.store import REQUESTS, RunStore
from soak.store.counters import CounterDelta
from soak.store.summary import RequestDigest, digest_requests, disk_incidents, load_span, summarize
from soak.versions import VllmProfile
from soak.workload import Workload

if TYPE_CHECKING:  # imported where used: the run's end and its options pull these in late
    from soak.report.child import ReportChild
    from soak.run.guardian import Guardian
    from soak.thresholds.evaluate import ThresholdResult, WindowBook

# The responder's "last minutes" come from here; bounded whatever the run's length.
RECENT_SAMPLES_MAX = 20_000
HARNESS_ERROR = "harness_error.txt"


@dataclass(frozen=True)
class RunOutcome:
    exit_code: int
    verdict: Verdict
    reason: str
    summary: Mapping[str, Any]


class GpuSourceFactory(Protocol):
    """The configured GPU source for the server at ``base_url``, opened (None: no
    GPU source). A missing NVML raises ``GpuUnavailable`` (exit 3)."""

    def __call__(self, base_url: str, *, session: OutboundSession) -> Awaitable[GpuSourceLike | None]: ...


class ProbesFactory(Protocol):
    """The probes for the target as ``facts`` describe it (called again after a restart)."""

    def __call__(self, facts: TargetFacts, *, session: OutboundSession, gpu_source: GpuSourceLike | None,
                 progress: ProgressTracker, log_from_start: bool) -> Sequence[Probe]: ...


class ResponderFactory(Protocol):
    def __call__(self, facts: TargetFacts, *, gpu_source: GpuSourceLike | None,
                 recent_samples: Callable[[], Sequence[Sample]],
                 on_write_error: Callable[[BaseException], None]) -> Responder: ...


class Calibrate(Protocol):
    """Count the workload's text once, on the target ``facts`` describe."""

    def __call__(self, workload: Workload, facts: TargetFacts) -> Awaitable[None]: ...


@dataclass(frozen=True)
class RunParts:
    """The concrete part each stage gets (``soak.run.wiring`` picks them)."""

    workload: Callable[[str | None], Workload]  # model -> workload
    calibrate: Calibrate
    detector: Detector
    gpu_source: GpuSourceFactory
    probes: ProbesFactory
    responder: ResponderFactory


@dataclass(frozen=True)
class ReportOptions:
    """The report rendered at the end, in a child process (``soak.report.child``)."""

    command: Sequence[str] | None = None  # None: ``python -m soak report``
    timeout_s: float | None = None  # None: the child's default
    html: bool = True  # False: summary.json and junit.xml only (``soak run --no-html``)


class SoakRun:
    """One soak run: ``await run()`` drives it to its end and returns the outcome.

    ``layout`` is what the config says of the server; ``parts`` are the concrete
    stages (``soak.run.wiring.build_soak_run`` picks both). The run's facts about
    the live target (``self.facts``) exist once the target answered."""

    def __init__(
        self,
        *,
        config: RunConfig,
        run_id: str,
        run_dir: Path,
        target: Target,
        layout: TargetLayout,
        parts: RunParts,
        store: RunStore,
        redacted_config: Mapping[str, Any],
        clock: Clock | None = None,
        sinks: Sequence[RunSink] = (),
        api_key: str | None = None,
        report: ReportOptions | None = ReportOptions(),  # None: no report at the end
        install_signal_handlers: bool = True,
        config_path: Path | None = None,
        redactor: Redactor | None = None,
        guardian: Guardian | None = None,
        heap: HeapTuning | None = None,
    ) -> None:
        self._config_path = config_path
        self._heap = heap
        self.redactor = redactor
        self._guardian = guardian
        # The harness's own failure (a write that failed, a bug): ends the run, exit 4.
        self._fault: BaseException | None = None
        self._fault_lock = threading.Lock()
        self._sink_errors: set[tuple[str, str]] = set()
        self.config = config
        self.run_id = run_id
        self.run_dir = Path(run_dir)
        self.target = target
        self.layout = layout
        self._parts = parts
        self.workload: Workload | None = None
        self.facts: TargetFacts | None = None  # once the target answered
        self.store = store
        # Labels on the monotonic time line; the raw wall clock is only watched (soak.clock).
        self.clock = run_clock(clock or SystemClock())
        self._wall_watch = WallStepWatch()
        self._observe_wall()
        self._cached_reader: Any = None  # soak.versions.CachedTokensReader, once the server's version is known
        self._server_life = CounterDelta()  # a split of the server's prompt counter: it restarted
        self.sinks = FanOut([store, *sinks], on_error=self._sink_error)
        self._redacted_config = redacted_config
        self._api_key = api_key
        self._install_signals = install_signal_handlers
        self._report = report
        self._report_child: ReportChild | None = None

        self.tracker = ProgressTracker()
        self.client: StreamingClient | None = None
        self.generator: LoadGenerator | None = None
        self.detector = parts.detector
        self.responder: Responder | None = None
        self.gpu_source: GpuSourceLike | None = None
        self._gpu_freshness = GpuFreshness(config.detector.pp_tail_stall.window)
        self.probe_session: OutboundSession | None = None
        self._scheduler: ProbeScheduler | None = None
        self._recent: deque[Sample] = deque(maxlen=RECENT_SAMPLES_MAX)
        self._watch_task: asyncio.Task[None] | None = None
        self._main_task: asyncio.Task[RunOutcome] | None = None
        self._incidents = 0
        self.restarts = 0
        self._failed = False
        self._stop_reason: str | None = None
        self._interrupted = False
        # A relaunch under way (on_hang: restart), so Ctrl-C need not wait for it.
        self._restart_task: asyncio.Task[None] | None = None
        self._closed = False
        self._outcome: RunOutcome | None = None
        # The failure criteria, judged live on every detector tick (soak.criteria).
        self.tally = RequestTally.for_config(config.criteria)
        self._requests: RequestDigest | None = None  # requests.jsonl as read at the end
        self._criteria_reported: set[str] = set()
        self._incident_idle = asyncio.Event()
        self._incident_idle.set()
        # Set by a sample that settles a rule at once: the watch loop judges then,
        # not up to a detector interval later.
        self._judge_now = asyncio.Event()
        # /metrics freshness, for the "metrics_stale" warning (the summary says
        # which span the server figures cover from samples.jsonl itself).
        self._metrics_fresh_at: float | None = None
        self._metrics_stale_since: float | None = None
        self._main_loop: asyncio.AbstractEventLoop | None = None
        self._fault_cancel = False
        self._fault_where = ""
        self._traceback: str | None = None
        self._threshold_book: WindowBook | None = None  # when a threshold aborts the run
        self._threshold_breach: ThresholdResult | None = None

    # -- the harness's own failures ------------------------------------------------
    def _sink_error(self, sink: object, method: str, exc: BaseException) -> None:
        """A sink raised. The run store failing means the record is being lost (a
        full disk, a read-only mount): that ends the run as a harness fault. The
        live view or the exporter failing costs a line once, not the run."""
        if sink is self.store:
            self.fault(exc, where=f"writing the run directory ({method})")
            return
        key = (type(sink).__name__, method)
        if key not in self._sink_errors:
            self._sink_errors.add(key)
            import sys

            print(f"soak: {type(sink).__name__}.{method} failed: {type(exc).__name__}: {exc} (the run goes on)",
                  file=sys.stderr)

    def fault(self, exc: BaseException, *, where: str) -> None:
        """The harness failed on its own (called from any thread): stop the load,
        end in order (server stopped, what was written kept), exit 4."""
        with self._fault_lock:
            if self._fault is not None:
                return
            self._fault = exc
            self._fault_where = where
        reason = f"harness fault while {where}: {type(exc).__name__}: {exc}"
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            self._stop_for_fault(reason)
        elif self._main_loop is not None:
            self._main_loop.call_soon_threadsafe(self._stop_for_fault, reason)

    def _set_fault(self, exc: BaseException, where: str) -> None:
        with self._fault_lock:
            if self._fault is None:
                self._fault, self._fault_where = exc, where

    def _stop_for_fault(self, reason: str) -> None:
        if self._stop_reason is None or not self._stop_reason.startswith("harness fault"):
            self._stop_reason = reason
        if self.generator is not None:
            self.generator.stop(reason)
            if self.client is not None:
                # The harness cut them, not the server: apart from failures.
                self.client.abort_in_flight(reason, cut_by=CutCause.INTERRUPT)
        elif (self._main_task is not None and not self._main_task.done()
              and self._main_task is not asyncio.current_task()):
            self._fault_cancel = True
            self._main_task.cancel()

    # -- fan-in ----------------------------------------------------------------
    def _on_sample(self, sample: Sample) -> None:
        recent = self._recent
        recent.append(sample)
        # Keep only the responder's window (by time; the count bound is a backstop).
        horizon = sample.ts - self.config.response.evidence.samples_window
        while recent and recent[0].ts < horizon:
            recent.popleft()
        if self.detector.observe(sample):
            self._judge_now.set()
        self.sinks.on_sample(sample)
        if isinstance(sample, GpuSample):
            change = self._gpu_freshness.observe(sample)
            if change is not None:
                self.event(change.pop("type"), **change)
        if isinstance(sample, ServerSample):
            self._metrics_freshness(sample)
            if sample.ok and self._server_life.add(sample.values.get("prompt_tokens")) \
                    and self._cached_reader is not None:
                self._cached_reader.restarted()  # its counters restarted: a new server life (an attached one too)
            if self._threshold_book is not None and sample.ok:
                self._threshold_book.add_server(sample.ts, sample.values)

    def _metrics_freshness(self, sample: ServerSample) -> None:
        from soak.store.summary import SERVER_KEYS

        fresh = sample.ok and any(k in sample.values for k in SERVER_KEYS)
        if fresh:
            if self._metrics_stale_since is not None:
                self.event("metrics_fresh", stale_since=self._metrics_stale_since,
                           stale_s=round(sample.ts - self._metrics_stale_since, 3))
                self._metrics_stale_since = None
            self._metrics_fresh_at = sample.ts
            return
        if self._metrics_stale_since is not None:
            return
        since = self._metrics_fresh_at
        stale_after = max(5.0, 3.0 * self.config.probes.metrics_interval)
        if since is None or sample.ts - since >= stale_after:
            self._metrics_stale_since = since if since is not None else sample.ts
            error = sample.error or "the scrape has none of the server counters"
            self.event("metrics_stale", since=since, error=str(error)[:200],
                       note="server token totals and the prefix-cache hit ratio cover only the time before")

    def _on_record(self, record: RequestRecord) -> None:
        # Live, a record ends now on the run's monotonic clock, as the load's span does.
        self.tally.add(record, at=self.clock.monotonic())
        self.sinks.on_request(record)
        if self._threshold_book is not None:
            self._threshold_book.add_request(record.to_json())

    def recent_samples(self) -> list[Sample]:
        window = self.config.response.evidence.samples_window
        since = self.clock.now() - window
        return [s for s in self._recent if s.ts >= since]

    def event(self, type: str, **fields: Any) -> None:
        self.sinks.on_event(type, {"ts": self.clock.now(), **fields})

    # -- control ---------------------------------------------------------------
    def interrupt(self, reason: str = "interrupted") -> None:
        """Ctrl-C, SIGTERM or SIGHUP: stop the load now (no drain wait), then end as usual."""
        if self._interrupted:
            return
        self._interrupted = True
        self._stop_reason = reason
        if self.generator is not None:
            self.generator.stop(reason)
            if self.client is not None:
                self.client.abort_in_flight(reason, cut_by=CutCause.INTERRUPT)
            if self._restart_task is not None:
                # Waiting for a relaunched server (minutes for a large model) is not
                # stopping now; the end stops whatever it had started.
                self._restart_task.cancel()
        elif self._main_task is not None:
            self._main_task.cancel()  # still starting: cut the start-up short

    def _install(self) -> list[int]:
        if not self._install_signals:
            return []
        loop = asyncio.get_running_loop()
        installed = []
        # Every one of them (SIGHUP too: a closed terminal) ends the run as an
        # interrupt; a default action would kill the harness with nothing written.
        # One inherited as ignored (nohup) stays ignored.
        for sig in handled_signals():
            try:
                loop.add_signal_handler(sig, self.interrupt, interrupt_reason(sig))
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        return installed

    # -- the run ---------------------------------------------------------------
    async def run(self) -> RunOutcome:
        """Run to the end and return the outcome; exit-3 and exit-2 problems
        re-raise after the record is written, so the CLI prints their one line;
        a harness fault raises ``HarnessFault`` (exit 4) once the server is
        stopped and the record closed, the traceback in harness_error.txt."""
        self._main_task = asyncio.current_task()
        self._main_loop = asyncio.get_running_loop()
        installed = self._install()
        problem: BaseException | None = None
        try:
            await self._run()
        except asyncio.CancelledError:
            if not (self._interrupted or self._fault_cancel):
                raise
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
        except EnvironmentProblem as exc:
            problem = exc
            self._stop_reason = f"{type(exc).__name__}: {exc}"
        except UsageError as exc:
            # A workload that fails only once counted against the live server.
            if isinstance(exc, ConfigError) and exc.path is None and self._config_path is not None:
                exc = type(exc)(exc.message, path=self._config_path, field=exc.field, line=exc.line)
            problem = exc
            self._stop_reason = f"bad config: {exc}"
        except Exception as exc:
            problem = exc
            self._traceback = traceback.format_exc()
            self._set_fault(exc, "running the soak")
            self._stop_reason = f"harness fault: {type(exc).__name__}: {exc}"
        finally:
            loop = asyncio.get_running_loop()
            for sig in installed:
                loop.remove_signal_handler(sig)
        try:
            outcome = await self._finish(problem)
        except Exception as exc:  # the end itself failed: still one line, exit 4
            self._traceback = self._traceback or traceback.format_exc()
            self._set_fault(exc, "ending the run")
            await self._stop_parts_quietly()
            raise HarnessFault(self._fault_line()) from exc
        if isinstance(problem, (EnvironmentProblem, UsageError)):
            raise problem
        if outcome.exit_code == 4:
            raise HarnessFault(self._fault_line()) from self._fault
        return outcome

    def _fault_line(self) -> str:
        exc = self._fault
        what = f"{type(exc).__name__}: {exc}" if exc is not None else "unknown"
        where = f" while {self._fault_where}" if self._fault_where else ""
        saved = self.run_dir / HARNESS_ERROR
        tail = f"; traceback in {saved}" if saved.exists() else ""
        return f"harness fault{where}: {what}; the server was stopped{tail}"

    def _save_traceback(self) -> None:
        exc = self._fault
        if exc is None:
            return
        text = self._traceback or "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        header = f"soak harness fault while {self._fault_where}: {type(exc).__name__}: {exc}\n\n"
        try:
            self.store.write_text(HARNESS_ERROR, header + text)
        except OSError:
            pass  # not writable: the one line on stderr is all there is

    async def _stop_parts_quietly(self) -> None:
        try:
            await self._stop_parts()
        except Exception:
            pass

    async def _run(self) -> None:
        config, layout, parts = self.config, self.layout, self._parts
        self.store.write_config(self._redacted_config)
        if self._guardian is not None:
            self._guardian.start()  # before the server exists: a SIGKILLed harness takes it along
        heap = {"heap": {"tuned": self._heap.applied, "how": self._heap.reason}} if self._heap else {}
        self.event("run_created", run_id=self.run_id, target=layout.kind.value, **heap)
        if self.target.base_url:
            # The URL is known before start (launched, attached): check the GPU
            # source now, so a box without NVML exits 3 before a server is started.
            await self._open_gpu_source()
        self.event("target_starting", target=layout.kind.value)
        try:
            await self.target.start()
        finally:
            # What a dead night left behind and this start cleaned (soak.respond.tree.clean_leftovers).
            leftovers = getattr(self.target, "leftovers", None)
            if leftovers:
                self.event("leftovers_killed", processes=list(leftovers))
        self.event("target_ready", base_url=self.target.base_url, root_pid=self.target.root_pid,
                   models=list(self.target.models))
        version_profile = await self._read_server_version()
        # The model the requests name: the config's, else the first the server lists.
        model = layout.model or (self.target.models[0] if self.target.models else None)
        facts = self.facts = TargetFacts(
            layout=layout,
            base_url=self.target.base_url,
            model=model,
            models=tuple(self.target.models),
            root_pid=self.target.root_pid,
            max_model_len=await self._max_model_len(model),
            version_profile=version_profile,
        )
        await self._record_build(facts)
        workload = self.workload = parts.workload(model)
        await parts.calibrate(workload, facts)
        plan = workload.plan(duration_s=config.duration, concurrency=config.load.concurrency,
                             block_size=layout.block_size).to_json()
        self.store.write_plan(plan)
        self._check_fit(plan, facts)

        await self._open_gpu_source()
        self.responder = parts.responder(facts, gpu_source=self.gpu_source, recent_samples=self.recent_samples,
                                         on_write_error=self._evidence_write_failed)
        await self.responder.start()

        started_at = self.clock.now()
        self.sinks.on_start(
            RunInfo(
                run_id=self.run_id,
                run_dir=self.run_dir,
                started_at=started_at,
                duration_s=config.duration,
                warmup_s=config.warmup,
                target_kind=layout.kind,
                base_url=facts.base_url,
                model=model,
                root_pid=facts.root_pid,
                config=self._redacted_config,
                gpu_count=layout.topology.gpu_count,
                plan=plan,
            )
        )

        self.client = StreamingClient(
            base_url=facts.base_url,
            timeouts=config.load.timeouts,
            tracker=self.tracker,
            max_connections=config.load.concurrency,
            api_key=self._api_key,
            clock=self.clock,
        )
        self.client.mono_origin = self.store.mono_origin
        self.client.usage_cached_tokens = self._cached_tokens_reader(facts)
        await self.client.start()
        self._start_probes()
        # The report's process imports its renderer now, off the harness, so the run's end only renders.
        self._report_child = await self._start_report()
        self.generator = LoadGenerator(
            workload=workload,
            client=self.client,
            config=config.load,
            duration_s=config.duration,
            warmup_s=config.warmup,
            on_record=self._on_record,
            seed=config.seed,
            clock=self.clock,
        )
        if self._interrupted:  # a signal landed during start-up's last await
            return
        self._start_threshold_book()
        self._watch_task = asyncio.create_task(self._watch(), name="soak-detector")
        # Server counters just before the first request and just after the drain,
        # so summary.json's server-side deltas cover exactly the load applied.
        await self._scrape_metrics()
        self.event("load_started", mode=config.load.mode, concurrency=config.load.concurrency)
        self.tally.open_load(self.clock.monotonic())  # work is owed from here: no grace hides its absence
        # What the summary judges the requests by, as JSON (config.yaml is for people).
        self.event("criteria_config", criteria=config.criteria.model_dump(mode="json"))
        result = await self.generator.run()
        self.tally.close_load(self.clock.monotonic())
        await self._scrape_metrics()
        self.event(
            "load_stopped",
            reason=self._stop_reason or result.stop_reason,
            requests_sent=result.requests_sent,
            aborted_at_drain=result.aborted_at_drain,
            drain_s=round(result.drained_mono - result.stopped_mono, 3),
        )
        if self._stop_reason is None:
            self._stop_reason = result.stop_reason

    def _observe_wall(self) -> None:
        """A step of the wall clock (soak.clock.wall_step) becomes an event; no figure moves."""
        step = self._wall_watch.observe(raw_wall(self.clock), self.clock.elapsed())
        if step is not None:
            self.event("wall_clock_step", **step.to_json())

    def _evidence_write_failed(self, exc: BaseException) -> None:
        self.fault(exc, where="writing incident evidence")

    def _session(self) -> OutboundSession:
        """The run's session for its own reads of the server (and the probes')."""
        if self.probe_session is None:
            self.probe_session = outbound_session()  # a 3xx is a failed read naming its Location, never followed
        return self.probe_session

    async def _read_server_version(self) -> VllmProfile:
        """GET /version: the run adapts to the server's vLLM version (soak.versions)."""
        from soak.net import RedirectRefused
        from soak.versions import profile_for, version_from_body

        version = None
        try:
            url = self.target.base_url.rstrip("/") + "/version"
            resp = await fetch(self._session(), url, total_s=self.config.probes.timeout)
            if resp.status == 200:
                version = version_from_body(resp.json())
        except RedirectRefused as exc:  # not followed (soak.net): said, with where it pointed
            self.event("warning", message=f"GET /version: {exc}")
            version = None
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):  # a bound hit is a ValueError too
            version = None
        profile = profile_for(version)
        self.event("server_version", **profile.to_json())
        if profile.warning:
            self.event("warning", message=profile.warning)
        return profile

    def _cached_tokens_reader(self, facts: TargetFacts) -> Callable[[Mapping[str, Any]], int | None]:
        """How a usage object's cached tokens read on this server (a missing field
        is 0 on vLLM 0.11.x when --enable-prompt-tokens-details is known on)."""
        from soak.versions import CachedTokensReader

        self._cached_reader = CachedTokensReader(profile=facts.version_profile,
                                                 details_enabled=facts.layout.prompt_tokens_details)
        return self._cached_reader

    def _check_fit(self, plan: Mapping[str, Any], facts: TargetFacts) -> None:
        """Refuse a workload whose largest request cannot fit the target's
        ``max_model_len`` (vLLM lists it on each model of /v1/models): every such
        request would be an HTTP 400, so the soak would measure nothing."""
        largest = plan.get("largest_request") or {}
        prompt, max_tokens = largest.get("prompt_tokens") or 0, largest.get("max_tokens") or 0
        if not prompt:
            return
        limit = facts.max_model_len
        if limit is None:
            self.event("max_model_len_unknown", note="/v1/models lists no max_model_len: the fit is not checked")
            return
        counter = str(plan.get("counter") or "")
        if prompt + max_tokens <= limit:
            self.event("workload_fits", max_model_len=limit, largest_prompt=prompt, max_tokens=max_tokens)
            return
        if prompt > limit:
            message = (f"the workload's largest prompt is {prompt:,} tokens, above the target's max_model_len "
                       f"{limit:,} (from /v1/models)")
        else:
            message = (f"the workload's largest request needs {prompt + max_tokens:,} tokens ({prompt:,} prompt + "
                       f"{max_tokens:,} max_tokens), above the target's max_model_len {limit:,} (from /v1/models)")
        if not counter.startswith("exact"):
            # Token counts are an estimate: warn, let the error-rate criterion judge.
            self.event("workload_may_not_fit", max_model_len=limit, largest_prompt=prompt, max_tokens=max_tokens,
                       counter=counter, message=message)
            return
        raise WorkloadDoesNotFit(message + ": the server would refuse those requests (HTTP 400)")

    async def _max_model_len(self, model: str | None) -> int | None:
        """``max_model_len`` of ``model`` (else the first model) as /v1/models lists it."""
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        try:
            resp = await fetch(self._session(), self.target.base_url.rstrip("/") + "/v1/models", headers=headers,
                               total_s=10)
            if resp.status != 200:
                return None
            body = resp.json()
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError):  # bounds too (ValueError)
            return None
        # The server's JSON, read defensively: any shape may come back.
        models = body.get("data") if isinstance(body, dict) else None
        if not isinstance(models, list):
            return None
        entries = [m for m in models if isinstance(m, dict)]
        chosen = next((m for m in entries if m.get("id") == model), entries[0] if entries else None)
        limit = chosen.get("max_model_len") if chosen is not None else None
        return limit if type(limit) is int and limit > 0 else None

    async def _open_gpu_source(self) -> None:
        session = self._session()
        if self.gpu_source is None:
            self.gpu_source = await self._parts.gpu_source(self.target.base_url, session=session)

    def _start_probes(self) -> None:
        assert self.facts is not None
        probes = self._parts.probes(self.facts, session=self._session(), gpu_source=self.gpu_source,
                                    progress=self.tracker, log_from_start=self.restarts == 0)
        self._scheduler = ProbeScheduler(list(probes), emit=self._on_sample)
        self._scheduler.start()

    async def _scrape_metrics(self) -> None:
        probes = self._scheduler.probes if self._scheduler is not None else ()
        for probe in probes:
            if probe.name == "metrics":
                try:
                    for sample in await asyncio.wait_for(probe.collect(), 10.0):
                        self._on_sample(sample)
                except Exception as exc:  # a missed bracket only widens the server-side deltas
                    self.event("metrics_scrape_failed", error=f"{type(exc).__name__}: {exc}")

    def _judge_criteria(self) -> CriteriaDecision:
        self.tally.watch(self.clock.monotonic())
        decision = judge(self.config.criteria, self.tally, final=False)
        for result in decision.results:
            if result.state in (CriterionState.FAIL, CriterionState.AT_RISK) and result.name not in self._criteria_reported:
                self._criteria_reported.add(result.name)
                self.event("criterion_" + result.state.value, criterion=result.name, value=result.value,
                           threshold=result.threshold, reasons=list(result.reasons))
        if decision.stop and self.generator is not None and not self.generator.stopping:
            first = decision.failed[0]
            self._stop_reason = f"criterion {first.name}: {first.reasons[0]}"
            self.generator.stop(self._stop_reason)
        return decision

    async def _watch(self) -> None:
        interval = self.config.detector.interval
        while True:
            try:
                await asyncio.wait_for(self._judge_now.wait(), interval)
            except asyncio.TimeoutError:
                pass
            self._judge_now.clear()
            self._observe_wall()
            self._judge_criteria()
            assessment = self.detector.assess(self.clock.now())
            self.sinks.on_assessment(assessment)
            self._check_thresholds()
            for decision in assessment.new_incidents:
                try:
                    await self._incident(decision)
                except Exception as exc:  # the response failed: record it, end the soak as failed
                    self.event("incident_error", error=f"{type(exc).__name__}: {exc}")
                    self._failed = True
                    self._stop_reason = f"incident handling failed: {exc}"
                    if self.generator is not None:
                        self.generator.stop(self._stop_reason)
                if self.generator is not None and self.generator.stopping:
                    return

    async def _incident(self, decision: Decision) -> None:
        self._incident_idle.clear()
        try:
            await self._respond(decision)
        finally:
            self._incident_idle.set()

    async def _respond(self, decision: Decision) -> None:
        assert self.generator is not None and self.client is not None and self.responder is not None
        self._incidents += 1
        self._failed = True
        number = self._incidents
        self.generator.pause()
        paused = self.clock.monotonic()  # work is not owed while the target is down (soak.criteria)
        cut = self.client.abort_in_flight(f"incident {number}", cut_by=CutCause.INCIDENT)
        self.event("incident_started", number=number, rule=decision.rule, kind=decision.kind.value,
                   aborted_requests=cut)
        record = await self.responder.handle(decision, number)
        self.sinks.on_incident(record)

        from soak.respond.policy import Action, next_action

        can_restart = self.layout.kind is not TargetKind.ATTACHED
        action = next_action(self.config.response, restarts_done=self.restarts, can_restart=can_restart)
        if action.action is not Action.RESTART or self._interrupted or self.generator.stopping:
            self._stop_reason = f"incident {number}: {action.reason}"
            self.generator.stop(self._stop_reason)
            return
        self.event("restart_started", number=number, reason=action.reason)
        try:
            if self._scheduler is not None:
                await self._scheduler.close()
            self._restart_task = asyncio.ensure_future(self.target.restart())
            await self._restart_task
        except asyncio.CancelledError:
            if not self._interrupted:
                raise
            self.event("restart_cancelled", number=number, reason=self._stop_reason)
            return
        except (TargetNotReady, SoakError) as exc:
            self.event("restart_failed", number=number, error=str(exc))
            self._stop_reason = f"incident {number}: restart failed: {exc}"
            self.generator.stop(self._stop_reason)
            return
        finally:
            self._restart_task = None
        self.restarts += 1
        if self._cached_reader is not None:
            self._cached_reader.restarted()  # a new server life: its details flag is learned again
        self.detector.reset(self.clock.now())
        if self.facts is not None:
            self.facts = replace(self.facts, root_pid=self.target.root_pid)
        self._start_probes()
        self.event("restart_done", number=number, restarts=self.restarts, root_pid=self.target.root_pid)
        self.tally.restart(paused, self.clock.monotonic())  # a new server life: its own start-up allowance
        self.generator.resume()

    # -- the end ---------------------------------------------------------------
    async def _finish(self, problem: BaseException | None) -> RunOutcome:
        if self._outcome is not None:
            return self._outcome
        report = self._report_child or await self._start_report()
        try:
            return await self._end(problem, report)
        finally:
            if report is not None:
                await report.aclose()

    async def _end(self, problem: BaseException | None, report: ReportChild | None) -> RunOutcome:
        await self._stop_parts()
        # What the verdict rests on is read back from disk: an incident whose
        # response finished after the load (its record never reached the sinks)
        # still fails the run, and the criteria see every recorded request.
        try:
            incidents = max(self._incidents, len(disk_incidents(self.run_dir)))
        except OSError:  # an unreadable run directory: what the run saw live
            incidents = self._incidents
        # Load the harness itself cut short (Ctrl-C, its own fault) owes no work it had no time for.
        cut_short = self._interrupted or self._fault is not None or problem is not None
        criteria = self._final_criteria(cut_short=cut_short)
        failed = self._failed or incidents > 0 or not criteria.passed
        if isinstance(problem, EnvironmentProblem):
            exit_code, verdict = 3, Verdict.ABORTED
        elif isinstance(problem, UsageError):
            exit_code, verdict = 2, Verdict.ABORTED
        elif failed and not self._interrupted:
            exit_code, verdict = 1, Verdict.FAIL  # an incident or a failed criterion outranks a harness fault
        elif self._fault is not None or problem is not None:
            exit_code, verdict = 4, Verdict.ABORTED
        elif self._interrupted:
            exit_code, verdict = 130, (Verdict.FAIL if failed else Verdict.ABORTED)
        else:
            exit_code, verdict = 0, Verdict.PASS
        breached: list[str] = []
        if exit_code in (0, 1, 4) and not failed:  # a failed criterion or an incident on disk is exit 1, above 99
            breached = self._thresholds_breached()
            if self._threshold_breach is not None and self._threshold_breach.name not in breached:
                breached.insert(0, self._threshold_breach.name)
        if breached:  # CONTRACTS: 1 (an incident) outranks 99 (a threshold), which outranks a harness fault
            exit_code, verdict = 99, Verdict.FAIL
            if not (self._stop_reason or "").startswith("threshold"):
                self._stop_reason = "thresholds breached: " + "; ".join(breached)
        reason = self._stop_reason or "finished"
        if self._fault is not None:
            self._save_traceback()
            if not reason.startswith("harness fault"):
                reason = f"{reason}; harness fault while {self._fault_where}: {type(self._fault).__name__}: {self._fault}"
        if not isinstance(problem, (EnvironmentProblem, UsageError)) and not criteria.passed \
                and not reason.startswith("criterion"):
            reason = "; ".join(criteria.reasons) + f" (load stopped: {reason})"
        self._observe_wall()
        self.event("run_ended", verdict=verdict.value, reason=reason, exit_code=exit_code, load_cut_short=cut_short,
                   incidents=incidents, restarts=self.restarts,
                   criteria_failed=[r.name for r in criteria.failed])
        try:
            summary = summarize(self.run_dir, requests=self._requests)
        except Exception as exc:  # a damaged record still ends the run in order
            self.fault(exc, where="summarizing the run")
            summary = {"verdict": verdict.value, "stop_reason": reason}
        try:
            self.store.write_summary(summary)
        except OSError as exc:
            self.fault(exc, where="writing summary.json")
            if exit_code in (0, 130):
                exit_code, verdict = 4, Verdict.ABORTED
        await self._push(summary, exit_code=exit_code)
        if report is not None:
            await self._render(report)
        self.sinks.close()
        if self.redactor is not None:
            try:
                # The last pass: nothing the run wrote keeps a known secret.
                await asyncio.to_thread(self.redactor.scrub_tree, self.run_dir)
            except OSError:
                pass
        self._outcome = RunOutcome(exit_code=exit_code, verdict=verdict, reason=reason, summary=summary)
        return self._outcome

    # -- build, thresholds, push (docs/nightly.md) ------------------------------
    async def _record_build(self, facts: TargetFacts) -> None:
        """The ``build`` event: /version (bounded, best effort) and the launch digest."""
        from soak.history.build import build_identity, fetch_vllm_version

        version = await fetch_vllm_version(facts.base_url, api_key=self._api_key)
        self.event("build", **build_identity(self._redacted_config, vllm_version=version, served_model=facts.model))

    def _start_threshold_book(self) -> None:
        from soak.thresholds.evaluate import WindowBook, compile_thresholds

        thresholds = compile_thresholds(self.config.thresholds)
        if any(t.abort_on_fail for t in thresholds):
            self._threshold_book = WindowBook(thresholds, load_started_at=self.clock.now())

    def _check_thresholds(self) -> None:
        if self._threshold_book is None or self._threshold_breach is not None or self.generator is None:
            return
        result = self._threshold_book.check(self.clock.now())
        if result is None:
            return
        self._threshold_breach = result
        self._stop_reason = f"threshold breached (abort_on_fail): {result.reason}"
        self.event("threshold_breached", threshold=result.name, observed=result.observed, reason=result.reason)
        self.generator.stop(self._stop_reason)

    def _thresholds_breached(self) -> list[str]:
        """Names of the thresholds the recorded run breaches (the same reading as summary.json's)."""
        if not self.config.thresholds:
            return []
        from soak.thresholds.rundir import run_thresholds

        try:
            results = run_thresholds(self.run_dir, summarize(self.run_dir, requests=self._requests),
                                     section=self.config.model_dump(mode="json")["thresholds"])
        except Exception as exc:  # judged again by `soak report`; never lose the run over it
            self.event("thresholds_failed", error=f"{type(exc).__name__}: {exc}")
            return []
        return [r.name for r in results or () if r.breached]

    async def _push(self, summary: Mapping[str, Any], *, exit_code: int) -> None:
        if self.config.pushgateway.url is None:
            return
        from soak.export.push import push_run

        try:
            pushed = await asyncio.to_thread(push_run, self.config.pushgateway, summary, exit_code=exit_code)
        except Exception as exc:  # the night is recorded; a missed push is said, not fatal
            self.event("push_failed", url=self.config.pushgateway.url, error=f"{type(exc).__name__}: {exc}")
            import sys

            print(f"soak run: push to {self.config.pushgateway.url} failed: {exc}", file=sys.stderr)
            return
        self.event("pushed", url=self.config.pushgateway.url, **pushed)

    def _final_criteria(self, *, cut_short: bool = False) -> CriteriaDecision:
        try:
            # Read once: summary.json (and the thresholds) reuse this digest.
            self._requests = digest_requests(self.run_dir / REQUESTS, self.config.criteria,
                                             span=load_span(self.run_dir, cut_short=cut_short))
            tally = self._requests.tally
        except OSError:
            tally = self.tally  # the file is gone: what the run saw live
            tally.cut_short = cut_short
        return judge(self.config.criteria, tally, final=True)

    async def _start_report(self) -> ReportChild | None:
        if self._report is None:
            return None
        from soak.report.child import DEFAULT_TIMEOUT_S, ReportChild

        child = ReportChild(self.run_dir, command=self._report.command,
                            timeout_s=self._report.timeout_s or DEFAULT_TIMEOUT_S, html=self._report.html)
        await child.start()
        return child

    async def _render(self, child: ReportChild) -> None:
        """Render in the child; whatever happens there, the run's exit status stays
        the run's (the record is complete; `soak report DIR` can render again)."""
        outcome = await child.render()
        if outcome.ok:
            files = ["junit.xml", "report.html"] if self._report is None or self._report.html else ["junit.xml"]
            self.event("report_written", elapsed_s=round(outcome.elapsed_s, 3), files=files)
        else:
            self.event("report_failed", error=outcome.error, returncode=outcome.returncode,
                       elapsed_s=round(outcome.elapsed_s, 3))

    async def _stop_parts(self) -> None:
        """Every part stopped, each on its own: one that fails (a harness fault)
        never keeps the server running."""

        async def step(what: str, make: Callable[[], Awaitable[object]]) -> None:
            try:
                await make()
            except Exception as exc:
                self._set_fault(exc, f"stopping {what}")

        if self._watch_task is not None:
            if not self._incident_idle.is_set() and not self._watch_task.done():
                # A response under way finishes and reaches the sinks (bounded
                # like the responder's own close): its record belongs in the run.
                cfg = self.config.response
                bound = cfg.evidence.budget + cfg.kill_timeout + cfg.gpu_release_timeout + 10.0
                idle = asyncio.ensure_future(self._incident_idle.wait())
                await asyncio.wait({idle, self._watch_task}, timeout=bound)
                idle.cancel()
            self._watch_task.cancel()
            await asyncio.gather(self._watch_task, return_exceptions=True)
        if self._scheduler is not None:
            await step("the probes", self._scheduler.close)
        if self.responder is not None:
            await step("the responder", self.responder.aclose)
        if self.client is not None:
            await step("the client", self.client.aclose)
        if self.gpu_source is not None:
            try:
                await self.gpu_source.aclose()
            except Exception:
                pass
        if self.probe_session is not None:
            await step("the probe session", self.probe_session.close)
        started = time.monotonic()
        await step("the target", self.target.aclose)
        if self._guardian is not None:
            await step("the guardian", lambda: asyncio.to_thread(self._guardian.close))
        self.event("target_stopped", stop_s=round(time.monotonic() - started, 3))
        if self.responder is not None:
            try:
                released = await self.responder.release_shm()
            except Exception as exc:  # housekeeping never fails a run
                released = {"error": f"{type(exc).__name__}: {exc}"}
            if released:
                self.event("shm_released", **released)

    async def aclose(self) -> None:
        """Idempotent: ends the run's parts if ``run()`` did not get to."""
        if self._closed:
            return
        self._closed = True
        if self._outcome is None:
            await self._stop_parts()
            self.sinks.close()
        if self._report_child is not None:
            await self._report_child.aclose()

