"""The soak loop: target up, load on, probes sampling, detector judging, responder
acting, everything recorded; then a bounded drain, a clean box and a verdict.

``SoakRun`` conducts; its parts own their logic. It is told, never probed: the
config, who the run is (``RunIdentity``), the target's layout and its parts
(``soak.run.parts.RunParts``), the store and sinks, and its options. Once the
target answers, its facts are read once (``soak.run.target_facts``) and handed
to the factories. Samples and records come in through ``soak.run.fanin``; the
probes live in ``soak.run.probing``; the criteria and thresholds are judged
live by ``soak.run.live_judge``; an incident goes to ``soak.run.incidents``.

Order of the end, whatever ended the run (duration, request cap, incident,
Ctrl-C/SIGTERM, an error): stop sending, drain (cut short on interrupt), stop
the probes, the detector and the client, stop the target's tree, record
``run_ended``, write summary.json from the recorded files, render the report,
close the sinks. ``aclose()`` is idempotent.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Sequence

from soak.clock import Clock, SystemClock, WallStepWatch, raw_wall, run_clock
from soak.config import RunConfig
from soak.criteria.rules import RequestTally
from soak.errors import ConfigError, EnvironmentProblem, HarnessFault, UsageError
from soak.events import EventType
from soak.load.client import StreamingClient
from soak.load.generator import LoadGenerator
from soak.load.progress import ProgressTracker
from soak.prove.sprt import Plan
from soak.records import RunInfo, RunSink, TargetFacts, TargetKind, TargetLayout
from soak.respond.responder import Responder
from soak.run import signals
from soak.run.fanin import FanIn
from soak.run.faults import Faults
from soak.run.ending import ReportOptions, RunOutcome, fault_line, finish, start_report
from soak.run.heap import HeapTuning
from soak.run.incidents import CycleParts, IncidentCycle, TargetLives
from soak.run.live_judge import LiveJudge
from soak.run.parts import RunIdentity, RunParts
from soak.run.probing import Probing
from soak.run.proving import LiveProof, detection_horizon_s
from soak.run.sinks import FanOut
from soak.run.stopping import LoadStop
from soak.run.target import Target
from soak.run.target_facts import VERSION_TIMEOUT_S, check_fit, read_target_facts, say_fit
from soak.samples import CutCause
from soak.store.store import RunStore
from soak.target.config import LaunchedTarget
from soak.target.launch import LaunchSpec
from soak.workload import Workload

if TYPE_CHECKING:  # the report child is started through soak.run.ending
    from soak.report.child import ReportChild

# How long the server's own interpreter may take to say its packages (soak.target.launch): past
# it they are "unknown", and the load starts all the same.
LAUNCH_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RunOptions:
    api_key: str | None = None  # the target's, for the run's own reads and the load
    report: ReportOptions | None = ReportOptions()  # None: no report at the end
    install_signal_handlers: bool = True
    heap: HeapTuning | None = None  # what soak.run.heap did, said in run_created
    proof_plan: Plan | None = None  # prove: the sequential test, resolved (soak.run.proving)


class SoakRun:
    """One soak run: ``await run()`` drives it to its end and returns the outcome.

    ``layout`` is what the config says of the server; ``parts`` are the concrete
    stages (``soak.run.wiring.build_soak_run`` picks both). The run's facts about
    the live target (``self.facts``) exist once the target answered."""

    def __init__(self, *, config: RunConfig, redacted_config: Mapping[str, Any], identity: RunIdentity,
                 target: Target, layout: TargetLayout, parts: RunParts, store: RunStore,
                 sinks: Sequence[RunSink] = (), clock: Clock | None = None,
                 options: RunOptions = RunOptions()) -> None:
        self.config = config
        self._redacted_config = redacted_config
        self.run_id, self.run_dir, self._config_path = identity.run_id, identity.run_dir, identity.config_path
        self.target = target
        self.layout = layout
        self._parts = parts
        self.redactor, self._guardian = parts.redactor, parts.guardian
        self.store = store
        self.options = options
        self.report_child: ReportChild | None = None
        # The harness's own failure (a write that failed, a bug): ends the run, exit 4.
        self.faults = Faults(record=store, on_fault=self._stop_for_fault)
        self._fault_cancel = False
        # Labels on the monotonic time line; the raw wall clock is only watched (soak.clock).
        self.clock = run_clock(clock or SystemClock())
        self._wall_watch = WallStepWatch()
        self.load_stop = LoadStop()
        # prove: the sequential test followed live (soak.run.proving); it hears every event after the store
        plan = options.proof_plan if config.prove is not None else None
        self.proof = None if plan is None else LiveProof(
            plan, horizon_s=detection_horizon_s(config.detector, config.probes),
            stop_at_decision=bool(config.prove and config.prove.stop_at_decision), stop=self.load_stop,
            emit=self.event,
            show=lambda decision: self.sinks.on_proof(decision))
        self.sinks = FanOut([store, *([self.proof.sink] if self.proof is not None else []), *sinks],
                            on_error=self.faults.sink_error)

        self.workload: Workload | None = None
        self.facts: TargetFacts | None = None  # once the target answered
        self.client: StreamingClient | None = None
        self.generator: LoadGenerator | None = None
        self.detector = parts.detector
        self.responder: Responder | None = None
        # The failure criteria, judged live on every detector tick (soak.criteria).
        self.tally = RequestTally.for_config(config.criteria)
        self.live = LiveJudge(config.criteria, tally=self.tally, stop=self.load_stop, clock=self.clock, emit=self.event)
        self._fan_in = FanIn(sinks=self.sinks, detector=self.detector, tally=self.tally, live=self.live,
                             clock=self.clock, emit=self.event,
                             samples_window_s=config.response.evidence.samples_window,
                             gpu_window_s=config.detector.pp_tail_stall.window,
                             metrics_interval_s=config.probes.metrics_interval)
        self.tracker = ProgressTracker()
        self._probing = Probing(gpu_source=parts.gpu_source, probes=parts.probes, progress=self.tracker,
                                on_sample=self._fan_in.on_sample, emit=self.event)
        self.cycle: IncidentCycle | None = None  # once the load runs
        self._watch_task: asyncio.Task[None] | None = None
        self._main_task: asyncio.Task[RunOutcome] | None = None
        self._closed = False
        self.outcome: RunOutcome | None = None
        self.observe_wall()  # the wall clock's first reading

    # -- the harness's own failures ------------------------------------------------
    def fault(self, exc: BaseException, *, where: str) -> None:
        """The harness failed on its own (called from any thread): stop the load,
        end in order (server stopped, what was written kept), exit 4."""
        self.faults.fault(exc, where=where)

    def _set_fault(self, exc: BaseException, where: str) -> None:
        self.faults.note(exc, where)

    def _stop_for_fault(self, reason: str) -> None:
        if self.load_stop.reason is None or not self.load_stop.reason.startswith("harness fault"):
            self.load_stop.reason = reason
        if not self._cut_load(reason):
            if (self._main_task is not None and not self._main_task.done()
                    and self._main_task is not asyncio.current_task()):
                self._fault_cancel = True
                self._main_task.cancel()

    def _cut_load(self, reason: str) -> bool:
        """Stop sending and cut what is in flight (the harness cut them, not the
        server: apart from failures); False before the load exists."""
        if self.generator is None:
            return False
        self.generator.stop(reason)
        if self.client is not None:
            self.client.abort_in_flight(reason, cut_by=CutCause.INTERRUPT)
        return True

    def event(self, type: EventType, **fields: Any) -> None:
        self.sinks.on_event(type, {"ts": self.clock.now(), **fields})

    # -- control ---------------------------------------------------------------
    def interrupt(self, reason: str = "interrupted") -> None:
        """Ctrl-C, SIGTERM or SIGHUP: stop the load now (no drain wait), then end as usual."""
        if self.load_stop.interrupted:
            return
        self.load_stop.interrupted = True
        self.load_stop.reason = reason
        if self._cut_load(reason):
            if self.cycle is not None:
                self.cycle.cancel_restart()
        elif self._main_task is not None:
            self._main_task.cancel()  # still starting: cut the start-up short

    # -- the run ---------------------------------------------------------------
    async def run(self) -> RunOutcome:
        """Run to the end and return the outcome; exit-3 and exit-2 problems
        re-raise after the record is written, so the CLI prints their one line;
        a harness fault raises ``HarnessFault`` (exit 4) once the server is
        stopped and the record closed, the traceback in harness_error.txt."""
        self._main_task = asyncio.current_task()
        self.faults.loop = asyncio.get_running_loop()
        installed = signals.install(self.interrupt) if self.options.install_signal_handlers else []
        problem: BaseException | None = None
        try:
            await self._run()
        except asyncio.CancelledError:
            if not (self.load_stop.interrupted or self._fault_cancel):
                raise
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
        except EnvironmentProblem as exc:
            problem = exc
            self.load_stop.reason = f"{type(exc).__name__}: {exc}"
        except UsageError as exc:
            # A workload that fails only once counted against the live server.
            if isinstance(exc, ConfigError) and exc.path is None and self._config_path is not None:
                exc = type(exc)(exc.message, path=self._config_path, field=exc.field, line=exc.line)
            problem = exc
            self.load_stop.reason = f"bad config: {exc}"
        except Exception as exc:
            problem = exc
            self.faults.traceback = traceback.format_exc()
            self._set_fault(exc, "running the soak")
            self.load_stop.reason = f"harness fault: {type(exc).__name__}: {exc}"
        finally:
            signals.uninstall(installed)
        try:
            outcome = await finish(self, problem)
        except Exception as exc:  # the end itself failed: still one line, exit 4
            self.faults.traceback = self.faults.traceback or traceback.format_exc()
            self._set_fault(exc, "ending the run")
            await self._stop_parts_quietly()
            raise HarnessFault(fault_line(self)) from exc
        if isinstance(problem, (EnvironmentProblem, UsageError)):
            raise problem
        if outcome.exit_code == 4:
            raise HarnessFault(fault_line(self)) from self.faults.exc
        return outcome

    async def _stop_parts_quietly(self) -> None:
        try:
            await self.stop_parts()
        except Exception:
            pass

    async def _run(self) -> None:
        facts = await self._start_target()
        config, layout, parts = self.config, self.layout, self._parts
        workload = self.workload = parts.workload(facts.model)
        count_output = await parts.calibrate(workload, facts)
        plan = workload.plan(duration_s=config.duration, concurrency=config.load.concurrency,
                             block_size=layout.block_size)
        plan_json = plan.to_json()
        self.store.write_plan(plan_json)
        say_fit(check_fit(plan, facts.max_model_len), self.event)

        gpu_source = await self._probing.open_gpu_source(self.target.base_url)
        self.responder = parts.responder(facts, gpu_source=gpu_source, recent_samples=self._fan_in.recent_samples,
                                         on_write_error=self._evidence_write_failed)
        await self.responder.start()
        self.sinks.on_start(RunInfo(
            run_id=self.run_id, run_dir=self.run_dir, started_at=self.clock.now(), duration_s=config.duration,
            warmup_s=config.warmup, target_kind=layout.kind, base_url=facts.base_url, model=facts.model,
            root_pid=self.target.root_pid, config=self._redacted_config, gpu_count=layout.topology.gpu_count,
            plan=plan_json,
        ))
        self.client = StreamingClient(base_url=facts.base_url, timeouts=config.load.timeouts, tracker=self.tracker,
                                      max_connections=config.load.concurrency, api_key=self.options.api_key,
                                      clock=self.clock)
        self.client.mono_origin = self.store.mono_origin
        self.client.usage_cached_tokens = self._cached_tokens_reader(facts)
        self.client.count_output = count_output  # exact counts of what was streamed, where the run has them
        await self.client.start()
        self._probing.start(facts, log_from_start=True)
        # The report's process imports its renderer now, off the harness, so the run's end only renders.
        self.report_child = await start_report(self.options.report, self.run_dir)
        self.generator = self.load_stop.load = LoadGenerator(
            workload=workload, client=self.client, config=config.load, duration_s=config.duration,
            warmup_s=config.warmup, on_record=self._fan_in.on_record, seed=config.seed, clock=self.clock,
        )
        if self.load_stop.interrupted:  # a signal landed during start-up's last await
            return
        await self._run_load()

    async def _start_target(self) -> TargetFacts:
        """The target started and answering; its facts read once and said (``build`` too)."""
        self.store.write_config(self._redacted_config)
        if self._guardian is not None:
            self._guardian.start()  # before the server exists: a SIGKILLed harness takes it along
        heap = self.options.heap
        said = {"heap": {"tuned": heap.applied, "how": heap.reason}} if heap else {}
        self.event(EventType.RUN_CREATED, run_id=self.run_id, target=self.layout.kind.value, **said)
        if self.target.base_url:
            # The URL is known before start (launched, attached): check the GPU
            # source now, so a box without NVML exits 3 before a server is started.
            await self._probing.open_gpu_source(self.target.base_url)
        self.event(EventType.TARGET_STARTING, target=self.layout.kind.value)
        # What the server runs, read while it starts (its interpreter asked, its files digested).
        launch_read = self._start_launch_read()
        try:
            await self.target.start()
        finally:
            # What a dead night left behind and this start cleaned (soak.respond.tree.clean_leftovers).
            leftovers = getattr(self.target, "leftovers", None)
            if leftovers:
                self.event(EventType.LEFTOVERS_KILLED, processes=list(leftovers))
        self.event(EventType.TARGET_READY, base_url=self.target.base_url, root_pid=self.target.root_pid,
                   models=list(self.target.models))
        if self.layout.kind is not TargetKind.ATTACHED:
            # The harness started this server and it answered ready: as after a restart
            # (reset before the probes start), a hang began after now (pp_tail_stall
            # dates a tail never seen working from here).
            self.detector.reset(self.clock.now())
        facts = self.facts = await read_target_facts(
            self.layout, base_url=self.target.base_url, models=tuple(self.target.models),
            session=self._probing.session, api_key=self.options.api_key, emit=self.event,
            version_timeout_s=max(self.config.probes.timeout, VERSION_TIMEOUT_S))
        from soak.history.build import build_identity

        self.event(EventType.BUILD, **build_identity(self._redacted_config, vllm_version=facts.reported_version,
                                                     served_model=facts.model,
                                                     launch=await self._launch_read(launch_read)))
        return facts

    def _redact(self, text: str) -> str:
        return self.redactor.text(text) if self.redactor is not None else text

    def _start_launch_read(self) -> tuple[LaunchSpec, asyncio.Future[dict[str, Any]]] | None:
        """Start reading what the server the harness starts runs (soak.target.launch), off the
        event loop and beside its start-up; None for an attached server (its build says the
        rest is unknown). Bounded (the server's interpreter is asked for at most
        ``LAUNCH_TIMEOUT_S``) and total: it never raises."""
        spec = getattr(self.target, "launch_spec", None)
        if not callable(spec):
            return None
        from soak.target.launch import read_launch

        launch = spec()
        return launch, asyncio.ensure_future(asyncio.to_thread(
            read_launch, launch, timeout_s=LAUNCH_TIMEOUT_S, redact=self._redact, with_model=False))

    async def _launch_read(self, started: tuple[LaunchSpec, asyncio.Future[dict[str, Any]]] | None
                           ) -> dict[str, Any] | None:
        """The launch read, with the model's revision read now that the server answered (the HF
        cache's refs name what it downloaded only after it did)."""
        if started is None:
            return None
        from soak.history.build import launch_signature
        from soak.target.launch import with_model_read

        spec, reading = started
        target = self.config.target
        # The model whose revision is read: a launch command's (vllm serve MODEL / --model), else the config's.
        model = (launch_signature(list(spec.command))["model"] if isinstance(target, LaunchedTarget) else None) \
            or target.model or (self.facts.model if self.facts is not None else None)
        return await asyncio.to_thread(with_model_read, await reading, spec, model=model, redact=self._redact)

    async def _run_load(self) -> None:
        config, generator = self.config, self.generator
        assert generator is not None and self.client is not None and self.responder is not None
        self.cycle = IncidentCycle(
            CycleParts(load=generator, client=self.client, responder=self.responder, detector=self.detector,
                       tally=self.tally, on_incident=self.sinks.on_incident,
                       lives=TargetLives(end=self._probing.close_probes, relaunch=self.target.restart,
                                         begin=self._new_life)),
            response=config.response, can_restart=self.layout.kind is not TargetKind.ATTACHED, stop=self.load_stop,
            clock=self.clock, emit=self.event)
        self.live.watch_thresholds(config.thresholds)
        self._watch_task = asyncio.create_task(self._watch(), name="soak-detector")
        # Server counters just before the first request and just after the drain,
        # so summary.json's server-side deltas cover exactly the load applied.
        await self._scrape_metrics()
        self.event(EventType.LOAD_STARTED, mode=config.load.mode, concurrency=config.load.concurrency)
        self.tally.open_load(self.clock.monotonic())  # work is owed from here: no grace hides its absence
        # What the summary judges the requests by, as JSON (config.yaml is for people).
        self.event(EventType.CRITERIA_CONFIG, criteria=config.criteria.model_dump(mode="json"))
        if self.proof is not None:
            self.proof.started()
        self._start_canaries()
        result = await generator.run()
        await self._stop_canaries()
        self.tally.close_load(self.clock.monotonic())
        await self._scrape_metrics()
        self.event(EventType.LOAD_STOPPED, reason=self.load_stop.reason or result.stop_reason,
                   requests_sent=result.requests_sent, aborted_at_drain=result.aborted_at_drain,
                   drain_s=round(result.drained_mono - result.stopped_mono, 3))
        if self.load_stop.reason is None:
            self.load_stop.reason = result.stop_reason

    async def _scrape_metrics(self) -> None:
        await self._probing.scrape_metrics()

    def _start_canaries(self) -> None:
        """The oracle's canaries beside the load (soak.probes.canary), never counted as workload."""
        assert self.facts is not None
        self._fan_in.canaries = self._probing.start_canaries(
            self.config.oracle, workload=self.workload, facts=self.facts, seed=self.config.seed,
            concurrency=self.config.load.concurrency, api_key=self.options.api_key, clock=self.clock)

    async def _stop_canaries(self) -> None:
        facts, oracle = self.facts, self.config.oracle
        header = {"model": facts.model if facts else None, "server_version": facts.reported_version if facts else None,
                  "build": self._redacted_config.get("build"), "tie_margin": oracle.tie_margin}
        clean = self.cycle is None or not self.cycle.incidents
        # An interrupt stops now; a run's own end gives a canary in flight the load's drain.
        grace_s = 0.0 if self.load_stop.interrupted else float(self.config.load.drain)
        await self._probing.stop_canaries(record_to=oracle.record_reference if oracle.enabled else None,
                                          header=header, clean=clean, grace_s=grace_s)

    def _new_life(self) -> int | None:
        """A restarted target: its details flag learned again, its probes on the new root PID."""
        if self._fan_in.cached_reader is not None:
            self._fan_in.cached_reader.restarted()
        assert self.facts is not None
        self._probing.start(self.facts, log_from_start=False)
        return self.target.root_pid

    def observe_wall(self) -> None:
        """A step of the wall clock (soak.clock.wall_step) becomes an event; no figure moves."""
        step = self._wall_watch.observe(raw_wall(self.clock), self.clock.elapsed())
        if step is not None:
            self.event(EventType.WALL_CLOCK_STEP, **step.to_json())

    def _evidence_write_failed(self, exc: BaseException) -> None:
        self.fault(exc, where="writing incident evidence")

    def _cached_tokens_reader(self, facts: TargetFacts) -> Callable[[Mapping[str, Any]], int | None]:
        """How a usage object's cached tokens read on this server (a missing field
        is 0 on vLLM 0.11.x when --enable-prompt-tokens-details is known on)."""
        from soak.versions import CachedTokensReader

        reader = self._fan_in.cached_reader = CachedTokensReader(profile=facts.version_profile,
                                                                 details_enabled=facts.layout.prompt_tokens_details)
        return reader

    async def _watch(self) -> None:
        assert self.cycle is not None
        judge_now, interval = self._fan_in.judge_now, self.config.detector.interval
        while True:
            try:
                await asyncio.wait_for(judge_now.wait(), interval)
            except asyncio.TimeoutError:
                pass
            judge_now.clear()
            self.observe_wall()
            self.live.criteria()
            assessment = self.detector.assess(self.clock.now())
            self.sinks.on_assessment(assessment)
            self.live.thresholds()
            stopping = await self.cycle.respond_all(assessment.new_incidents)
            if self.proof is not None:  # after the response: a hang it recorded counts now
                self.proof.tick(self.clock.now())
            if stopping:
                return

    # -- the end (soak.run.ending) ------------------------------------------------
    async def stop_parts(self) -> None:
        """Every part stopped, each on its own: one that fails (a harness fault)
        never keeps the server running."""

        async def step(what: str, make: Callable[[], Awaitable[object]]) -> None:
            try:
                await make()
            except Exception as exc:
                self._set_fault(exc, f"stopping {what}")

        if self._watch_task is not None:
            await self._let_a_response_finish()
            self._watch_task.cancel()
            await asyncio.gather(self._watch_task, return_exceptions=True)
        await step("the canaries", self._probing.stop_canaries)
        await step("the probes", self._probing.close_probes)
        if self.responder is not None:
            await step("the responder", self.responder.aclose)
        if self.client is not None:
            await step("the client", self.client.aclose)
        await self._probing.close_gpu_source()
        await step("the probe session", self._probing.close_session)
        started = time.monotonic()
        await step("the target", self.target.aclose)
        if self._guardian is not None:
            await step("the guardian", lambda: asyncio.to_thread(self._guardian.close))
        self.event(EventType.TARGET_STOPPED, stop_s=round(time.monotonic() - started, 3))
        if self.responder is not None:
            try:
                released = await self.responder.release_shm()
            except Exception as exc:  # housekeeping never fails a run
                released = {"error": f"{type(exc).__name__}: {exc}"}
            if released:
                self.event(EventType.SHM_RELEASED, **released)

    async def _let_a_response_finish(self) -> None:
        """A response under way finishes and reaches the sinks (bounded like the
        responder's own close): its record belongs in the run."""
        assert self._watch_task is not None
        if self.cycle is None or self.cycle.idle.is_set() or self._watch_task.done():
            return
        cfg = self.config.response
        bound = cfg.evidence.budget + cfg.kill_timeout + cfg.gpu_release_timeout + 10.0
        idle = asyncio.ensure_future(self.cycle.idle.wait())
        await asyncio.wait({idle, self._watch_task}, timeout=bound)
        idle.cancel()

    async def aclose(self) -> None:
        """Idempotent: ends the run's parts if ``run()`` did not get to."""
        if self._closed:
            return
        self._closed = True
        if self.outcome is None:
            await self.stop_parts()
            self.sinks.close()
        if self.report_child is not None:
            await self.report_child.aclose()
