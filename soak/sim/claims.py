"""Faults of what the server claims and says, not of whether it answers.

Each is a hostile server a soak must not pass: the answers come back 200, on
time, and something in them is false.

- ``corrupt_output``: sampled tokens misaligned between the requests of a batch
  (``soak.sim.greedy.Misalignment``), on every answer or on long prompts only,
  or one answer in N; ``corrupt_then_deadlock``: the same, then the seed's pp
  deadlock ``deadlock_after`` simulated seconds later.
- ``lying_usage``: usage claims ``factor`` times the completion tokens streamed;
  /metrics counts what was generated.
- ``other_model``: every answer and chunk names another model; /v1/models does not.
- ``replay``: every answer is the same cached bytes (the first answer after the
  onset, per endpoint and streaming mode); the engine does no work for them, so
  the server's counters barely move.
- ``collapse``: every engine step ``factor`` times slower (the work rate falls).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from soak.sim.config import (
    CollapseFault,
    CorruptOutputFault,
    CorruptThenDeadlockFault,
    LyingUsageFault,
    OtherModelFault,
    ReplayFault,
)
from soak.sim.greedy import Misalignment

if TYPE_CHECKING:
    from soak.sim.faults import FaultController

OUTPUT_FAULTS = (CorruptOutputFault, LyingUsageFault, OtherModelFault, ReplayFault, CollapseFault)


@dataclass
class ClaimState:
    """What the API layer reads as it answers (the faults set it)."""

    usage_factor: float = 1.0
    model: str | None = None  # the model name answers carry (None: the one asked)
    replay: bool = False
    # (chat form, streamed) -> the bytes every later answer repeats
    cache: dict[tuple[bool, bool], bytes] = field(default_factory=dict)

    def completion_claim(self, tokens: int) -> int:
        return tokens if self.usage_factor == 1.0 else int(round(tokens * self.usage_factor))

    def shown_model(self, model: str) -> str:
        return self.model if self.model is not None else model

    def replayed(self, chat_form: bool, streamed: bool) -> bytes | None:
        return self.cache.get((chat_form, streamed)) if self.replay else None

    def recording(self, chat_form: bool, streamed: bool) -> bool:
        return self.replay and (chat_form, streamed) not in self.cache

    def record(self, chat_form: bool, streamed: bool, data: bytes) -> None:
        if self.replay:
            self.cache.setdefault((chat_form, streamed), data)


def fire(controller: "FaultController", armed: Any, spec: Any) -> None:
    """Start one of ``OUTPUT_FAULTS`` (``armed``: its ``soak.sim.faults._Armed``)."""
    server = controller.server
    claims = server.claims
    if isinstance(spec, CorruptOutputFault):
        server.engine.misalign = Misalignment(long_only=spec.scope == "long", long_tokens=spec.long_tokens,
                                              one_in=spec.one_in, seed=server.config.seed)
        if isinstance(spec, CorruptThenDeadlockFault):
            controller.spawn(_deadlock_later(controller, spec))
        if spec.duration is not None:
            controller.spawn(_end_after(controller, armed, spec.duration, _realign))
    elif isinstance(spec, LyingUsageFault):
        claims.usage_factor = spec.factor
    elif isinstance(spec, OtherModelFault):
        claims.model = spec.model
    elif isinstance(spec, ReplayFault):
        claims.replay = True
    elif isinstance(spec, CollapseFault):
        server.engine.slowdown = spec.factor
        if spec.duration is not None:
            controller.spawn(_end_after(controller, armed, spec.duration, _recover))


def _realign(server) -> None:
    server.engine.misalign = None


def _recover(server) -> None:
    server.engine.slowdown = 1.0


async def _end_after(controller: "FaultController", armed: Any, seconds: float, undo) -> None:
    await controller.server.sleep_sim(seconds)
    undo(controller.server)
    controller.finish(armed)


async def _deadlock_later(controller: "FaultController", spec: CorruptThenDeadlockFault) -> None:
    server = controller.server
    await server.sleep_sim(spec.deadlock_after)
    await server.stepping.wait()  # a deadlock happens inside a forward pass
    controller.fire_spec(spec.deadlock.model_copy(update={"at": None, "after_requests": None, "mtbf": None,
                                                          "wall_mtbf": None}))
