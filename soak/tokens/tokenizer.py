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
