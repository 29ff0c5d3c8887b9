"""``mooncake_trace``: replay of the Mooncake trace format through /v1/completions.

A row is ``{"timestamp": ms, "input_length": tokens, "output_length": tokens,
"hash_ids": [...]}`` with one hash id per ``block_tokens``-token block (512 in
the released traces); rows sharing a leading run of ids share that prefix. Each
hash id becomes a deterministic text block of exactly ``block_tokens`` tokens
(consecutive corpus lines, topped up by a filler line; every piece ends with a
newline so counts add), and a row's last block is cut to the row's remaining
length. Requests that share an id therefore share exactly that block's text,
and the server's prefix cache sees the trace's own reuse.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal, Sequence

from soak.errors import WorkloadError
from soak.workload.jsonl import iter_json_objects
from soak.workload.config import MooncakeTraceConfig
from soak.workload.corpus import Corpus
from soak.workload.plan import Plan, PlannedTurn, cached_whole_blocks, closed_loop_turns, summarize
from soak.workload.types import COMPLETIONS_PATH, Arrival, TurnRequest, json_string_bytes, stream_tail


@dataclass(frozen=True)
class MooncakeRow:
    line: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _int_field(row: dict, key: str, *, path: Path, line: int, minimum: int) -> int:
    value = row.get(key)
    if value is None:
        raise WorkloadError(f"the row has no {key}", path=path, line=line)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise WorkloadError(f"{key} must be an integer >= {minimum}, got {value!r}", path=path, line=line)
    return value


def parse_mooncake_rows(path: str | Path, *, block_tokens: int = 512, limit: int | None = None) -> list[MooncakeRow]:
    """Read and check the rows; a bad one is a ``WorkloadError`` naming its line."""
    path = Path(path)
    rows: list[MooncakeRow] = []
    for number, row in iter_json_objects(path, limit=limit, noun="row"):
        if "hash_ids" not in row:
            raise WorkloadError("the row has no hash_ids", path=path, line=number)
        hash_ids = row["hash_ids"]
        if not isinstance(hash_ids, list) or not hash_ids or not all(
            isinstance(h, int) and not isinstance(h, bool) for h in hash_ids
        ):
            raise WorkloadError("hash_ids must be a non-empty list of integers", path=path, line=number)
        timestamp = row.get("timestamp", 0)
        if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)) or timestamp < 0:
            raise WorkloadError(f"timestamp must be milliseconds >= 0, got {timestamp!r}", path=path, line=number)
        input_length = _int_field(row, "input_length", path=path, line=number, minimum=1)
        output_length = _int_field(row, "output_length", path=path, line=number, minimum=0)
        if len(hash_ids) != math.ceil(input_length / block_tokens):
            raise WorkloadError(
                f"{len(hash_ids)} hash_ids do not cover input_length {input_length} "
                f"in {block_tokens}-token blocks (expected {math.ceil(input_length / block_tokens)})",
                path=path,
                line=number,
            )
        rows.append(MooncakeRow(number, float(timestamp), input_length, output_length, tuple(hash_ids)))
    if not rows:
        raise WorkloadError("the trace has no rows", path=path, line=1)
    return rows


def shared_prefix_tokens(rows: Sequence[MooncakeRow], *, block_tokens: int = 512) -> list[int]:
    """Per row, the tokens of its leading hash ids already seen in earlier rows
    (what an unbounded cache could serve), capped at the row's length."""
    seen: set[int] = set()
    out: list[int] = []
    for row in rows:
        leading = 0
        for h in row.hash_ids:
            if h not in seen:
                break
            leading += 1
        out.append(min(leading * block_tokens, row.input_length))
        seen.update(row.hash_ids)
    return out


def trace_reuse_ratio(rows: Sequence[MooncakeRow], *, block_tokens: int = 512) -> float:
    """The trace's prefix reuse straight from ``hash_ids``: shared tokens / input tokens."""
    shared = shared_prefix_tokens(rows, block_tokens=block_tokens)
    return sum(shared) / sum(r.input_length for r in rows)


def _filler(tokens: int) -> str:
    """A line of exactly ``tokens`` tokens under the simulator's tokenizer ("#", " x"..., newline)."""
    if tokens <= 0:
        return ""
    if tokens == 1:
        return "\n"
    return "#" + " x" * (tokens - 2) + "\n"


class BlockTexts:
    """Hash id -> its text block, exact in tokens under the counter (built at calibration)."""

    def __init__(self, corpus: Corpus, *, seed: int, block_tokens: int) -> None:
        self._lines = [line for f in corpus.files for line in f.lines]
        self._seed = seed
        self.block_tokens = block_tokens
        self._line_tokens: list[int] = []
        self._blocks: dict[tuple[int, int], bytes] = {}
        self.inexact = 0  # blocks whose count could not be made exact (non-additive tokenizers)

    async def prepare(self, counter, needs: Sequence[tuple[int, int]]) -> None:
        count_sync = getattr(counter, "count_text_sync", None)
        if count_sync is not None:
            self._line_tokens = [count_sync(line) for line in self._lines]
        else:  # a remote counter: estimate lines, then check each block
            self._line_tokens = [max(1, round(len(line) / 4)) for line in self._lines]
        # The simulator's tokenizer adds counts across newlines, so its blocks are
        # exact by construction; other tokenizers are checked block by block.
        additive = getattr(counter, "additive", False)
        for key in needs:
            if key in self._blocks:
                continue
            hash_id, tokens = key
            adjust = 0
            text = self._compose(hash_id, tokens)
            if not additive:
                for _ in range(4):
                    actual = count_sync(text) if count_sync is not None else await counter.count_text(text)
                    if actual == tokens:
                        break
                    adjust += tokens - actual
                    text = self._compose(hash_id, tokens, adjust=adjust)
                else:
                    self.inexact += 1
            self._blocks[key] = json_string_bytes(text)

    def _compose(self, hash_id: int, tokens: int, *, adjust: int = 0) -> str:
        rng = random.Random(f"{self._seed}:block:{hash_id}")
        start = rng.randrange(len(self._lines))
        # the full block's lines first, so a cut block is a prefix of the full one
        parts: list[str] = []
        total = 0
        position = start
        budget = self.block_tokens
        limit = min(tokens, budget)
        while True:
            line = self._lines[position % len(self._lines)]
            cost = self._line_tokens[position % len(self._lines)]
            if total + cost > limit - 1:  # keep at least one token for the filler line's newline
                break
            parts.append(line)
            total += cost
            position += 1
        return "".join(parts) + _filler(limit - total + adjust)

    def get(self, hash_id: int, tokens: int) -> bytes:
        return self._blocks[(hash_id, tokens)]

    @property
    def stored_bytes(self) -> int:
        return sum(len(b) for b in self._blocks.values())


class MooncakeWorkload:
    kind = "mooncake_trace"

    def __init__(self, config: MooncakeTraceConfig, *, corpus: Corpus, seed: int, model: str, block_size: int = 256) -> None:
        self.config = config
        self.seed = seed
        self.model = model
        self.block_size = block_size
        self.mode: Literal["sessions", "arrivals"] = "arrivals" if config.replay == "timestamps" else "sessions"
        self.rows = parse_mooncake_rows(config.path, block_tokens=config.block_tokens, limit=config.limit)
        self._shared = shared_prefix_tokens(self.rows, block_tokens=config.block_tokens)
        self._blocks = BlockTexts(corpus, seed=seed, block_tokens=config.block_tokens)
        self._head = b'{"model":' + json.dumps(model).encode() + b',"prompt":"'
        self.counter_label: str | None = None
        self._calibrated = False

    def _row_blocks(self, row: MooncakeRow) -> list[tuple[int, int]]:
        size = self.config.block_tokens
        return [(h, min(size, row.input_length - i * size)) for i, h in enumerate(row.hash_ids)]

    async def calibrate(self, counter) -> None:
        needs = [key for row in self.rows for key in self._row_blocks(row)]
        await self._blocks.prepare(counter, needs)
        self.counter_label = counter.label
        self._calibrated = True

    def request(self, index: int) -> TurnRequest:
        if not self._calibrated:
            raise RuntimeError("calibrate(counter) first")
        row = self.rows[index]
        max_tokens = self.config.max_tokens_override or max(1, row.output_length)
        body = b"".join(
            [self._head, *(self._blocks.get(h, n) for h, n in self._row_blocks(row)), b'"', stream_tail(max_tokens, ignore_eos=self.config.ignore_eos)]
        )
        return TurnRequest(
            session_id=f"mooncake-{row.line}",
            turn=0,
            path=COMPLETIONS_PATH,
            body=body,
            planned_prompt_tokens=row.input_length,
            max_tokens=max_tokens,
            think_time_s=0.0,
            planned_cached_tokens=cached_whole_blocks(self._shared[index], row.input_length, self.block_size),
        )

    def arrivals(self) -> Iterator[Arrival]:
        origin = self.rows[0].timestamp_ms
        for index, row in enumerate(self.rows):
            yield Arrival(offset_s=(row.timestamp_ms - origin) / 1000.0 / self.config.time_scale, request=self.request(index))

    def new_session(self, index: int) -> "_OneRequest | None":
        if index >= len(self.rows):
            return None
        return _OneRequest(self, index)

    def plan(self, *, duration_s: float | None, concurrency: int, block_size: int | None = None) -> Plan:
        block = block_size or self.block_size
        turns_all = [
            PlannedTurn(row.input_length, cached_whole_blocks(shared, row.input_length, block), self.config.max_tokens_override or max(1, row.output_length))
            for row, shared in zip(self.rows, self._shared)
        ]
        service = self.config.service
        notes = [
            f"trace {self.config.path.name}: {len(self.rows):,} rows; reuse from hash_ids {trace_reuse_ratio(self.rows, block_tokens=self.config.block_tokens):.4f}"
        ]
        if self._blocks.inexact:
            notes.append(f"{self._blocks.inexact} blocks are not exactly {self.config.block_tokens} tokens under the counter")
        if self.mode == "arrivals":
            origin = self.rows[0].timestamp_ms
            turns = [
                t
                for t, row in zip(turns_all, self.rows)
                if duration_s is None or (row.timestamp_ms - origin) / 1000.0 / self.config.time_scale < duration_s
            ]
            assumptions = [f"timestamps replayed at time scale {self.config.time_scale:g}", "an unbounded prefix cache"]
        else:
            turns, _ = closed_loop_turns(
                lambda i: [turns_all[i]] if i < len(turns_all) else None,
                concurrency=concurrency,
                duration_s=duration_s if duration_s is not None else float("inf"),
                service=service.time_s,
            )
            assumptions = [
                f"closed loop; prefill {service.prefill_tokens_per_s:g} uncached tokens/s, decode {service.decode_tokens_per_s:g} tokens/s",
                "an unbounded prefix cache",
            ]
        return summarize(
            turns,
            workload=self.kind,
            counter=self.counter_label or "not calibrated",
            duration_s=duration_s,
            concurrency=concurrency,
            block_size=block,
            sessions=len(turns),
            assumptions=assumptions,
            notes=notes,
        )


class _OneRequest:
    def __init__(self, workload: MooncakeWorkload, index: int) -> None:
        self._workload = workload
        self._index = index
        self.session_id = f"mooncake-{workload.rows[index].line}"
        self._done = False

    def next_turn(self) -> TurnRequest | None:
        if self._done:
            return None
        self._done = True
        return self._workload.request(self._index)
