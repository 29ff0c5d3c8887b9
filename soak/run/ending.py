"""The end of a run and its outcome.

Order, whatever ended the run (duration, request cap, incident, Ctrl-C/SIGTERM,
an error): the parts stopped, then what the run knew at its end (an ``Ending``)
goes to the judge once (``soak.judge.entry.conclude``): it reads the run directory
once, decides the verdict and the exit code, has ``run_ended`` written, and
gives summary.json, which is written here, pushed (Pushgateway) and rendered by
the report child from that file (the child judges nothing again). The sinks
close last, after the redactor's final pass.

These functions take the run whose end they are (``EndingRun``: the parts of a
``soak.run.loop.SoakRun`` the end reads): its live facts (``load_stop``: the
stop reason and the interrupt; ``faults``: the harness's first fault; ``cycle``:
incidents and restarts; ``live``: an abort_on_fail breach) and its parts (sinks,
store, clock, config, the report options and child).
"""

from __future__ import annotations

import asyncio
import sys
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

from soak.criteria.constraints import judge as judge_criteria
from soak.errors import EnvironmentProblem, UsageError
from soak.events import EventType
from soak.judge import Ending, Problem, conclude, outcome_of
from soak.records import Verdict

if TYPE_CHECKING:
    from soak.clock import RunClock
    from soak.config import RunConfig
    from soak.criteria.rules import RequestTally
    from soak.redact import Redactor
    from soak.report.child import ReportChild
    from soak.run.faults import Faults
    from soak.run.incidents import IncidentCycle
    from soak.run.live_judge import LiveJudge
    from soak.run.sinks import FanOut
    from soak.run.stopping import LoadStop
    from soak.store.store import RunStore

HARNESS_ERROR = "harness_error.txt"


@dataclass(frozen=True)
class RunOutcome:
    exit_code: int
    verdict: Verdict
    reason: str
    summary: Mapping[str, Any]


@dataclass(frozen=True)
class ReportOptions:
    """The report rendered at the end, in a child process (``soak.report.child``)."""

    command: Sequence[str] | None = None  # None: ``python -m soak report``
    timeout_s: float | None = None  # None: the child's default
    html: bool = True  # False: summary.json and junit.xml only (``soak run --no-html``)


class EndingRun(Protocol):
    """What the end reads and calls of the run (``soak.run.loop.SoakRun`` is one)."""

    config: RunConfig
    run_dir: Path
    clock: RunClock
    store: RunStore
    sinks: FanOut
    redactor: Redactor | None
    tally: RequestTally
    load_stop: LoadStop
    faults: Faults
    cycle: IncidentCycle | None
    live: LiveJudge
    options: Any  # soak.run.loop.RunOptions: its ``report``
    report_child: ReportChild | None
    outcome: RunOutcome | None

    async def stop_parts(self) -> None: ...
    def observe_wall(self) -> None: ...
    def event(self, type: str, **fields: Any) -> None: ...
    def fault(self, exc: BaseException, *, where: str) -> None: ...


async def finish(run: EndingRun, problem: BaseException | None) -> RunOutcome:
    """The run's end, once: a second call returns the first outcome."""
    if run.outcome is not None:
        return run.outcome
    report = run.report_child or await start_report(run.options.report, run.run_dir)
    try:
        return await _end(run, problem, report)
    finally:
        if report is not None:
            await report.aclose()


def ending_of(run: EndingRun, problem: BaseException | None) -> Ending:
    """What the run knew at its end that no file holds yet."""
    fault = run.faults.exc
    if isinstance(problem, EnvironmentProblem):
        kind: Problem | None = Problem.ENVIRONMENT
    elif isinstance(problem, UsageError):
        kind = Problem.USAGE
    else:
        kind = None
        if fault is None and problem is not None:
            fault = problem
    breach = run.live.breach
    return Ending.live(
        problem=kind, interrupted=run.load_stop.interrupted,
        harness_fault=f"while {run.faults.where}: {type(fault).__name__}: {fault}" if fault is not None else None,
        failed_live=run.cycle is not None and run.cycle.failed, stop_reason=run.load_stop.reason,
        # Load the harness itself cut short (Ctrl-C, its own fault) owes no work it had no time for.
        load_cut_short=run.load_stop.interrupted or fault is not None or problem is not None,
        incidents_seen=run.cycle.incidents if run.cycle is not None else 0,
        restarts=run.cycle.restarts if run.cycle is not None else 0,
        threshold_aborted=breach.name if breach is not None else None)


async def _end(run: EndingRun, problem: BaseException | None, report: ReportChild | None) -> RunOutcome:
    await run.stop_parts()
    ending = ending_of(run, problem)
    if run.faults.exc is not None:
        save_traceback(run)
    run.observe_wall()
    written: dict[str, Any] = {}

    def record_end(fields: dict[str, Any]) -> Mapping[str, Any]:
        ts = run.clock.now()
        run.event(EventType.RUN_ENDED, ts=ts, **fields)
        written.update({"ts": ts, "type": EventType.RUN_ENDED.value, "mono": run.store.mono(ts), **fields})
        return written

    try:
        judgement, summary = conclude(run.run_dir, ending, record_end=record_end)
        exit_code, verdict, reason = judgement.exit_code, judgement.end_verdict, judgement.stop_reason
    except Exception as exc:  # a record the judge cannot read still ends the run in order
        run.fault(exc, where="summarizing the run")
        if not written:
            record_end(_unjudged_end(run, ending, exc))
        exit_code, verdict, reason = written["exit_code"], Verdict(written["verdict"]), written["reason"]
        summary = {"verdict": verdict.value, "stop_reason": reason}
    assert exit_code is not None and reason is not None  # a live ending always has both
    try:
        run.store.write_summary(summary)
    except OSError as exc:
        run.fault(exc, where="writing summary.json")
        if exit_code in (0, 130):
            exit_code, verdict = 4, Verdict.ABORTED
    await push(run, summary, exit_code=exit_code)
    if report is not None:
        await render(run, report)
    run.sinks.close()
    if run.redactor is not None:
        try:
            # The last pass: nothing the run wrote keeps a known secret.
            await asyncio.to_thread(run.redactor.scrub_tree, run.run_dir)
        except OSError:
            pass
    run.outcome = RunOutcome(exit_code=exit_code, verdict=verdict, reason=reason, summary=summary)
    return run.outcome


def _unjudged_end(run: EndingRun, ending: Ending, exc: BaseException) -> dict[str, Any]:
    """run_ended's fields when the run directory could not be judged: a harness
    fault, laddered on what the run saw live (its own tally of the requests)."""
    fault = f"while summarizing the run: {type(exc).__name__}: {exc}"
    ending = replace(ending, harness_fault=ending.harness_fault or fault)
    tally = run.tally
    tally.cut_short = ending.load_cut_short
    criteria = judge_criteria(run.config.criteria, tally, final=True)
    failed = ending.failed_live or ending.incidents_seen > 0 or not criteria.passed
    exit_code, verdict = outcome_of(problem=ending.problem, failed=failed,
                                    breached=ending.threshold_aborted is not None, fault=True,
                                    interrupted=ending.interrupted)
    return {"verdict": verdict.value, "reason": f"{ending.stop_reason or 'finished'}; harness fault {fault}",
            "exit_code": exit_code, "load_cut_short": ending.load_cut_short, "incidents": ending.incidents_seen,
            "restarts": ending.restarts, "criteria_failed": [r.name for r in criteria.failed],
            **ending.run_ended_fields()}


def fault_line(run: EndingRun) -> str:
    exc = run.faults.exc
    what = f"{type(exc).__name__}: {exc}" if exc is not None else "unknown"
    where = f" while {run.faults.where}" if run.faults.where else ""
    saved = run.run_dir / HARNESS_ERROR
    tail = f"; traceback in {saved}" if saved.exists() else ""
    return f"harness fault{where}: {what}; the server was stopped{tail}"


def save_traceback(run: EndingRun) -> None:
    exc = run.faults.exc
    if exc is None:
        return
    text = run.faults.traceback or "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    header = f"soak harness fault while {run.faults.where}: {type(exc).__name__}: {exc}\n\n"
    try:
        run.store.write_text(HARNESS_ERROR, header + text)
    except OSError:
        pass  # not writable: the one line on stderr is all there is


async def push(run: EndingRun, summary: Mapping[str, Any], *, exit_code: int) -> None:
    config = run.config.pushgateway
    if config.url is None:
        return
    from soak.report.push import push_run

    try:
        pushed = await asyncio.to_thread(push_run, config, summary, exit_code=exit_code, run_dir=run.run_dir)
    except Exception as exc:  # the night is recorded; a missed push is said, not fatal
        run.event(EventType.PUSH_FAILED, url=config.url, error=f"{type(exc).__name__}: {exc}")
        print(f"soak run: push to {config.url} failed: {exc}", file=sys.stderr)
        return
    run.event(EventType.PUSHED, url=config.url, **pushed)


async def start_report(options: ReportOptions | None, run_dir: Path) -> ReportChild | None:
    """The report's child process, started (it imports its renderer while the run goes on)."""
    if options is None:
        return None
    from soak.report.child import DEFAULT_TIMEOUT_S, ReportChild

    child = ReportChild(run_dir, command=options.command, timeout_s=options.timeout_s or DEFAULT_TIMEOUT_S,
                        html=options.html)
    await child.start()
    return child


async def render(run: EndingRun, child: ReportChild) -> None:
    """Render in the child, from the summary.json just written; whatever happens
    there, the run's exit status stays the run's (the record is complete; `soak
    report DIR` can render again)."""
    outcome = await child.render()
    if outcome.ok:
        files = ["junit.xml", "report.html"] if run.options.report is None or run.options.report.html else ["junit.xml"]
        run.event(EventType.REPORT_WRITTEN, elapsed_s=round(outcome.elapsed_s, 3), files=files)
    else:
        run.event(EventType.REPORT_FAILED, error=outcome.error, returncode=outcome.returncode,
                  elapsed_s=round(outcome.elapsed_s, 3))


__all__ = ["HARNESS_ERROR", "ReportOptions", "RunOutcome", "ending_of", "fault_line", "finish", "render",
           "save_traceback", "start_report"]
