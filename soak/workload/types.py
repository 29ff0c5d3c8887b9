"""What a workload hands the load generator: requests, arrivals, sessions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Literal, Protocol

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


@dataclass(frozen=True)
class TurnRequest:
    session_id: str | None
    turn: int | None
    path: str  # CHAT_PATH or COMPLETIONS_PATH
    body: bytes  # JSON with stream=true, stream_options.include_usage=true, max_tokens
    planned_prompt_tokens: int | None
    max_tokens: int
    think_time_s: float  # wait before sending this turn
    # What the plan expects the prefix cache to hold of this prompt (whole blocks).
    planned_cached_tokens: int | None = None


@dataclass(frozen=True)
class Arrival:
    offset_s: float  # from the start of the replay, already divided by the time scale
    request: TurnRequest


class Session(Protocol):
    session_id: str

    def next_turn(self) -> TurnRequest | None: ...


class Workload(Protocol):
    mode: Literal["sessions", "arrivals"]
    kind: str

    async def calibrate(self, counter) -> None: ...

    def plan(self, *, duration_s: float, concurrency: int, block_size: int = 256): ...

    def new_session(self, index: int) -> Session | None: ...

    def arrivals(self) -> Iterator[Arrival]: ...


def json_string_bytes(text: str) -> bytes:
    """``text`` as the inside of a JSON string literal (no quotes), UTF-8."""
    import json

    return json.dumps(text, ensure_ascii=False)[1:-1].encode("utf-8")


def stream_tail(max_tokens: int, *, ignore_eos: bool) -> bytes:
    """The closing keys every body ends with."""
    extra = ',"ignore_eos":true' if ignore_eos else ""
    return b',"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}%s}' % (max_tokens, extra.encode())
