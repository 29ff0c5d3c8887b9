"""Work claims, cross-checked against what was received (CONTRACTS.md, "A pass
means the answers were right"): what ``ClaimsTally`` folds of each finished
request, beside ``RequestTally`` (which owns one and feeds it), pure.

- The work rate (``RateBook``): generated tokens (``soak.work.generated_tokens``)
  of productive, measured (not warm-up) requests, placed by when they ended, per
  window. Tokens, not requests: a server that keeps the request rate but answers
  with one token instead of two hundred has collapsed too. By the end, not spread
  over the stream: a window's count is then final once the window is past (a
  record reaches the tally when it ends), so the live judgement and the end's are
  one function of the same records. The window is sized once per run so that it
  holds ``window_requests`` productive requests at the rate the load started with
  (at least ``min_window``): long agentic turns get long windows, so a healthy
  window never holds too few requests for its count to mean something. Each window
  is judged against ``floor`` times the median of the windows before it (the run's
  own healthy rate: the latest ``history`` windows judged at or above the floor, so
  a collapse never lowers its own bar, and a load that slows as its contexts grow
  is measured against its recent self); ``consecutive`` windows in a row below it are a collapse.
  A window with no work at all is silence, which the hang detector and
  ``work_evidence`` own: it is neither a collapse nor part of the healthy rate, so
  a hang stays a hang. A server life's windows start at its first productive
  request (its start-up is ``work_evidence``'s), the windows between an incident's
  pause and the new life are not owed, and nothing after the load stopped sending
  (the drain) is judged; a window still open is never judged.
- The model the chunks named, counted per name (bounded), judged against the
  served models once the judge knows them (``expected``).
- Usage: ``usage_output_tokens`` (the claim) against ``output_tokens`` (counted
  from the text): a disagreement past the tolerance is counted and noted; no
  figure ever reads the claim.
- Degenerate answers per window (a signal, not a verdict).
- The client's work over wall-clock spans, so the judge can compare it with the
  server's ``generation_tokens`` over the span its scrapes cover (``client_within``).
"""

from __future__ import annotations

import math
from collections import deque
from array import array
from dataclasses import dataclass
from typing import Any, Mapping

from soak.criteria.config import CriteriaConfig
from soak.work import finite_number

MAX_MODELS = 64  # distinct names counted; a server naming more is not serving one model
MAX_DEGENERATE_WINDOWS = 100
NAME_CHARS = 80


def printable(name: str) -> str:
    """A model name as the summary may say it: printable, clipped."""
    text = "".join(ch if ch.isprintable() else "?" for ch in name[:NAME_CHARS])
    return text + ("..." if len(name) > NAME_CHARS else "")


@dataclass(frozen=True)
class Collapse:
    """The first window of a run of windows below the floor."""

    start: float
    tokens: int
    reference: float  # the healthy rate's window (median tokens of the windows before)
    window_s: float

    @property
    def share(self) -> float:
        return self.tokens / self.reference if self.reference > 0 else 0.0


class RateBook:
    """The work-rate windows (see the module): O(windows) state, judged as time passes."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.window_s: float | None = cfg.window
        self.origin: float | None = None  # this life's first productive request
        self._early: list[tuple[float, int]] = []  # before the window is sized
        self._tokens: dict[int, int] = {}
        self._next = 0  # the next window of this life to judge
        # The latest healthy windows (at or above the floor), oldest first: the healthy rate
        # follows a workload that slows as its contexts grow, and never follows a collapse.
        self._healthy: deque[int] = deque(maxlen=cfg.history)
        self._low_run: Collapse | None = None
        self._low_count = 0
        self.stopped: float | None = None  # the load stopped sending (the drain began)
        self.judged = 0
        self.silent = 0
        self.lowest: Collapse | None = None
        self.breach: Collapse | None = None

    @property
    def reference(self) -> float | None:
        if len(self._healthy) < self.cfg.min_windows:
            return None
        healthy = sorted(self._healthy)
        mid = len(healthy) // 2
        return float(healthy[mid]) if len(healthy) % 2 else (healthy[mid - 1] + healthy[mid]) / 2.0

    def add(self, t: float, tokens: int) -> None:
        if tokens <= 0 or (self.stopped is not None and t > self.stopped):
            return
        if self.origin is None:
            self.origin = t
        if self.window_s is None:
            self._early.append((t, tokens))
            if len(self._early) >= self.cfg.window_requests:
                self.window_s = max(self.cfg.min_window, max(e for e, _ in self._early) - self.origin)
                early, self._early = self._early, []
                for at, count in early:
                    self._place(at, count)
            return
        self._place(t, tokens)

    def _place(self, t: float, tokens: int) -> None:
        assert self.origin is not None and self.window_s is not None
        index = max(0, math.floor((t - self.origin) / self.window_s))
        if index >= self._next:  # a window already judged stays as judged
            self._tokens[index] = self._tokens.get(index, 0) + tokens

    def judge(self, until: float) -> None:
        """Judge every window of this life that closed by ``until`` (and before the drain)."""
        if self.stopped is not None:
            until = min(until, self.stopped)
        if self.origin is None or self.window_s is None:
            return
        while self.origin + (self._next + 1) * self.window_s <= until:
            index = self._next
            self._next += 1
            self._judge_window(self.origin + index * self.window_s, self._tokens.pop(index, 0))

    def _judge_window(self, start: float, tokens: int) -> None:
        self.judged += 1
        if tokens == 0:
            self.silent += 1
            return
        reference = self.reference
        if reference is not None and tokens < self.cfg.floor * reference:
            low = Collapse(start, tokens, reference, self.window_s or 0.0)
            if self.lowest is None or low.share < self.lowest.share:
                self.lowest = low
            self._low_run = self._low_run or low
            self._low_count += 1
            if self._low_count >= self.cfg.consecutive and self.breach is None:
                self.breach = self._low_run
            return  # a window below the floor is not the healthy rate: a collapse never lowers its own bar
        self._low_run, self._low_count = None, 0
        self._healthy.append(tokens)

    def restart(self, paused: float, at: float) -> None:
        """A new server life at ``at``: the old life judged up to its pause, its open window dropped."""
        self.judge(min(paused, at))
        self.origin, self._tokens, self._next = None, {}, 0
        self._low_run, self._low_count = None, 0
        if self.window_s is None:
            self._early = []


class ClaimsTally:
    """What the work-claim criteria read of the finished requests (see the module)."""

    def __init__(self, config: CriteriaConfig) -> None:
        self.config = config
        self.rate = RateBook(config.work_rate)
        self.models: dict[str, int] = {}
        self.models_overflow = 0  # answers naming a model past MAX_MODELS distinct names
        self.answers = 0  # ok answers
        self.unnamed = 0  # ok answers whose chunks named no model
        self.usage_checked = 0
        self.usage_disagreements = 0
        self.usage_over = 0  # claims above the count
        self.usage_claimed = 0
        self.usage_counted = 0
        self.usage_first: dict[str, Any] | None = None
        self.degenerate = 0
        self.degenerate_kinds: dict[str, int] = {}
        self._degenerate_windows: dict[int, list[int]] = {}
        self.origin: float | None = None  # the load's start, for window labels
        # (started_at, ended_at, generated tokens) of productive requests; all accepted tokens
        self._spans = array("d")
        self.client_all = 0
        self.expected: frozenset[str] | None = None  # the served models, once the judge knows them
        self.server: ServerWork | None = None

    def add(self, get: Any, *, at: float, tokens: int, accepted: bool) -> None:
        """Fold one finished record (``get`` reads its fields); ``at``: its end on the span's clock;
        ``tokens``: its ``generated_tokens``; ``accepted``: ``server_accepted``."""
        output = get("output_tokens")
        if accepted and type(output) is int and output > 0:
            self.client_all += output
        if get("outcome") != "ok":
            return
        if not get("warmup"):
            self.rate.add(at, tokens)
        if tokens > 0:
            start, end = finite_number(get("started_at")), finite_number(get("ended_at"))
            if start is not None and end is not None:
                self._spans.extend((start, end, float(tokens)))
        self.answers += 1
        self._model(get("model"))
        self._usage(get("usage_output_tokens"), output, at)
        self._degenerate(get("degenerate"), at)

    def _model(self, model: Any) -> None:
        if not isinstance(model, str) or not model:
            self.unnamed += 1
        elif model in self.models or len(self.models) < MAX_MODELS:
            self.models[model] = self.models.get(model, 0) + 1
        else:
            self.models_overflow += 1

    def _usage(self, claimed: Any, counted: Any, at: float) -> None:
        if type(claimed) is not int or type(counted) is not int or claimed < 0 or counted < 0:
            return
        cfg = self.config.claims
        self.usage_checked += 1
        self.usage_claimed += claimed
        self.usage_counted += counted
        if abs(claimed - counted) > max(cfg.slack, cfg.tolerance * counted):
            self.usage_disagreements += 1
            self.usage_over += claimed > counted
            if self.usage_first is None:
                self.usage_first = {"claimed": claimed, "counted": counted, "at_s": self._rel(at)}

    def _degenerate(self, kind: Any, at: float) -> None:
        index = max(0, math.floor((at - (self.origin or 0.0)) / self.config.claims.degenerate_window)) \
            if self.origin is not None else 0
        window = self._degenerate_windows.setdefault(index, [0, 0])
        window[0] += 1
        if isinstance(kind, str) and kind:
            window[1] += 1
            self.degenerate += 1
            name = printable(kind)[:40]
            if name in self.degenerate_kinds or len(self.degenerate_kinds) < 8:
                self.degenerate_kinds[name] = self.degenerate_kinds.get(name, 0) + 1

    def _rel(self, at: float) -> float | None:
        return None if self.origin is None else round(at - self.origin, 3)

    # -- what the judge adds once it has read the run ----------------------------------
    def client_within(self, start: float | None, end: float | None) -> int:
        """Generated tokens of productive requests that started and ended inside
        [start, end] (wall labels): work an honest server's counters over that span hold."""
        spans, total = self._spans, 0.0
        lo = -math.inf if start is None else start
        hi = math.inf if end is None else end
        for i in range(0, len(spans), 3):
            if spans[i] >= lo and spans[i + 1] <= hi:
                total += spans[i + 2]
        return int(total)

    def wrong_models(self) -> tuple[int, str | None]:
        """Answers naming a model not served, and the most frequent such name."""
        expected = self.expected or frozenset()
        wrong = {name: n for name, n in self.models.items() if name not in expected}
        first = max(wrong.items(), key=lambda kv: (kv[1], kv[0]))[0] if wrong else None
        return sum(wrong.values()) + self.models_overflow, first

    def degenerate_json(self) -> dict[str, Any]:
        windows = self._degenerate_windows
        marked = [(i, w) for i, w in sorted(windows.items()) if w[1] > 0]
        size = self.config.claims.degenerate_window
        return {
            "answers": self.answers, "degenerate": self.degenerate,
            "share": self.degenerate / self.answers if self.answers else None,
            "kinds": dict(self.degenerate_kinds), "window_s": size,
            "max_window_share": max((w[1] / w[0] for _, w in marked), default=0.0 if self.answers else None),
            "windows": [{"from_s": i * size, "answers": w[0], "degenerate": w[1], "share": w[1] / w[0]}
                        for i, w in marked[:MAX_DEGENERATE_WINDOWS]],
        }

    def usage_json(self) -> dict[str, Any]:
        cfg = self.config.claims
        return {"checked": self.usage_checked, "usage_disagreements": self.usage_disagreements,
                "claimed_above_count": self.usage_over, "claimed_tokens": self.usage_claimed,
                "counted_tokens": self.usage_counted, "tolerance": cfg.tolerance, "slack": cfg.slack,
                "first": self.usage_first}


@dataclass(frozen=True)
class ServerWork:
    """The server's ``generation_tokens`` over the span its scrapes cover, beside the client's work."""

    seen: bool  # the server exported the counter
    generated: float
    client_within: int  # productive requests wholly inside the covered span
    client_all: int  # every accepted request's counted tokens
    resets: int = 0
    covered: bool = True  # the scrapes cover the whole load
    claimed: int | None = None  # the usage claims' total, for the note


def expected_models(*names: Any, lists: tuple[Any, ...] = ()) -> frozenset[str] | None:
    """The models the target serves: the configured/served names and /v1/models' ids
    (None when the run recorded none: the model is then not checked)."""
    found = {n for n in names if isinstance(n, str) and n}
    for ids in lists:
        if isinstance(ids, (list, tuple)):
            found.update(n for n in ids[:MAX_MODELS] if isinstance(n, str) and n)
    return frozenset(found) or None


def models_json(tally: ClaimsTally) -> dict[str, Any]:
    names = sorted(tally.models.items(), key=lambda kv: (-kv[1], kv[0]))[:8]
    wrong, first = tally.wrong_models()
    return {"answers": tally.answers, "unnamed": tally.unnamed,
            "expected": sorted(printable(n) for n in tally.expected) if tally.expected else None,
            "wrong": wrong if tally.expected else None, "first_wrong": printable(first) if first else None,
            "names": {printable(n): c for n, c in names}}


__all__ = ["ClaimsTally", "Collapse", "RateBook", "ServerWork", "expected_models", "models_json", "printable"]
