"""The simulator's deterministic tokenizer: reversible, no vocabulary download.

One compiled regex splits text into pieces and every piece is one token:

- ``"\\n"`` alone (so no token ever crosses a newline),
- an optional single space followed by 1-4 printable ASCII characters,
- a run of 1-4 ASCII blanks (space, tab, CR, FF, VT),
- any other single character (non-ASCII text costs a token a character).

Because each match ends before a newline and starts fresh after it,
``count(a + b) == count(a) + count(b)`` whenever ``a`` ends with ``"\\n"``; the
workload builds exact-length blocks from that property. English prose comes out
at about 4 characters a token, close to a real BPE.

Token ids encode the piece itself: ASCII pieces (at most 5 characters) are the
base-128 digits of the text behind a leading 1 (below 2**43), any other
character is ``2**43 + ord(char)``. Ids stay below 2**53, so JSON clients in
any language read them exactly. There are no special tokens: no BOS, no EOS
text; ``add_special_tokens`` changes nothing.
"""

from __future__ import annotations

import re
from array import array
from collections import OrderedDict
from functools import lru_cache
from itertools import accumulate
from typing import Iterable

PIECE = re.compile(r"\n| ?[!-~]{1,4}|[ \t\r\f\v]{1,4}|.")
_WIDE_BASE = 1 << 43


@lru_cache(maxsize=1 << 17)
def _piece_id(piece: str) -> int:
    if len(piece) == 1 and ord(piece) >= 128:
        return _WIDE_BASE + ord(piece)
    value = 1
    for char in piece:
        value = (value << 7) | ord(char)
    return value


@lru_cache(maxsize=1 << 17)
def _id_piece(token_id: int) -> str:
    if token_id >= _WIDE_BASE:
        return chr(token_id - _WIDE_BASE)
    chars: list[str] = []
    while token_id > 1:
        chars.append(chr(token_id & 0x7F))
        token_id >>= 7
    if token_id != 1:
        raise ValueError("not a token id of this tokenizer")
    return "".join(reversed(chars))


def pieces(text: str) -> list[str]:
    """The text cut into its tokens, as strings (the cheapest exact form)."""
    return PIECE.findall(text)


class SectionMemo:
    """Cuts a text given as sections into tokens, remembering each newline-ended
    section's cut (least recently used first out, at most ``max_bytes`` held).

    No piece crosses a newline, so a text's pieces are its newline-ended runs'
    pieces, one after another. A chat prompt is its earlier turn plus a few
    messages: with the memo, a turn runs the regex only over what is new, not
    over a 200,000-token context every time. A section is remembered as its
    token count and the character offset where each token starts (4 bytes a
    token), not as piece strings (some 58 bytes a token)."""

    def __init__(self, *, max_bytes: int = 192 << 20) -> None:
        self.max_bytes = max_bytes
        self._memo: OrderedDict[str, array[int]] = OrderedDict()
        self._held = 0

    def cut(self, sections: Iterable[str], *, every: int) -> tuple[int, str, list[int]]:
        """``(tokens, text, bounds)``: the token count of the sections' text, the
        text, and the character offsets where tokens ``0, every, 2*every, ...``
        start (one per full run of ``every`` tokens, and 0 first)."""
        runs: list[str] = []
        pending: list[str] = []
        for section in sections:
            pending.append(section)
            if section.endswith("\n"):
                runs.append(pending[0] if len(pending) == 1 else "".join(pending))
                pending.clear()
        cuts = [(run, self._starts(run)) for run in runs]
        if pending:  # no newline at its end: not remembered (the generation prompt ends in one)
            tail = "".join(pending)
            cuts.append((tail, _starts_of(tail)))
        tokens = chars = 0
        bounds = [0]
        due = every
        for text, starts in cuts:
            count = len(starts) - 1
            while due <= tokens + count:
                bounds.append(chars + starts[due - tokens])
                due += every
            tokens += count
            chars += len(text)
        return tokens, "".join(text for text, _ in cuts), bounds

    def _starts(self, text: str) -> array[int]:
        found = self._memo.get(text)
        if found is not None:
            self._memo.move_to_end(text)
            return found
        found = _starts_of(text)
        size = 4 * len(found) + len(text)
        if size <= self.max_bytes:
            self._memo[text] = found
            self._held += size
            while self._held > self.max_bytes:
                key, dropped = self._memo.popitem(last=False)
                self._held -= 4 * len(dropped) + len(key)
        return found


def _starts_of(text: str) -> array[int]:
    """Where each piece of ``text`` starts, and its length last."""
    return array("I", accumulate(map(len, PIECE.findall(text)), initial=0))


def count(text: str) -> int:
    return len(PIECE.findall(text))


def encode(text: str) -> list[int]:
    piece_id = _piece_id
    return [piece_id(p) for p in PIECE.findall(text)]


def decode(ids: Iterable[int]) -> str:
    try:
        return "".join([_id_piece(int(i)) for i in ids])
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"invalid token id: {exc}") from exc
