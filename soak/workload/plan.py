"""What a workload will send, stated before load starts (``soak validate`` prints it).

Pure arithmetic over planned turns: prompt tokens per turn, the prefix-cache hit
ratio expected from whole blocks, and the request count over a duration under
stated service-speed assumptions.
"""

from __future__ import annotations

import heapq
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from soak.durations import format_duration


@dataclass(frozen=True)
class PlannedTurn:
    prompt_tokens: int
    cached_tokens: int  # whole blocks the cache should hold when it is sent
    output_tokens: int
    think_time_s: float = 0.0


def cached_whole_blocks(shared_tokens: int, prompt_tokens: int, block_size: int) -> int:
    """Tokens a prefix cache serves: whole blocks of the shared prefix, never the
    last prompt token (vLLM recomputes it for the logits)."""
    if prompt_tokens <= 0:
        return 0
    shared = min(shared_tokens, prompt_tokens - 1)
    return max(0, shared // block_size * block_size)


@dataclass(frozen=True)
class Plan:
    workload: str
    counter: str
    duration_s: float | None
    concurrency: int
    block_size: int
    requests: int
    sessions: int
    prompt_tokens_total: int
    cached_tokens_total: int
    output_tokens_total: int
    prompt_tokens_min: int
    prompt_tokens_median: float
    prompt_tokens_max: int
    hit_ratio: float | None
    sample_turns: tuple[PlannedTurn, ...] = ()  # the first session's turns
    assumptions: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    # The turn that needs the most of the context, prompt + max_tokens (vLLM 0.11
    # refuses a request whose sum passes max_model_len): (prompt, max_tokens).
    largest_request: tuple[int, int] = (0, 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "counter": self.counter,
            "duration_s": self.duration_s,
            "concurrency": self.concurrency,
            "block_size": self.block_size,
            "requests": self.requests,
            "sessions": self.sessions,
            "prompt_tokens": {
                "total": self.prompt_tokens_total,
                "min": self.prompt_tokens_min,
                "median": self.prompt_tokens_median,
                "max": self.prompt_tokens_max,
            },
            "cached_tokens_total": self.cached_tokens_total,
            "output_tokens_total": self.output_tokens_total,
            "hit_ratio": self.hit_ratio,
            "sample_turns": [
                {"prompt_tokens": t.prompt_tokens, "cached_tokens": t.cached_tokens, "max_tokens": t.output_tokens}
                for t in self.sample_turns
            ],
            "assumptions": list(self.assumptions),
            "notes": list(self.notes),
            "largest_request": {"prompt_tokens": self.largest_request[0], "max_tokens": self.largest_request[1]},
        }

    def describe(self) -> str:
        duration = format_duration(self.duration_s) if self.duration_s is not None else "the whole trace"
        lines = [
            f"workload {self.workload}: {self.requests:,} requests in {self.sessions:,} sessions over {duration} "
            f"at concurrency {self.concurrency}",
            f"token counts: {self.counter}",
            f"prompt tokens per turn: min {self.prompt_tokens_min:,}, median {self.prompt_tokens_median:,.0f}, "
            f"max {self.prompt_tokens_max:,}; total {self.prompt_tokens_total:,}",
        ]
        if self.hit_ratio is None:
            lines.append("expected prefix-cache hit ratio: not computed for this workload")
        else:
            lines.append(
                f"expected prefix-cache hit ratio: {self.hit_ratio:.4f} "
                f"({self.cached_tokens_total:,} of {self.prompt_tokens_total:,} tokens in whole {self.block_size}-token blocks)"
            )
        lines.append(f"output tokens (max_tokens): total {self.output_tokens_total:,}")
        if self.sample_turns:
            shown = ", ".join(f"{t.prompt_tokens:,}/{t.cached_tokens:,}" for t in self.sample_turns[:8])
            more = f" ... ({len(self.sample_turns)} turns)" if len(self.sample_turns) > 8 else ""
            lines.append(f"first session, prompt/cached tokens per turn: {shown}{more}")
        lines.extend(f"assumes: {a}" for a in self.assumptions)
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def summarize(
    turns: Sequence[PlannedTurn],
    *,
    workload: str,
    counter: str,
    duration_s: float | None,
    concurrency: int,
    block_size: int,
    sessions: int,
    sample_turns: Sequence[PlannedTurn] = (),
    assumptions: Sequence[str] = (),
    notes: Sequence[str] = (),
    hit_ratio_known: bool = True,
) -> Plan:
    prompts = [t.prompt_tokens for t in turns]
    prompt_total = sum(prompts)
    largest = max(((t.prompt_tokens, t.output_tokens) for t in turns), key=sum, default=(0, 0))
    cached_total = sum(t.cached_tokens for t in turns)
    return Plan(
        workload=workload,
        counter=counter,
        duration_s=duration_s,
        concurrency=concurrency,
        block_size=block_size,
        requests=len(turns),
        sessions=sessions,
        prompt_tokens_total=prompt_total,
        cached_tokens_total=cached_total,
        output_tokens_total=sum(t.output_tokens for t in turns),
        prompt_tokens_min=min(prompts) if prompts else 0,
        prompt_tokens_median=float(statistics.median(prompts)) if prompts else 0.0,
        prompt_tokens_max=max(prompts) if prompts else 0,
        hit_ratio=(cached_total / prompt_total if prompt_total else None) if hit_ratio_known else None,
        sample_turns=tuple(sample_turns),
        assumptions=tuple(assumptions),
        notes=tuple(notes),
        largest_request=largest,
    )


MAX_PLANNED_TURNS = 2_000_000


def closed_loop_turns(
    session_turns: Callable[[int], Sequence[PlannedTurn] | None],
    *,
    concurrency: int,
    duration_s: float,
    service: Callable[[PlannedTurn], float],
) -> tuple[list[PlannedTurn], int]:
    """The turns ``concurrency`` slots send within ``duration_s``, each slot running
    sessions one after another; session indexes go to slots in start order, as
    the load generator hands them out. Returns (turns, sessions started)."""
    turns: list[PlannedTurn] = []
    next_index = 0
    # (time the slot is free, slot, its session's remaining turns)
    heap: list[tuple[float, int, int]] = [(0.0, slot, -1) for slot in range(concurrency)]
    current: dict[int, tuple[Sequence[PlannedTurn], int]] = {}
    while heap and len(turns) < MAX_PLANNED_TURNS:
        now, slot, _ = heapq.heappop(heap)
        session, position = current.get(slot, ((), 0))
        if position >= len(session):
            shape = session_turns(next_index)
            if shape is None:
                continue  # the workload has no more sessions: the slot stops
            next_index += 1
            session, position = shape, 0
            if not session:
                heapq.heappush(heap, (now, slot, 0))
                current[slot] = (session, 0)
                continue
        turn = session[position]
        send_at = now + turn.think_time_s
        if send_at >= duration_s:
            continue  # the slot's last turn would start after the end
        turns.append(turn)
        current[slot] = (session, position + 1)
        heapq.heappush(heap, (send_at + max(service(turn), 1e-6), slot, 0))
    return turns, next_index

