"""The correctness oracle as a person reads it: the canaries' marks and counts,
and each corruption's evidence (``incidents/N/corruption.json``), read totally.

Every reader here takes what the run directory holds (hostile or damaged: a
field of the wrong type reads as absent) and returns frozen records; the
report (``soak.report.oracle_html``), the end block, junit.xml and history say
them. ``corruption_sentence`` is the one sentence a corruption is told in.

corruption.json (written by the responder for a ``corruption`` incident)::

    {"canary_id", "long", "reference_source", "reference": Answer, "answer": Answer,
     "judgement": {"verdict", "position", "reference_token", "answer_token", "gap",
                   "alternatives": [[tok, lp], ...], "crosstalk_with", "reason"},
     "server": {"running", "waiting", "kv_cache_usage", "in_flight", "contexts": [...]},
     "onset": {"earliest", "latest"}}

with Answer as ``soak.oracle.answer.Answer.to_json()``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from soak.jsonl import is_timestamp, read_json
from soak.oracle.answer import MAX_ALTERNATIVES, MAX_TOKEN_CHARS, Answer

CORRUPTION_FILE = "corruption.json"
# The verdicts a canary sample carries (soak.samples.CanaryVerdict values), in the order they are counted.
VERDICTS = ("reference", "match", "explained", "corrupt", "crosstalk", "unjudged")
# A verdict that says the answer was right (a reference is this run's own first answer).
GOOD = frozenset({"reference", "match", "explained"})
BAD = frozenset({"corrupt", "crosstalk"})
# The tie margin when the run's config names none (soak.oracle.config.OracleConfig's default).
DEFAULT_TIE_MARGIN = 0.2
# Marks kept for the timeline strip: a 24-hour night at one canary each 20 s is 4,320;
# past this, good marks are thinned (every bad one is kept).
MAX_MARKS = 20_000
MAX_CONTEXTS = 512
MAX_TEXT = 4096


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def _str(value: Any, limit: int = MAX_TOKEN_CHARS) -> str | None:
    return value[:limit] if isinstance(value, str) else None


def _bool(value: Any) -> bool:
    return value is True


@dataclass(frozen=True)
class CanaryMark:
    """One judged canary, as the timeline and the counts need it."""

    ts: float
    canary_id: str
    verdict: str  # one of VERDICTS; anything else reads as "unjudged"
    long: bool = False
    position: int | None = None
    crosstalk_with: str | None = None
    share: float | None = None
    prompt_tokens: int | None = None

    @property
    def bad(self) -> bool:
        return self.verdict in BAD


def canary_mark(obj: Any) -> CanaryMark | None:
    """A canary sample line (kind "canary") as a mark; None where it has no time or id."""
    if not isinstance(obj, Mapping) or not is_timestamp(obj.get("ts")):
        return None
    canary_id = _str(obj.get("canary_id"))
    if canary_id is None:
        return None
    verdict = obj.get("verdict")
    share = _num(obj.get("share"))
    return CanaryMark(
        ts=float(obj["ts"]), canary_id=canary_id, verdict=verdict if verdict in VERDICTS else "unjudged",
        long=_bool(obj.get("long")), position=_int(obj.get("position")),
        crosstalk_with=_str(obj.get("crosstalk_with")),
        share=share if share is not None and 0.0 <= share <= 1.0 else None,
        prompt_tokens=_int(obj.get("prompt_tokens")))


@dataclass(frozen=True)
class CanaryTally:
    """The canaries counted by verdict, and their last measured share of server time."""

    counts: Mapping[str, int] = field(default_factory=dict)
    share: float | None = None

    def count(self, verdict: str) -> int:
        return int(self.counts.get(verdict, 0))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def judged(self) -> int:
        """Answers compared with a reference (a first answer that became the reference is not judged)."""
        return sum(self.count(v) for v in ("match", "explained", "corrupt", "crosstalk"))

    @property
    def corrupt(self) -> int:
        return self.count("corrupt") + self.count("crosstalk")

    @property
    def pass_rate(self) -> float | None:
        """Judged answers that were right (matched, or explained by a near tie)."""
        return (self.count("match") + self.count("explained")) / self.judged if self.judged else None

    def sentence(self, *, max_share: float | None = None) -> str:
        """"212 judged: 205 matched, 6 explained (near ties), 1 corrupt; 1.3% of server time (bound 2%)"."""
        parts = [f"{self.judged} judged: {self.count('match')} matched, {self.count('explained')} explained "
                 f"(near ties), {self.count('corrupt')} corrupt"]
        if self.count("crosstalk"):
            parts[0] += f", {self.count('crosstalk')} cross-talk"
        extra = [f"{self.count(v)} {w}" for v, w in (("reference", "references taken"), ("unjudged", "unjudged"))
                 if self.count(v)]
        if extra:
            parts[0] += f" ({', '.join(extra)})"
        if self.share is not None:
            bound = f" (bound {max_share * 100:g}%)" if max_share is not None else ""
            parts.append(f"{self.share * 100:.2f}% of server time{bound}")
        else:
            parts.append("share of server time not measured")
        return "; ".join(parts)


def tally(marks: Iterable[CanaryMark]) -> CanaryTally:
    counts: dict[str, int] = {}
    share = None
    last = -math.inf
    for m in marks:
        counts[m.verdict] = counts.get(m.verdict, 0) + 1
        if m.share is not None and m.ts >= last:
            share, last = m.share, m.ts
    return CanaryTally(counts={v: counts[v] for v in VERDICTS if v in counts}, share=share)


def thin(marks: Sequence[CanaryMark], limit: int = MAX_MARKS) -> tuple[CanaryMark, ...]:
    """At most ``limit`` marks for drawing: every bad one, good ones evenly thinned."""
    if len(marks) <= limit:
        return tuple(marks)
    bad = [m for m in marks if m.verdict not in GOOD]
    good = [m for m in marks if m.verdict in GOOD]
    room = max(0, limit - len(bad))
    step = max(1, math.ceil(len(good) / room)) if room else len(good) + 1
    kept = bad[:limit] + good[::step][:room]
    return tuple(sorted(kept, key=lambda m: m.ts))


@dataclass(frozen=True)
class Judgement:
    verdict: str | None = None
    position: int | None = None
    reference_token: str | None = None
    answer_token: str | None = None
    gap: float | None = None  # nats between the chosen token's logprob and the reference token's
    alternatives: tuple[tuple[str, float], ...] = ()
    crosstalk_with: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class ServerState:
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    in_flight: float | None = None
    contexts: tuple[int, ...] = ()
    # the client's in-flight streams at that moment: tokens each had received (the probe's "load")
    stream_tokens: tuple[int, ...] = ()


@dataclass(frozen=True)
class Corruption:
    """One corruption incident's evidence bundle, read back."""

    number: int | None
    evidence: str  # "incidents/N"
    canary_id: str | None = None
    long: bool = False
    reference_source: str | None = None
    reference: Answer = Answer()
    answer: Answer = Answer()
    judgement: Judgement = Judgement()
    server: ServerState = ServerState()
    onset_earliest: float | None = None
    onset_latest: float | None = None
    prompt_tokens: int | None = None  # from the canary's own sample, where the run has it
    unreadable: str | None = None  # why corruption.json could not be read, where it could not
    # Each side's tokens may be a window around the position (the probe keeps a few either
    # side): the window's first position; position p is tokens[p - offset].
    reference_from: int = 0
    answer_from: int = 0

    def at(self, side: str, position: int | None):
        """The TokenChoice at ``position`` on "reference" or "answer", None where the window lacks it."""
        answer, offset = (self.reference, self.reference_from) if side == "reference" else (self.answer, self.answer_from)
        i = None if position is None else position - offset
        return answer.tokens[i] if i is not None and 0 <= i < len(answer.tokens) else None

    @property
    def position(self) -> int | None:
        """The first differing position: the judgement's, else the first place the token runs differ."""
        if self.judgement.position is not None and self.judgement.position >= 0:
            return self.judgement.position
        lo = max(self.reference_from, self.answer_from)
        hi = min(self.reference_from + len(self.reference.tokens), self.answer_from + len(self.answer.tokens))
        for p in range(lo, hi):
            if self.at("reference", p).token != self.at("answer", p).token:  # type: ignore[union-attr]
                return p
        return None


def _pairs(value: Any) -> tuple[tuple[str, float], ...]:
    out = []
    for item in value if isinstance(value, list) else ():
        if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str):
            lp = _num(item[1])
            if lp is not None:
                out.append((item[0][:MAX_TOKEN_CHARS], lp))
    return tuple(out[:MAX_ALTERNATIVES])


def _judgement(obj: Any) -> Judgement:
    obj = obj if isinstance(obj, Mapping) else {}
    return Judgement(verdict=_str(obj.get("verdict")), position=_int(obj.get("position")),
                     reference_token=_str(obj.get("reference_token")), answer_token=_str(obj.get("answer_token")),
                     gap=_num(obj.get("gap")), alternatives=_pairs(obj.get("alternatives")),
                     crosstalk_with=_str(obj.get("crosstalk_with")), reason=_str(obj.get("reason"), MAX_TEXT))


def _server(obj: Any, load: Any = None) -> ServerState:
    obj = obj if isinstance(obj, Mapping) else {}
    load = load if isinstance(load, Mapping) else {}
    contexts = obj.get("contexts")
    kv = _num(obj.get("kv_cache_usage"))
    streams = load.get("streams")
    in_flight = _num(obj.get("in_flight"))
    return ServerState(running=_num(obj.get("running")), waiting=_num(obj.get("waiting")),
                       kv_cache_usage=kv if kv is not None else _num(obj.get("kv_cache_usage_perc")),
                       in_flight=in_flight if in_flight is not None else _num(load.get("in_flight")),
                       contexts=tuple(c for c in contexts[:MAX_CONTEXTS] if type(c) is int)
                       if isinstance(contexts, list) else (),
                       stream_tokens=tuple(st["tokens"] for st in streams[:MAX_CONTEXTS]
                                           if isinstance(st, Mapping) and type(st.get("tokens")) is int)
                       if isinstance(streams, list) else ())


def _answer(obj: Any) -> Answer:
    answer = Answer.from_json(obj)
    # the text is shown whole in the card: bounded, a few lines' worth; model and note like a token
    return Answer(answer.tokens, answer.text[:MAX_TEXT], _str(answer.finish_reason), _str(answer.model),
                  _str(answer.malformed))


def corruption_from_json(obj: Any, *, number: int | None, evidence: str) -> Corruption:
    """corruption.json as parsed JSON (any shape) as a Corruption; total."""
    if not isinstance(obj, Mapping):
        return Corruption(number=number, evidence=evidence, unreadable="corruption.json is not a JSON object")
    onset = obj.get("onset") if isinstance(obj.get("onset"), Mapping) else {}
    earliest, latest = onset.get("earliest"), onset.get("latest")
    judgement = _judgement(obj.get("judgement"))
    # the canary's own fields beside the judgement (the responder writes both): the judgement's first
    fallback = {"verdict": _str(obj.get("verdict")), "crosstalk_with": _str(obj.get("crosstalk_with"))}
    judgement = Judgement(**{**judgement.__dict__, **{k: v for k, v in fallback.items()
                                                      if v is not None and getattr(judgement, k) is None}})
    return Corruption(
        number=number, evidence=evidence, canary_id=_str(obj.get("canary_id")), long=_bool(obj.get("long")),
        reference_source=_str(obj.get("reference_source")), reference=_answer(obj.get("reference")),
        answer=_answer(obj.get("answer")), judgement=judgement,
        server=_server(obj.get("server"), obj.get("load")),
        onset_earliest=float(earliest) if is_timestamp(earliest) else None,
        onset_latest=float(latest) if is_timestamp(latest) else None,
        prompt_tokens=_int(obj.get("prompt_tokens")) if (_int(obj.get("prompt_tokens")) or 0) >= 0 else None,
        reference_from=_offset(obj.get("reference")), answer_from=_offset(obj.get("answer")))


def _offset(side: Any) -> int:
    value = side.get("tokens_from") if isinstance(side, Mapping) else None
    return value if type(value) is int and 0 <= value < 10**9 else 0


def read_corruption(incident_dir: Path, *, number: int | None = None,
                    evidence: str | None = None) -> Corruption | None:
    """incidents/N/corruption.json, or None where the incident has none."""
    path = Path(incident_dir) / CORRUPTION_FILE
    evidence = evidence or f"incidents/{Path(incident_dir).name}"
    if not path.is_file():
        return None
    try:
        obj = read_json(path)  # bounded in size and nesting; None where it cannot be read
    except (OSError, ValueError) as exc:
        return Corruption(number=number, evidence=evidence, unreadable=f"corruption.json: {type(exc).__name__}")
    if obj is None:
        return Corruption(number=number, evidence=evidence, unreadable="corruption.json cannot be read")
    return corruption_from_json(obj, number=number, evidence=evidence)


def with_prompt_tokens(c: Corruption, marks: Sequence[CanaryMark]) -> Corruption:
    """The corruption with its canary's prompt size, from the run's bad mark of the same canary."""
    if c.prompt_tokens is not None or c.canary_id is None:
        return c
    for m in reversed(marks):
        if m.canary_id == c.canary_id and m.bad and m.prompt_tokens is not None:
            return Corruption(**{**c.__dict__, "prompt_tokens": m.prompt_tokens})
    return c


def _tokens_said(n: int) -> str:
    return f"{n / 1000:.0f}K tokens" if n >= 10_000 else f"{n:,} tokens"


def corruption_sentence(c: Corruption) -> str:
    """"canary c2 (long, 214K tokens) diverged at position 7: 'Paris' where the reference has 'Rome'
    (gap 3.1 nats; ...reason)"; the one sentence of the end block, junit.xml and the card."""
    if c.unreadable and c.canary_id is None:
        return f"a corruption whose evidence cannot be read ({c.unreadable})"
    size = ["long" if c.long else "short"]
    if c.prompt_tokens is not None:
        size.append(_tokens_said(c.prompt_tokens))
    out = f"canary {c.canary_id or '?'} ({', '.join(size)})"
    j = c.judgement
    crosstalk = j.crosstalk_with
    position = c.position
    if crosstalk:
        out += f" returned another canary's answer: {crosstalk}"
        if position is not None:
            out += f" (from position {position})"
    elif position is not None:
        out += f" diverged at position {position}"
        ref = j.reference_token if j.reference_token is not None else _token_at(c, "reference", position)
        ans = j.answer_token if j.answer_token is not None else _token_at(c, "answer", position)
        if ans is not None or ref is not None:
            out += f": {_quoted(ans)} where the reference has {_quoted(ref)}"
        if j.gap is not None:
            out += f" (gap {j.gap:.3g} nats)"
    else:
        out += " was judged corrupt"
    if j.reason:
        out += f"; {j.reason}"
    return out


def _token_at(c: Corruption, side: str, position: int) -> str | None:
    found = c.at(side, position)
    return None if found is None else found.token


def _quoted(token: str | None) -> str:
    return "nothing" if token is None else repr(token)


def incident_corruptions(run_dir: Path, numbers: Iterable[tuple[int | None, str | None]]) -> list[Corruption]:
    """The corruption.json of each (number, evidence) incident that has one."""
    out = []
    for number, evidence in numbers:
        folder = Path(run_dir) / (evidence or f"incidents/{number}")
        found = read_corruption(folder, number=number, evidence=evidence)
        if found is not None:
            out.append(found)
    return out


@dataclass(frozen=True)
class OracleView:
    """What the end block says of the oracle: the canaries counted, each corruption."""

    tally: CanaryTally
    corruptions: tuple[Corruption, ...] = ()


def read_oracle(run_dir: str | Path) -> OracleView | None:
    """The run's canaries (its samples, kind "canary") and corruption incidents; None for a run with neither."""
    from soak.store.rundir import RunDir

    run = RunDir(run_dir)
    marks = [m for m in (canary_mark(s) for s in run.samples(kinds=("canary",))) if m is not None]
    found = []
    for folder in run.incident_dirs():
        c = read_corruption(folder, number=int(folder.name))
        if c is not None:
            found.append(with_prompt_tokens(c, marks))
    if not marks and not found:
        return None
    return OracleView(tally=tally(marks), corruptions=tuple(found))
