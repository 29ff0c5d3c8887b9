"""Shared builders for the oracle's tests: answers from a compact spelling."""

from __future__ import annotations

from typing import Iterable, Sequence

from soak.oracle.answer import Answer, TokenChoice

Alt = tuple[str, float]


def pos(token: str, logprob: float | None = -0.1, *alts: Alt) -> TokenChoice:
    """One position: the chosen token, its logprob, and the alternatives listed
    there (the chosen one first, as vLLM lists it, unless it is among ``alts``)."""
    top: list[Alt] = list(alts)
    if logprob is not None and all(t != token for t, _ in top):
        top.insert(0, (token, logprob))
    return TokenChoice(token, logprob, tuple(sorted(top, key=lambda a: -a[1])))


def answer(*positions: TokenChoice | str, finish: str | None = "length", model: str | None = "m") -> Answer:
    """An answer of ``positions`` (a bare string is a confident token with no rival)."""
    tokens = tuple(p if isinstance(p, TokenChoice) else pos(p) for p in positions)
    return Answer(tokens, "".join(t.token for t in tokens), finish, model)


def words(text: str) -> list[str]:
    """`` the cat sat`` as tokens ``[" the", " cat", " sat"]``."""
    return [" " + w for w in text.split()]


def plain(tokens: Iterable[str], finish: str | None = "length") -> Answer:
    return answer(*tokens, finish=finish)


def texts(a: Answer) -> Sequence[str]:
    return a.token_texts
