"""``synthetic_agentic``: agent sessions whose context grows turn by turn.

Every session's prompt is, in order: the shared prefix (tool schemas and the
system prompt, common to all sessions), the repository the agent reads (a user
message of corpus chunks; the first chunk is the session's own, so sessions
share nothing past the shared prefix), then per turn an assistant tool call and
its tool result. When the next turn would pass ``max_context_tokens`` the
session ends and the slot starts the next session.

Sizes are exact under the counter without tokenizing whole prompts: every piece
of text ends with a newline (so counts add up under the simulator's tokenizer,
and nearly always under real ones), each segment is counted once at calibration,
and a prompt's count is the sum of its segments'. Calibration checks that sum
against a whole-prompt count of the first session's first turns.

Memory: a conversation is a list of shared, pre-serialized JSON pieces (bytes);
a turn's body is one ``b"".join`` of its prefix pieces plus the new turn's.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any, Iterator, Literal, Sequence

from soak.errors import WorkloadError
from soak.workload.config import SyntheticAgenticConfig, dist_bounds
from soak.workload.corpus import Corpus
from soak.workload.distributions import sample, sample_int
from soak.workload.plan import Plan, PlannedTurn, cached_whole_blocks, closed_loop_turns, summarize
from soak.workload.types import CHAT_PATH, Arrival, TurnRequest, json_string_bytes, stream_tail

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "file or directory, relative to the repository root"},
                    "reason": {"type": "string", "description": "why the agent calls this tool now"},
                    **extra,
                },
                "required": ["path"],
            },
        },
    }
    for name, description, extra in (
        ("read_file", "Read a file of the repository and return its text.", {"start_line": {"type": "integer"}, "end_line": {"type": "integer"}}),
        ("grep", "Search the repository for a regular expression.", {"pattern": {"type": "string"}}),
        ("list_dir", "List the entries of a directory.", {}),
        ("run_tests", "Run the test suite for a path and return the output.", {"filter": {"type": "string"}}),
        ("apply_patch", "Apply a unified diff to the working tree.", {"patch": {"type": "string"}}),
    )
]
SYSTEM_HEAD = (
    "You are a coding agent working in a software repository. Use the tools to read files,\n"
    "search, run tests and apply patches. Think before each call, keep changes small,\n"
    "and explain what you changed. The project's coding guidelines follow.\n"
)
INTRO = "Here is the repository you are working in, file by file.\n"
RESULT_HEAD = "Tool output:\n"
_REF_BASE = [{"role": "user", "content": "ping\n"}]


@dataclass(frozen=True)
class _SessionShape:
    index: int
    chunk_ids: tuple[int, ...]
    # per turn: (tool call id, tool result id) or None for turn 0, prompt, shared prefix, output, think
    steps: tuple[tuple[tuple[int, int] | None, int, int, int, float], ...]


class SyntheticAgenticWorkload:
    mode: Literal["sessions", "arrivals"] = "sessions"
    kind = "synthetic_agentic"

    def __init__(
        self, config: SyntheticAgenticConfig, *, corpus: Corpus, seed: int, model: str, block_size: int = 256, config_path=None
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.corpus = corpus
        self.seed = seed
        self.model = model
        self.block_size = block_size
        self.counter_label: str | None = None
        self.notes: list[str] = []
        self._calibrated = False

    # ------------------------------------------------------------------ calibration
    async def calibrate(self, counter) -> None:
        """Build and count every shared segment once."""
        cfg = self.config
        rng = random.Random(f"{self.seed}:calibrate")
        lines = _LineWalker(self.corpus, rng)
        sample_text = "".join(lines.take_chars(40_000))
        self._chars_per_token = max(1.0, len(sample_text) / max(1, await counter.count_text(sample_text)))

        # shared prefix: tool schemas + a system prompt filled with corpus text. The
        # schemas are counted under a system message: a real server's template may
        # refuse an empty conversation (vLLM with transformers 5 answers HTTP 400).
        tools = self._tools
        tools_tokens = await counter.count_chat(
            [{"role": "system", "content": SYSTEM_HEAD}], tools, add_generation_prompt=False
        )
        system_text = SYSTEM_HEAD + "".join(
            lines.take_chars(max(0, int((cfg.shared_prefix_tokens - tools_tokens) * self._chars_per_token)))
        )
        self._system = {"role": "system", "content": system_text}
        self.shared_tokens = await counter.count_chat([self._system], tools, add_generation_prompt=False)
        self._first_base = await counter.count_chat([self._system, {"role": "user", "content": INTRO}], tools)

        # the chunks sessions read as their repository
        self._chunks: list[bytes] = []
        self._chunk_tokens: list[int] = []
        chunk_chars = int(cfg.context_chunk_tokens * self._chars_per_token)
        for number in range(cfg.context_chunks):
            name, body = lines.take_file_part(chunk_chars)
            text = f"=== {name} (part {number}) ===\n" + "".join(body)
            self._chunks.append(json_string_bytes(text))
            self._chunk_tokens.append(await counter.count_text(text))

        # tool calls: an assistant message with one call and the matching tool message's head
        self._calls: list[bytes] = []
        self._tool_heads: list[bytes] = []
        self._call_tokens: list[int] = []
        ref_tokens = await counter.count_chat(_REF_BASE)
        self._gen_suffix = ref_tokens - await counter.count_chat(_REF_BASE, add_generation_prompt=False)
        for number in range(64):
            size = sample_int(cfg.tool_call_tokens, rng, minimum=1)
            tool = TOOLS[number % len(TOOLS)]["function"]["name"]
            name, _ = lines.take_file_part(0)
            reason = "".join(lines.take_chars(int(size * self._chars_per_token))).strip()
            call_id = f"call_{number:05d}"
            assistant = {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": tool, "arguments": json.dumps({"path": name, "reason": reason})}}
                ],
            }
            tool_msg = {"role": "tool", "tool_call_id": call_id, "content": RESULT_HEAD}
            self._calls.append(json.dumps(assistant, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
            self._tool_heads.append(
                b'{"role":"tool","tool_call_id":"%s","content":"%s' % (call_id.encode(), json_string_bytes(RESULT_HEAD))
            )
            self._call_tokens.append(await counter.count_chat(_REF_BASE + [assistant, tool_msg]) - ref_tokens)

        # tool results
        self._results: list[bytes] = []
        self._result_tokens: list[int] = []
        for _ in range(cfg.tool_result_pool):
            size = sample_int(cfg.tool_result_tokens, rng, minimum=1)
            _, body = lines.take_file_part(int(size * self._chars_per_token))
            text = "".join(body)
            self._results.append(json_string_bytes(text))
            self._result_tokens.append(await counter.count_text(text))

        self._head = (
            b'{"model":' + json.dumps(self.model).encode() + _tools_keys(tools, cfg.tool_choice)
            + b',"messages":[' + json.dumps(self._system, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        )
        self._user_head = b',{"role":"user","content":"' + json_string_bytes(INTRO)
        largest_start = dist_bounds(cfg.start_context_tokens)[1]
        if self._first_base + sum(self._chunk_tokens) < largest_start:
            raise WorkloadError(
                f"{cfg.context_chunks} chunks of about {cfg.context_chunk_tokens} tokens cannot fill a "
                f"{largest_start:.0f}-token start context; raise context_chunks",
                field="workload.context_chunks",
                path=self.config_path,
            )
        self._perm = list(range(cfg.context_chunks))
        random.Random(f"{self.seed}:chunks").shuffle(self._perm)
        self._calibrated = True
        self.counter_label = counter.label

        # the sum of segments must equal a whole-prompt count
        session = self.new_session(0)
        checked = 0
        for _ in range(3):
            turn = session.next_turn() if session else None
            if turn is None:
                break
            body = json.loads(turn.body)
            actual = await counter.count_chat(body["messages"], body.get("tools"))
            if actual != turn.planned_prompt_tokens:
                self.notes.append(
                    f"segment sums differ from whole-prompt counts by {actual - turn.planned_prompt_tokens:+d} tokens "
                    f"(session 0 turn {turn.turn}); per-turn figures are off by about that much"
                )
                break
            checked += 1
        if checked and not self.notes:
            self.notes.append(f"segment sums checked against whole-prompt counts on {checked} turns: equal")

    @property
    def _tools(self) -> list[dict[str, Any]] | None:
        return None if self.config.tool_choice == "no_tools" else TOOLS

    def _need_calibration(self) -> None:
        if not self._calibrated:
            raise RuntimeError("calibrate(counter) first")

    # ------------------------------------------------------------------ shapes (pure)
    def _shape(self, index: int) -> _SessionShape | None:
        self._need_calibration()
        cfg = self.config
        if cfg.max_sessions is not None and index >= cfg.max_sessions:
            return None
        rng = random.Random(f"{self.seed}:session:{index}")
        target = sample_int(cfg.start_context_tokens, rng)
        count = len(self._perm)
        first = self._perm[index % count]
        rest = [c for c in self._perm if c != first]
        rng.shuffle(rest)
        prompt = self._first_base
        chunk_ids: list[int] = []
        for chunk in [first, *rest]:
            if prompt >= target:
                break
            if prompt + self._chunk_tokens[chunk] > cfg.max_context_tokens:
                continue
            prompt += self._chunk_tokens[chunk]
            chunk_ids.append(chunk)
        if prompt < cfg.min_context_tokens:
            raise WorkloadError(
                f"the corpus chunks add up to {prompt} tokens, below min_context_tokens ({cfg.min_context_tokens}); "
                "raise context_chunks or context_chunk_tokens",
                field="workload.context_chunks",
                path=self.config_path,
            )
        steps: list[tuple[tuple[int, int] | None, int, int, int, float]] = [
            (None, prompt, self.shared_tokens, sample_int(cfg.output_tokens, rng, minimum=1), 0.0)
        ]
        while True:
            call = rng.randrange(len(self._calls))
            result = rng.randrange(len(self._results))
            output = sample_int(cfg.output_tokens, rng, minimum=1)
            think = sample(cfg.think_time_s, rng)
            grown = prompt + self._call_tokens[call] + self._result_tokens[result]
            if grown > cfg.max_context_tokens:
                break  # at max: the session ends, the slot starts a new one
            steps.append(((call, result), grown, prompt - self._gen_suffix, output, think))
            prompt = grown
        return _SessionShape(index=index, chunk_ids=tuple(chunk_ids), steps=tuple(steps))

    def session_turns(self, index: int, *, block_size: int | None = None) -> list[PlannedTurn] | None:
        shape = self._shape(index)
        if shape is None:
            return None
        block = block_size or self.block_size
        return [
            PlannedTurn(prompt, cached_whole_blocks(shared, prompt, block), output, think)
            for _, prompt, shared, output, think in shape.steps
        ]

    # ------------------------------------------------------------------ the interface
    def new_session(self, index: int) -> AgenticSession | None:
        shape = self._shape(index)
        return AgenticSession(self, shape) if shape is not None else None

    def arrivals(self) -> Iterator[Arrival]:
        raise TypeError("synthetic_agentic is closed-loop: use new_session()")

    def plan(self, *, duration_s: float, concurrency: int, block_size: int | None = None) -> Plan:
        block = block_size or self.block_size
        service = self.config.service
        cache: dict[int, list[PlannedTurn] | None] = {}

        def shape(index: int) -> list[PlannedTurn] | None:
            if index not in cache:
                cache[index] = self.session_turns(index, block_size=block)
            return cache[index]

        turns, sessions = closed_loop_turns(
            shape,
            concurrency=concurrency,
            duration_s=duration_s,
            service=service.time_s,
        )
        return summarize(
            turns,
            workload=self.kind,
            counter=self.counter_label or "not calibrated",
            duration_s=duration_s,
            concurrency=concurrency,
            block_size=block,
            sessions=sessions,
            sample_turns=shape(0) or (),
            assumptions=(
                f"prefill {service.prefill_tokens_per_s:g} uncached tokens/s and decode {service.decode_tokens_per_s:g} "
                "tokens/s per request (only the request count depends on these)",
                "the KV cache holds every live session (no eviction), the shared prefix stays cached",
            ),
            notes=(
                f"contexts stay in [{self.config.min_context_tokens:,}, {self.config.max_context_tokens:,}] tokens; "
                "at max a session ends and its slot starts a new one",
                f"corpus: {self.corpus.source}",
                *(
                    [f"{sessions} sessions but {self.config.context_chunks} context_chunks: sessions "
                     f"{self.config.context_chunks} apart open on the same chunk (a little unplanned reuse)"]
                    if sessions > self.config.context_chunks
                    else []
                ),
                *self.notes,
            ),
        )


def _tools_keys(tools: list[dict[str, Any]] | None, tool_choice: str) -> bytes:
    """The request's ``tools`` and ``tool_choice`` keys (config ``tool_choice``)."""
    if not tools:
        return b""
    out = b',"tools":' + json.dumps(tools, ensure_ascii=False, separators=(",", ":")).encode()
    if tool_choice in ("none", "auto"):
        out += b',"tool_choice":"%s"' % tool_choice.encode()
    return out


class AgenticSession:
    """One agent conversation: shared pieces, appended to, never copied whole."""

    def __init__(self, workload: SyntheticAgenticWorkload, shape: _SessionShape) -> None:
        self._w = workload
        self._shape = shape
        self.session_id = f"agentic-{shape.index:06d}"
        self._turn = 0
        self._pieces: list[bytes] = [workload._head, workload._user_head]
        self._pieces.extend(workload._chunks[c] for c in shape.chunk_ids)
        self._pieces.append(b'"}')

    @property
    def turns_planned(self) -> int:
        return len(self._shape.steps)

    def next_turn(self) -> TurnRequest | None:
        if self._turn >= len(self._shape.steps):
            return None
        w = self._w
        pair, prompt, shared, output, think = self._shape.steps[self._turn]
        if pair is not None:
            call, result = pair
            self._pieces += (b",", w._calls[call], b",", w._tool_heads[call], w._results[result], b'"}')
        # One join: every copy of a body this size is a page-faulting mmap (soak.run.heap).
        body = b"".join([*self._pieces, b"]", stream_tail(output, ignore_eos=w.config.ignore_eos)])
        request = TurnRequest(
            session_id=self.session_id,
            turn=self._turn,
            path=CHAT_PATH,
            body=body,
            planned_prompt_tokens=prompt,
            max_tokens=output,
            think_time_s=think,
            planned_cached_tokens=cached_whole_blocks(shared, prompt, w.block_size),
        )
        self._turn += 1
        return request


class _LineWalker:
    """Consecutive corpus lines from seeded places, so text reads like real files."""

    def __init__(self, corpus: Corpus, rng: random.Random) -> None:
        self._files = corpus.files
        self._rng = rng
        self._file = rng.randrange(len(self._files))
        self._line = 0

    def _jump(self) -> None:
        self._file = self._rng.randrange(len(self._files))
        self._line = self._rng.randrange(max(1, len(self._files[self._file].lines) // 2))

    def take_chars(self, chars: int) -> list[str]:
        out: list[str] = []
        total = 0
        guard = 0
        while total < chars and guard < 1_000_000:
            guard += 1
            lines = self._files[self._file].lines
            if self._line >= len(lines):
                self._jump()
                continue
            line = lines[self._line]
            self._line += 1
            out.append(line)
            total += len(line)
        return out

    def take_file_part(self, chars: int) -> tuple[str, Sequence[str]]:
        """A run of lines from one place in one file: (file name, lines)."""
        self._jump()
        name = self._files[self._file].name
        return name, self.take_chars(chars)
