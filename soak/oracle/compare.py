"""The first-divergence near-tie rule: one canary answer judged against its reference.

A greedy server that is not batch-invariant computes each logit with a little
noise that depends on the batch, so its argmax flips where the top two tokens
are nearly tied, and the continuation then follows the new token. A string
compare would cry wolf at every such flip; this rule asks the server's own
logprobs instead (docs/oracle.md derives its false-alarm rate):

- equal token sequences are a MATCH;
- otherwise, at the first differing position ``i`` (a length difference counts:
  ``i`` is the shorter length), the divergence is EXPLAINED iff the logprobs at
  ``i`` show a near tie between the two choices there: the reference's token is
  among the answer's alternatives within ``tie_margin`` nats of the answer's
  token, or the answer's token among the reference's alternatives within
  ``tie_margin`` of the reference's token (the reference may be the one that
  flipped). Past ``i`` nothing is compared: the continuation follows the new
  token. A logprob missing at ``i`` explains nothing;
- an unexplained divergence whose answer is another canary's reference from its
  first token on is CROSSTALK (another request's tokens reached this one);
  any other unexplained divergence is CORRUPT, with a sentence a person reads.

Ending is a choice too. An answer that finished ``stop`` chose to end after its
last token (the end-of-sequence token, which servers mostly leave out of the
logprobs, or list as ``<|im_end|>``, ``</s>``, ``""``...). So where one side
ended and the other went on, the near tie sought is between ending and the other
side's token: the longer side's alternatives at ``i`` must list an end token
within the margin (the shorter side has no logprobs at ``i`` unless it listed its
end token). A side cut short by its length limit made no choice at ``i``: with
both asked the same ``max_tokens`` (the reference file records it) a length
limit that ends one side where the other went on explains nothing, except at the
edge where the other side's only extra choice was to end. A side cut short for
any other reason (``abort``, none given) cannot be judged past its end: UNJUDGED.

Pure and total: any two ``Answer`` values give a ``Judgement``, never an exception.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from soak.oracle.answer import Answer, TokenChoice
from soak.samples import CanaryVerdict

# Cross-talk: the answer must follow another canary's reference from its first
# token over at least this many tokens (or wholly, when either is shorter).
CROSSTALK_MIN_TOKENS = 8
# Float slack on the margin: a gap computed as a difference of two logprobs may
# land an ulp past a margin it equals.
_SLACK = 1e-9
# How much of a token a sentence shows.
_SHOWN_CHARS = 40

# An end-of-sequence token as a tokenizer decodes it: empty (special tokens
# skipped) or a short special-token shape: </s>, <eos>, <|im_end|>, <|eot_id|>,
# <|endoftext|>, <end_of_turn>, <｜end▁of▁sentence｜>.
_END_TOKEN = re.compile(r"<[|｜]?/?[A-Za-z0-9_.:▁|｜-]{1,40}[|｜]?>")


def is_end_token(token: str) -> bool:
    """Whether ``token`` reads as an end-of-sequence token."""
    return token == "" or bool(_END_TOKEN.fullmatch(token))


class _End:
    """The choice to end the answer (a finish of ``stop``)."""

    def __repr__(self) -> str:
        return "END"


END = _End()
Choice = Any  # str | _End | None (None: no choice made, the side was cut short)


@dataclass(frozen=True)
class Judgement:
    """What the rule made of one answer, with what a person needs to check it:
    the first differing position, both tokens there (None: that side ended or was
    cut there), the gap between them in nats where a side's logprobs list both,
    and the alternatives each side listed there."""

    verdict: CanaryVerdict
    position: int | None = None
    reference_token: str | None = None
    answer_token: str | None = None
    gap: float | None = None
    alternatives: tuple[tuple[str, float], ...] = ()
    crosstalk_with: str | None = None
    reason: str = ""
    # Additive: the chosen tokens' own logprobs and the reference's alternatives at ``position``.
    answer_logprob: float | None = None
    reference_logprob: float | None = None
    reference_alternatives: tuple[tuple[str, float], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "position": self.position,
            "reference_token": self.reference_token,
            "answer_token": self.answer_token,
            "gap": self.gap,
            "alternatives": [[t, lp] for t, lp in self.alternatives],
            "crosstalk_with": self.crosstalk_with,
            "reason": self.reason,
            "answer_logprob": self.answer_logprob,
            "reference_logprob": self.reference_logprob,
            "reference_alternatives": [[t, lp] for t, lp in self.reference_alternatives],
        }


@dataclass(frozen=True)
class _Side:
    """One answer as the rule reads it: the tokens chosen (an end token listed
    last taken off), whether it chose to end after them, and the end token's own
    position where the server listed it."""

    body: tuple[TokenChoice, ...]
    ended: bool
    end_position: TokenChoice | None
    finish: str | None

    @classmethod
    def of(cls, answer: Answer) -> "_Side":
        tokens = tuple(answer.tokens)
        ended = answer.finish_reason == "stop"
        if ended and tokens and is_end_token(tokens[-1].token):
            return cls(tokens[:-1], True, tokens[-1], answer.finish_reason)
        return cls(tokens, ended, None, answer.finish_reason)

    def choice(self, i: int) -> Choice:
        if i < len(self.body):
            return self.body[i].token
        return END if i == len(self.body) and self.ended else None

    def position(self, i: int) -> TokenChoice | None:
        if i < len(self.body):
            return self.body[i]
        return self.end_position if i == len(self.body) else None


def usable(answer: Answer) -> str | None:
    """Why ``answer`` cannot be judged or serve as a reference, or None."""
    if answer.malformed:
        return f"malformed: {answer.malformed}"
    if not answer.tokens:
        return f"no tokens (finish_reason {answer.finish_reason!r})"
    return None


def show(choice: Choice) -> str:
    """A token as a sentence shows it: quoted, whitespace visible, bounded."""
    if choice is END:
        return "the end of the answer"
    if choice is None:
        return "nothing"
    text = str(choice).encode("utf-8", "replace").decode("utf-8")
    shown = json.dumps(text[:_SHOWN_CHARS], ensure_ascii=False)
    return shown + ("…" if len(text) > _SHOWN_CHARS else "")


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def _listed(top: tuple[tuple[str, float], ...], choice: Choice) -> float | None:
    """The logprob ``top`` lists for ``choice`` (for END: its likeliest end token)."""
    found = [_finite(lp) for tok, lp in top
             if (is_end_token(tok) if choice is END else tok == choice)]
    found = [lp for lp in found if lp is not None]
    return max(found) if found else None


def _gap(position: TokenChoice | None, chosen: Choice, other: Choice) -> float | None:
    """|logprob(chosen) - logprob(other)| as one side's logprobs give them at one position."""
    if position is None or other is None:
        return None
    own = _finite(position.logprob)
    if own is None:
        own = _listed(position.top, chosen)
    theirs = _listed(position.top, other)
    return None if own is None or theirs is None else abs(own - theirs)


def _token_text(choice: Choice) -> str | None:
    return choice if isinstance(choice, str) else None


def _common_prefix(a: tuple[TokenChoice, ...], b: tuple[TokenChoice, ...]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x.token != y.token:
            break
        n += 1
    return n


def judge_answer(reference: Answer, answer: Answer, *, tie_margin: float,
                 others: Mapping[str, Answer] = {}) -> Judgement:  # noqa: B006 (read only)
    """``answer`` judged against ``reference`` by the first-divergence near-tie
    rule (module docstring); ``others`` are the other canaries' references by id,
    for cross-talk."""
    why = usable(answer)
    if answer.malformed or (why is not None and reference.tokens):
        return Judgement(CanaryVerdict.UNJUDGED, reason=f"the answer is unusable: {why}")
    if reference.malformed:
        return Judgement(CanaryVerdict.UNJUDGED, reason=f"the reference is unusable: malformed: {reference.malformed}")
    ref, ans = _Side.of(reference), _Side.of(answer)
    i = _common_prefix(ref.body, ans.body)
    if answer.token_texts == reference.token_texts or i == len(ref.body) == len(ans.body):
        # The same tokens (an end token one side listed apart): the finish
        # reason alone is no divergence (at the length limit's edge, ending
        # and being cut look alike).
        note = "" if ref.finish == ans.finish else \
            f" (finish_reason {ans.finish!r} where the reference's is {ref.finish!r})"
        return Judgement(CanaryVerdict.MATCH, reason=f"the same {len(answer.tokens)} tokens as the reference{note}")
    x, y = ans.choice(i), ref.choice(i)
    at_a, at_r = ans.position(i), ref.position(i)
    where = dict(position=i, reference_token=_token_text(y), answer_token=_token_text(x),
                 alternatives=at_a.top if at_a else (), reference_alternatives=at_r.top if at_r else (),
                 answer_logprob=_finite(at_a.logprob) if at_a else None,
                 reference_logprob=_finite(at_r.logprob) if at_r else None)
    cut = _cut(ans, ref, x, y, i)
    if cut is not None:
        verdict, reason = cut
        if verdict is not CanaryVerdict.CORRUPT:
            return Judgement(verdict, reason=reason, **where)
        return _unexplained(answer, i, others, reason, where, None)
    gaps = [g for g in (_gap(at_a, x, y), _gap(at_r, y, x)) if g is not None]
    best = min(gaps) if gaps else None
    if best is not None and best <= tie_margin + _SLACK:
        return Judgement(CanaryVerdict.EXPLAINED, gap=best, **where,
                         reason=f"position {i}: answered {show(x)} where the reference has {show(y)}, "
                                f"a near tie ({best:.3g} nats apart, within the {tie_margin:g} margin)")
    return _unexplained(answer, i, others, _corrupt_reason(i, x, y, ans, ref, best, tie_margin), where, best)


def _cut(ans: _Side, ref: _Side, x: Choice, y: Choice, i: int) -> tuple[CanaryVerdict, str] | None:
    """The verdict where a side made no choice at ``i`` (it was cut short), or None."""
    # Both cut at one length cannot reach here: equal bodies are a MATCH.
    if x is not None and y is not None:
        return None
    side, other, other_choice, name = (ans, ref, y, "answer") if x is None else (ref, ans, x, "reference")
    if side.finish == "length":
        if other_choice is END:  # the budget's edge: one spent its last choice on ending
            return CanaryVerdict.MATCH, f"the same {i} tokens as the reference; the {name} hit its length limit " \
                                        f"where the other ended"
        return CanaryVerdict.CORRUPT, (
            f"position {i}: the {name} stopped at its length limit where the "
            f"{'reference' if name == 'answer' else 'answer'} went on with {show(other_choice)} "
            f"(both asked the same max_tokens: a length limit is not a near tie)")
    return CanaryVerdict.UNJUDGED, (f"the {name} was cut off after {i} tokens (finish_reason {side.finish!r}), "
                                    f"agreeing with the {'reference' if name == 'answer' else 'answer'} up to there")


def _corrupt_reason(i: int, x: Choice, y: Choice, ans: _Side, ref: _Side, best: float | None,
                    tie_margin: float) -> str:
    head = f"position {i}: answered {show(x)} where the reference has {show(y)}"
    if best is not None:
        return f"{head}; they are {best:.3g} nats apart, past the {tie_margin:g} margin"
    parts = []
    for side, name, missing, chosen in ((ans, "answer", y, x), (ref, "reference", x, y)):
        pos = side.position(i)
        if pos is None:
            parts.append(f"the {name} lists no logprobs there")
        elif _listed(pos.top, missing) is None:
            parts.append(f"{show(missing)} is not among the {name}'s {len(pos.top)} alternatives")
        else:
            parts.append(f"the {name} gives no logprob for {show(chosen)}")
    return f"{head}; " + "; ".join(parts)


def _unexplained(answer: Answer, i: int, others: Mapping[str, Answer], reason: str, where: dict[str, Any],
                 gap: float | None) -> Judgement:
    """CROSSTALK when the answer is another canary's reference from its first token on, else CORRUPT."""
    best_id, best_n = None, 0
    for other_id in sorted(others, key=str):
        other = others[other_id]
        if not isinstance(other, Answer) or usable(other) is not None:
            continue
        n = _common_prefix(answer.tokens, other.tokens)
        need = min(CROSSTALK_MIN_TOKENS, len(answer.tokens), len(other.tokens))
        # Past ``i``: it follows the other reference further than its own (two
        # references may share an opening; that alone names no one).
        if n >= need and n > i and n > best_n:
            best_id, best_n = other_id, n
    if best_id is not None:
        return Judgement(CanaryVerdict.CROSSTALK, crosstalk_with=str(best_id), gap=gap, **where,
                         reason=f"{reason}; the answer is canary {best_id}'s reference over its first "
                                f"{best_n} tokens: that request's tokens reached this one")
    return Judgement(CanaryVerdict.CORRUPT, gap=gap, reason=reason, **where)


__all__ = ["CROSSTALK_MIN_TOKENS", "END", "Judgement", "is_end_token", "judge_answer", "show", "usable"]
