"""The incident cycle: a decision of the detector becomes a response (the load
paused, the requests in flight cut, evidence, the kill), then either the end of
the load or a restart of the target and the load resumed on the new life.

``IncidentCycle`` is handed every part it acts on (``CycleParts``) and the run's
``LoadStop`` (``soak.run.stopping``); it reaches into nothing else. What happens after a response is a
pure decision (``after_response``) on the restart policy's answer
(``soak.respond.policy.next_action``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable, Protocol

from soak.clock import Clock
from soak.criteria.rules import RequestTally
from soak.errors import SoakError, TargetNotReady
from soak.events import Emit, EventType
from soak.records import Decision, IncidentKind, IncidentRecord
from soak.respond.config import ResponseConfig
from soak.respond.corruption import CorruptionStep, corruption_action
from soak.respond.policy import Action, NextAction, next_action
from soak.run.stopping import Load, LoadStop
from soak.samples import CutCause



class Cutter(Protocol):
    def abort_in_flight(self, reason: str, *, cut_by: CutCause) -> int: ...


class Handler(Protocol):
    async def handle(self, decision: Decision, number: int) -> IncidentRecord: ...


class Resettable(Protocol):
    def reset(self, now: float) -> None: ...
    def resume_after_corruption(self, now: float) -> None: ...


@dataclass(frozen=True)
class TargetLives:
    """How the cycle ends the target's life and begins the next."""

    end: Callable[[], Awaitable[None]]  # the probes of the old life closed
    relaunch: Callable[[], Awaitable[None]]  # the target restarted (raises what Target.restart raises)
    begin: Callable[[], int | None]  # the probes on the new life; its root PID


@dataclass(frozen=True)
class CycleParts:
    """What an incident acts on: the run's live parts."""

    load: Load
    client: Cutter
    responder: Handler
    detector: Resettable
    tally: RequestTally
    lives: TargetLives
    on_incident: Callable[[IncidentRecord], None]  # the record, to the sinks


def after_response(action: NextAction, *, interrupted: bool, stopping: bool) -> Action:
    """Restart only when the policy says so and nothing else is ending the load."""
    if action.action is Action.RESTART and not interrupted and not stopping:
        return Action.RESTART
    return Action.STOP


class IncidentCycle:
    def __init__(self, parts: CycleParts, *, response: ResponseConfig, can_restart: bool, stop: LoadStop,
                 clock: Clock, emit: Emit) -> None:
        self._parts = parts
        self._response = response
        self._can_restart = can_restart
        self._stop = stop
        self._clock = clock
        self._emit = emit
        self.incidents = 0
        self.restarts = 0
        self.failed = False  # an incident, or its handling failed: the run fails
        # A relaunch under way (on_hang: restart), so Ctrl-C need not wait for it.
        self._restart_task: asyncio.Task[None] | None = None
        self.idle = asyncio.Event()
        self.idle.set()

    async def respond_all(self, decisions: Iterable[Decision]) -> bool:
        """Respond to each new decision in turn; True once the load is stopping."""
        for decision in decisions:
            try:
                self.idle.clear()
                try:
                    await self._respond(decision)
                finally:
                    self.idle.set()
            except Exception as exc:  # the response failed: record it, end the soak as failed
                self._emit(EventType.INCIDENT_ERROR, error=f"{type(exc).__name__}: {exc}")
                self.failed = True
                self._stop.stop(f"incident handling failed: {exc}")
            if self._parts.load.stopping:
                return True
        return False

    def cancel_restart(self) -> None:
        """Waiting for a relaunched server (minutes for a large model) is not
        stopping now; the end stops whatever it had started."""
        if self._restart_task is not None:
            self._restart_task.cancel()

    async def _respond(self, decision: Decision) -> None:
        if decision.kind is IncidentKind.CORRUPTION:
            await self._respond_to_corruption(decision)
            return
        parts = self._parts
        self.incidents += 1
        self.failed = True
        number = self.incidents
        parts.load.pause()
        paused = self._clock.monotonic()  # work is not owed while the target is down (soak.criteria)
        cut = parts.client.abort_in_flight(f"incident {number}", cut_by=CutCause.INCIDENT)
        self._emit(EventType.INCIDENT_STARTED, number=number, rule=decision.rule, kind=decision.kind.value,
                   aborted_requests=cut)
        parts.on_incident(await parts.responder.handle(decision, number))
        action = next_action(self._response, restarts_done=self.restarts, can_restart=self._can_restart)
        if after_response(action, interrupted=self._stop.interrupted, stopping=parts.load.stopping) is Action.STOP:
            self._stop.stop(f"incident {number}: {action.reason}")
            return
        await self._restart(number, action.reason, paused)

    async def _respond_to_corruption(self, decision: Decision) -> None:
        """A corrupting server still answers: its evidence is captured while the load
        runs (what the batch was doing), nothing is killed, then on_corruption decides
        (soak.respond.corruption): stop ends the run as its end does, restart
        relaunches a launched target, continue keeps soaking."""
        parts = self._parts
        self.incidents += 1
        self.failed = True
        number = self.incidents
        action = corruption_action(self._response, restarts_done=self.restarts, can_restart=self._can_restart)
        self._emit(EventType.INCIDENT_STARTED, number=number, rule=decision.rule, kind=decision.kind.value,
                   aborted_requests=0, response=action.action.value)
        parts.on_incident(await parts.responder.handle(decision, number))
        if action.action is CorruptionStep.CONTINUE and not self._stop.interrupted and not parts.load.stopping:
            now = self._clock.now()
            parts.detector.resume_after_corruption(now)  # the corruption rule's memory only
            return
        if action.action is not CorruptionStep.RESTART or self._stop.interrupted or parts.load.stopping:
            self._stop.stop(f"incident {number}: {action.reason}")
            return
        parts.load.pause()
        paused = self._clock.monotonic()
        parts.client.abort_in_flight(f"incident {number}", cut_by=CutCause.INCIDENT)
        await self._restart(number, action.reason, paused)

    async def _restart(self, number: int, reason: str, paused: float) -> None:
        parts = self._parts
        self._emit(EventType.RESTART_STARTED, number=number, reason=reason)
        if not await self._relaunch(number):
            return
        self.restarts += 1
        parts.detector.reset(self._clock.now())
        root_pid = parts.lives.begin()
        self._emit(EventType.RESTART_DONE, number=number, restarts=self.restarts, root_pid=root_pid)
        parts.tally.restart(paused, self._clock.monotonic())  # a new server life: its own start-up allowance
        parts.load.resume()

    async def _relaunch(self, number: int) -> bool:
        try:
            await self._parts.lives.end()
            self._restart_task = asyncio.ensure_future(self._parts.lives.relaunch())
            await self._restart_task
        except asyncio.CancelledError:
            if not self._stop.interrupted:
                raise
            self._emit(EventType.RESTART_CANCELLED, number=number, reason=self._stop.reason)
            return False
        except (TargetNotReady, SoakError) as exc:
            self._emit(EventType.RESTART_FAILED, number=number, error=str(exc))
            self._stop.stop(f"incident {number}: restart failed: {exc}")
            return False
        finally:
            self._restart_task = None
        return True
