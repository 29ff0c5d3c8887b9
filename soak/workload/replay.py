"""``replay_jsonl``: OpenAI chat or completion requests captured from a real agent.

One JSON object a line: the request itself (``messages`` for chat, ``prompt``
for completions) with optional ``session_id`` and ``timestamp`` beside it, or a
wrapper ``{"session_id", "timestamp", "body": {...}}``. The model is replaced by
the run's, streaming with usage is switched on, ``max_tokens`` is kept (or
overridden). Replayed at the timestamps (divided by ``time_scale``) or closed
loop, one session per ``session_id`` in order of first appearance.

Messages are interned: a session's lines repeat its history, and every repeated
message is held once as bytes.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal

from soak.errors import WorkloadError
from soak.workload.jsonl import iter_json_objects
from soak.workload.config import ReplayJsonlConfig
from soak.workload.distributions import sample
from soak.workload.plan import Plan, PlannedTurn, closed_loop_turns, summarize
from soak.workload.types import CHAT_PATH, COMPLETIONS_PATH, Arrival, TurnRequest

_META_KEYS = ("session_id", "timestamp")
_DROPPED = ("model", "stream", "stream_options", "max_tokens", "max_completion_tokens")


@dataclass(frozen=True)
class ReplayLine:
    line: int
    session_id: str | None
    timestamp: float | None  # seconds from the file's first timestamp, before the time scale
    path: str
    pieces: tuple[bytes, ...]  # the body without its closing keys; messages interned
    max_tokens: int
    request: dict[str, Any] | None  # kept only until calibration has counted it


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def parse_replay_lines(config: ReplayJsonlConfig, *, model: str) -> list[ReplayLine]:
    path = Path(config.path)
    unit = 0.001 if config.timestamp_unit == "ms" else 1.0
    interned: dict[bytes, bytes] = {}
    out: list[ReplayLine] = []
    origin: float | None = None
    for number, obj in iter_json_objects(path, limit=config.limit, noun="line", field="path"):
        inner = obj.get("body", obj.get("request"))
        if inner is not None and not isinstance(inner, dict):
            raise WorkloadError("body must be a JSON object", path=path, line=number)
        request = dict(inner if inner is not None else obj)
        if inner is None:
            for key in _META_KEYS:
                request.pop(key, None)
        session_id = obj.get("session_id")
        if session_id is not None and not isinstance(session_id, (str, int)):
            raise WorkloadError("session_id must be a string", path=path, line=number)
        timestamp = obj.get("timestamp")
        if timestamp is not None and (isinstance(timestamp, bool) or not isinstance(timestamp, (int, float))):
            raise WorkloadError(f"timestamp must be a number, got {timestamp!r}", path=path, line=number)
        if timestamp is None and config.replay == "timestamps":
            raise WorkloadError("no timestamp (replay: timestamps needs one on every line)", path=path, line=number)
        if timestamp is not None:
            origin = timestamp if origin is None else origin
            timestamp = (timestamp - origin) * unit
        max_tokens = config.max_tokens_override or request.get("max_tokens") or request.get("max_completion_tokens") or config.default_max_tokens
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise WorkloadError(f"max_tokens must be a positive integer, got {max_tokens!r}", path=path, line=number)
        for key in _DROPPED:
            request.pop(key, None)
        head = b'{"model":' + _dumps(model) + b',"stream":true,"stream_options":{"include_usage":true}'
        if "messages" in request:
            messages = request.pop("messages")
            if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
                raise WorkloadError("messages must be a non-empty list of objects", path=path, line=number)
            rest = _dumps(request)[1:-1]
            pieces = [head, b"," + rest if rest else b"", b',"messages":[']
            for index, message in enumerate(messages):
                serialized = _dumps(message)
                pieces.append(b"," if index else b"")
                pieces.append(interned.setdefault(serialized, serialized))
            pieces.append(b"]")
            keep = {"messages": messages, "tools": request.get("tools")}
            route = CHAT_PATH
        elif "prompt" in request:
            prompt = request["prompt"]
            if not isinstance(prompt, str):
                raise WorkloadError("prompt must be a string", path=path, line=number)
            serialized = _dumps(request)[1:-1]
            pieces = [head, b",", interned.setdefault(serialized, serialized)]
            keep = {"prompt": prompt}
            route = COMPLETIONS_PATH
        else:
            raise WorkloadError("a request needs messages (chat) or prompt (completions)", path=path, line=number)
        out.append(
            ReplayLine(
                line=number,
                session_id=str(session_id) if session_id is not None else None,
                timestamp=timestamp,
                path=route,
                pieces=tuple(p for p in pieces if p),
                max_tokens=max_tokens,
                request=keep if config.count_tokens else None,
            )
        )
    if not out:
        raise WorkloadError("the file has no requests", path=path, line=1)
    return out


class JsonlReplayWorkload:
    kind = "replay_jsonl"

    def __init__(self, config: ReplayJsonlConfig, *, seed: int, model: str, block_size: int = 256) -> None:
        self.config = config
        self.seed = seed
        self.model = model
        self.block_size = block_size
        self.mode: Literal["sessions", "arrivals"] = "arrivals" if config.replay == "timestamps" else "sessions"
        self.lines = parse_replay_lines(config, model=model)
        self._tokens: list[int | None] = [None] * len(self.lines)
        self.counter_label: str | None = None
        groups: dict[str, list[int]] = {}
        self._sessions: list[tuple[str, list[int]]] = []
        for index, line in enumerate(self.lines):
            if line.session_id is None:
                self._sessions.append((f"line-{line.line}", [index]))
            elif line.session_id in groups:
                groups[line.session_id].append(index)
            else:
                groups[line.session_id] = [index]
                self._sessions.append((line.session_id, groups[line.session_id]))

    async def calibrate(self, counter) -> None:
        self.counter_label = counter.label if self.config.count_tokens else "not counted (count_tokens: false)"
        if not self.config.count_tokens:
            return
        for index, line in enumerate(self.lines):
            request = line.request or {}
            if "prompt" in request:
                self._tokens[index] = await counter.count_text(request["prompt"])
            else:
                self._tokens[index] = await counter.count_chat(request["messages"], request.get("tools"))
        # the parsed requests were only needed for counting; the bytes stay
        self.lines = [
            ReplayLine(l.line, l.session_id, l.timestamp, l.path, l.pieces, l.max_tokens, None) for l in self.lines
        ]

    def request(self, index: int, *, turn: int | None = None, session_id: str | None = None, think_time_s: float = 0.0) -> TurnRequest:
        line = self.lines[index]
        body = b"".join(line.pieces) + b',"max_tokens":%d}' % line.max_tokens
        return TurnRequest(
            session_id=session_id if session_id is not None else line.session_id,
            turn=turn,
            path=line.path,
            body=body,
            planned_prompt_tokens=self._tokens[index],
            max_tokens=line.max_tokens,
            think_time_s=think_time_s,
        )

    def arrivals(self) -> Iterator[Arrival]:
        for index, line in enumerate(self.lines):
            yield Arrival(offset_s=(line.timestamp or 0.0) / self.config.time_scale, request=self.request(index))

    def new_session(self, index: int) -> "_ReplaySession | None":
        if index >= len(self._sessions):
            return None
        session_id, indexes = self._sessions[index]
        return _ReplaySession(self, session_id, indexes, random.Random(f"{self.seed}:replay:{index}"))

    def plan(self, *, duration_s: float | None, concurrency: int, block_size: int | None = None) -> Plan:
        turns_all = [PlannedTurn(t or 0, 0, line.max_tokens) for t, line in zip(self._tokens, self.lines)]
        service = self.config.service
        if self.mode == "arrivals":
            turns = [
                t
                for t, line in zip(turns_all, self.lines)
                if duration_s is None or (line.timestamp or 0.0) / self.config.time_scale < duration_s
            ]
            sessions = len({line.session_id or f"line-{line.line}" for line in self.lines[: len(turns)]})
            assumptions = [f"timestamps replayed at time scale {self.config.time_scale:g}"]
        else:
            turns, sessions = closed_loop_turns(
                lambda i: [turns_all[j] for j in self._sessions[i][1]] if i < len(self._sessions) else None,
                concurrency=concurrency,
                duration_s=duration_s if duration_s is not None else float("inf"),
                service=service.time_s,
            )
            assumptions = [
                f"closed loop; prefill {service.prefill_tokens_per_s:g} tokens/s, decode {service.decode_tokens_per_s:g} tokens/s"
            ]
        return summarize(
            turns,
            workload=self.kind,
            counter=self.counter_label or "not calibrated",
            duration_s=duration_s,
            concurrency=concurrency,
            block_size=block_size or self.block_size,
            sessions=sessions,
            assumptions=assumptions,
            notes=[f"{len(self.lines):,} requests in {self.config.path.name}; the hit ratio depends on the captured text"],
            hit_ratio_known=False,
        )


class _ReplaySession:
    def __init__(self, workload: JsonlReplayWorkload, session_id: str, indexes: list[int], rng: random.Random) -> None:
        self._workload = workload
        self.session_id = session_id
        self._indexes = indexes
        self._rng = rng
        self._position = 0

    def next_turn(self) -> TurnRequest | None:
        if self._position >= len(self._indexes):
            return None
        think = 0.0 if self._position == 0 else sample(self._workload.config.think_time_s, self._rng)
        request = self._workload.request(
            self._indexes[self._position], turn=self._position, session_id=self.session_id, think_time_s=think
        )
        self._position += 1
        return request
