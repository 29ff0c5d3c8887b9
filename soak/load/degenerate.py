"""Does an answer's text look degenerate? A pure, incremental, bounded detector.

``DegenerateText`` is fed the stream's generated text deltas (``feed``) and, for
bytes the client could not decode, ``undecodable(count)``; ``verdict`` then says
``"undecodable"``, ``"replacement_char"``, ``"repetition"`` or None (that order
when several hold). It is a signal about one answer, not a verdict on the server:
the judge reports the share of such answers per window.

The rules (each sticky: once seen in an answer, the answer is marked):
- ``undecodable``: any byte of the response that is not UTF-8 (the SSE decoder
  counts them), or a lone UTF-16 surrogate in the text (a JSON ``\\ud800`` escape
  without its pair: no encoding holds it).
- ``replacement_char``: more than ``MAX_REPLACEMENTS`` U+FFFD characters. vLLM's
  detokenizer holds back a token that ends mid-character, so an honest answer
  carries none; a few are tolerated (a model may quote one).
- ``repetition``: the text ends, at some point, in a unit of ``p`` characters
  (1 <= p <= ``MAX_PERIOD``) repeated back to back over at least
  ``max(MIN_REPEATS * p, MIN_SPAN)`` characters: "can can can ..." (p = 4) fifty
  times, one line over and over, a garbled phrase cycling. The check runs every
  ``CHECK_EVERY`` characters and at the verdict on the last ``WINDOW``
  characters, so a loop is caught once it has run its span plus at most
  ``CHECK_EVERY`` characters, or at the answer's end. (Checking more often costs
more per chunk: the client's hot path.)

The trade-off: a loop whose unit is longer than ``MAX_PERIOD`` characters (a
whole paragraph repeated) is not caught. That bound is what keeps the
simulator's healthy text, a prompt-driven walk over 76 distinct words (soak.sim.greedy),
and legitimately repeated blocks of prose or code from reading as loops: by the
text alone a paragraph said twelve times is that cycle. Below ``MIN_SPAN``
(200 characters) nothing is flagged, so doubled words ("had had"), short rules
("-----") and small literal tables (``[0, 0, 0, 0]``) are ordinary text; the
cost is that a loop cut short by a small ``max_tokens`` (under about 50 tokens)
goes unseen. Exact repetition only: a loop whose unit drifts (a counter inside
it) is not one by this rule.

Memory: the last ``WINDOW`` characters and counters, whatever the answer's
length. Time: amortized O(1) per character (a check is one bounded ``rfind`` and
per candidate period (at most ``MAX_PERIOD``, nearly always none) a compare of
``_QUICK`` characters and, where that holds, one of at most ``WINDOW``, every
``CHECK_EVERY`` characters).
"""

from __future__ import annotations

from collections import deque

REPETITION = "repetition"
REPLACEMENT_CHAR = "replacement_char"
UNDECODABLE = "undecodable"

MAX_PERIOD = 160
MIN_REPEATS = 10
MIN_SPAN = 200
MAX_REPLACEMENTS = 3
CHECK_EVERY = 512
WINDOW = 2048  # >= MIN_REPEATS * MAX_PERIOD: the longest span a check needs
_NEEDLE = 16  # the suffix looked for one period back; MIN_SPAN >= _NEEDLE + 1
_QUICK = 64  # characters compared before a candidate period's whole span
_LOOK = _NEEDLE + MAX_PERIOD  # how far back a period's recurrence of the last characters lies

assert WINDOW >= MIN_REPEATS * MAX_PERIOD and MIN_SPAN > _NEEDLE


def periodic_tail(text: str, end: int | None = None) -> tuple[int, int] | None:
    """The smallest period ``p <= MAX_PERIOD`` found whose repeat covers the
    rule's span at the end of ``text[:end]``, and how many characters that repeat
    covers back from ``end`` (within ``WINDOW``); None when there is none."""
    n = len(text) if end is None else end
    if n < MIN_SPAN:
        return None
    needle = text[n - _NEEDLE:n]
    lo = max(0, n - _NEEDLE - MAX_PERIOD)
    # Any period p with a repeat of p + _NEEDLE characters puts the suffix p back:
    # the candidates are where it recurs, nearest first.
    at = text.rfind(needle, lo, n - 1)
    while at >= 0:  # at most MAX_PERIOD candidates, each a distinct period
        period = n - _NEEDLE - at
        span = max(MIN_REPEATS * period, MIN_SPAN)
        if span <= n:
            # A short compare first: most candidates fail within _QUICK characters.
            quick = min(_QUICK, span - period)
            if text[n - quick - period:n - period] == text[n - quick:n] \
                    and text[n - span + period:n] == text[n - span:n - period]:
                return period, _covered(text, n, period, span)
        if at <= lo:
            break
        at = text.rfind(needle, lo, at + _NEEDLE - 1)
    return None


def _covered(text: str, n: int, period: int, span: int) -> int:
    """How far back the repeat goes (at least ``span``), looked for within ``WINDOW``."""
    floor = max(0, n - WINDOW)
    start = n - span
    while start - period >= floor and text[start - period:start] == text[start:start + period]:
        start -= period
    return n - start


class DegenerateText:
    """One answer's text, fed as it streams; see the module docstring."""

    __slots__ = ("_blocks", "_blocks_len", "_recent", "_pending", "_pending_len", "_replacements", "_undecodable",
                 "_period", "_covered")

    def __init__(self) -> None:
        # The text checked so far, its last WINDOW characters at least, in the blocks fed:
        # joined only when a check needs more than ``_recent`` (its last _LOOK characters).
        self._blocks: deque[str] = deque()
        self._blocks_len = 0
        self._recent = ""
        self._pending: list[str] = []  # fed since the last check
        self._pending_len = 0
        self._replacements = 0
        self._undecodable = 0
        self._period: int | None = None  # the loop seen, once seen
        self._covered = 0

    def feed(self, text: str) -> None:
        if not text:
            return
        if not text.isascii():
            self._replacements += text.count("\ufffd")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: text no encoding holds
                self._undecodable += 1
        if self._period is not None:
            return  # the answer is already a loop: no more checks to pay for
        self._pending.append(text)
        self._pending_len += len(text)
        if self._pending_len >= CHECK_EVERY:
            self._check()

    def undecodable(self, count: int) -> None:
        """``count`` bytes of this answer's response did not decode as UTF-8."""
        if count > 0:
            self._undecodable += count

    @property
    def verdict(self) -> str | None:
        if self._pending:
            self._check()
        if self._undecodable:
            return UNDECODABLE
        if self._replacements > MAX_REPLACEMENTS:
            return REPLACEMENT_CHAR
        if self._period is not None:
            return REPETITION
        return None

    @property
    def held(self) -> int:
        """Characters this detector holds now: bounded, whatever it was fed."""
        return self._blocks_len + self._pending_len + len(self._recent)

    @property
    def loop(self) -> tuple[int, int] | None:
        """The loop seen: its period and the characters it covered (within the window)."""
        return None if self._period is None else (self._period, self._covered)

    def _check(self) -> None:
        pending = self._pending
        fresh = pending[0] if len(pending) == 1 else "".join(pending)
        self._pending = []
        self._pending_len = 0
        recent = self._recent + fresh
        self._recent = recent[-_LOOK:]
        if len(fresh) < 2 * CHECK_EVERY:
            # The common case: one end to check. No recurrence of the last characters
            # within a period is no loop, and costs one short search to know.
            n = len(recent)
            if n < _NEEDLE + 1 or recent.rfind(recent[n - _NEEDLE:], max(0, n - _LOOK), n - 1) < 0:
                self._keep(fresh)
                return
            ends = [self._blocks_len + len(fresh)]
        else:  # one large delta: checked at every CHECK_EVERY inside it too
            start = self._blocks_len
            ends = list(range(start + CHECK_EVERY, start + len(fresh), CHECK_EVERY)) + [start + len(fresh)]
        text = "".join(self._blocks) + fresh
        for end in ends:
            found = periodic_tail(text, end)
            if found is not None:
                self._period, self._covered = found
                self._blocks.clear()
                self._recent = ""
                return
        self._keep(fresh)

    def _keep(self, fresh: str) -> None:
        blocks = self._blocks
        blocks.append(fresh)
        self._blocks_len += len(fresh)
        while self._blocks_len - len(blocks[0]) >= WINDOW:
            self._blocks_len -= len(blocks.popleft())
        if self._blocks_len > 2 * WINDOW:  # one large block: keep its end only
            last = "".join(blocks)[-WINDOW:]
            blocks.clear()
            blocks.append(last)
            self._blocks_len = len(last)


__all__ = ["DegenerateText", "periodic_tail", "REPETITION", "REPLACEMENT_CHAR", "UNDECODABLE",
           "MAX_PERIOD", "MIN_REPEATS", "MIN_SPAN", "MAX_REPLACEMENTS", "WINDOW", "CHECK_EVERY"]
