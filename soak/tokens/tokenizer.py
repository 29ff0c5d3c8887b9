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
import sys
from collections import OrderedDict
from functools import lru_cache
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


class PiecesMemo:
    """``pieces`` of a text given as sections, remembering each newline-ended
    section's pieces (least recently used first out, at most ``max_pieces``).

    No piece crosses a newline, so the pieces of a text are the pieces of its
    newline-ended runs, concatenated. A chat prompt is its earlier turn plus a
    few messages: with the memo, a turn costs the regex only over what is new,
    not over a 200,000-token context every time. Pieces are interned, so the
    memo holds a pointer per token, not a string."""

    def __init__(self, *, max_pieces: int = 8_000_000) -> None:
        self.max_pieces = max_pieces
        self._memo: OrderedDict[str, list[str]] = OrderedDict()
        self._held = 0

    def pieces(self, sections: Iterable[str]) -> list[str]:
        out: list[str] = []
        pending: list[str] = []
        for section in sections:
            pending.append(section)
            if section.endswith("\n"):
                out += self._lookup(pending[0] if len(pending) == 1 else "".join(pending))
                pending.clear()
        if pending:
            out += PIECE.findall("".join(pending))
        return out

    def _lookup(self, text: str) -> list[str]:
        found = self._memo.get(text)
        if found is not None:
            self._memo.move_to_end(text)
            return found
        found = [sys.intern(p) for p in PIECE.findall(text)]
        if len(found) <= self.max_pieces:
            self._memo[text] = found
            self._held += len(found)
            while self._held > self.max_pieces:
                _, dropped = self._memo.popitem(last=False)
                self._held -= len(dropped)
        return found


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
