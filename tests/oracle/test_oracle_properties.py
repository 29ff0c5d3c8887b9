"""The near-tie rule's invariants as properties, over answers no case lists:
(a) the same tokens are a MATCH; (b) a divergence at a listed near tie is
EXPLAINED whatever follows; (c) one at no near tie is CORRUPT or CROSSTALK,
never MATCH or EXPLAINED; the rule is symmetric; (d) the readers and the judge
are total over arbitrary JSON."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soak.oracle.answer import Answer, TokenChoice, answer_from_body
from soak.oracle.compare import Judgement, judge_answer
from soak.samples import CanaryVerdict as V

from tests.oracle.strategies import FINISH, LOGPROB, MARGIN, TOKENS, answers, positions, wide_answers

PROPS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

def _with_logprobs_moved(a: Answer, shift: float) -> Answer:
    return Answer(tuple(TokenChoice(t.token, None if t.logprob is None else t.logprob + shift,
                                    tuple((k, v + shift) for k, v in t.top)) for t in a.tokens),
                  a.text, a.finish_reason, a.model)


@PROPS
@given(answers(), st.floats(min_value=-1, max_value=1), MARGIN, FINISH)
def test_a_the_same_tokens_are_a_match(ref, shift, margin, finish) -> None:
    same = _with_logprobs_moved(ref, shift)
    same = Answer(same.tokens, same.text, finish if ref.tokens else ref.finish_reason, "other")
    assert judge_answer(ref, same, tie_margin=margin).verdict is V.MATCH


@st.composite
def diverging(draw, near: bool):
    """(reference, answer, margin, i): the answer follows the reference up to
    ``i``, then takes another token, listed there within the margin (``near``)
    on one side or not within it on either; then anything."""
    margin = draw(MARGIN)
    ref = draw(answers(min_size=1))
    i = draw(st.integers(0, len(ref.tokens) - 1))
    r = ref.tokens[i]
    b = draw(TOKENS.filter(lambda t: t != r.token))
    lp_b = draw(LOGPROB)
    side = draw(st.sampled_from(["answer", "reference"]))
    if near:
        gap = draw(st.floats(min_value=0, max_value=margin)) if margin > 0 else 0.0
        other = lp_b - gap if draw(st.booleans()) else lp_b + gap
    ans_top = {t: lp for t, lp in draw(st.lists(st.tuples(TOKENS, LOGPROB), max_size=4)) if t != r.token}
    ref_top = {t: lp for t, lp in r.top if t != b}
    if near and side == "answer":
        ans_top[r.token] = other
    elif near:  # the reference lists the answer's token near its own
        lp_r = r.logprob if r.logprob is not None else -1.0
        ref_top[b] = lp_r - gap
    elif draw(st.booleans()):  # both listed, but past the margin on both sides
        far = draw(st.floats(min_value=margin + 0.01, max_value=margin + 20))
        ans_top[r.token] = lp_b - far
        ref_top[b] = (r.logprob if r.logprob is not None else -1.0) - far
    ans_top[b] = lp_b
    ref_pos = TokenChoice(r.token, r.logprob, tuple(ref_top.items()))
    ref = Answer(ref.tokens[:i] + (ref_pos,) + ref.tokens[i + 1:], ref.text, ref.finish_reason, "m")
    head = tuple(TokenChoice(t.token, draw(LOGPROB), ()) for t in ref.tokens[:i])
    tail = tuple(draw(st.lists(positions(), max_size=8)))
    ans = Answer(head + (TokenChoice(b, lp_b, tuple(ans_top.items())),) + tail, "", draw(FINISH), "m")
    return ref, ans, margin, i


@PROPS
@given(diverging(near=True), st.dictionaries(st.text(max_size=4), answers(), max_size=3))
def test_b_a_divergence_at_a_listed_near_tie_is_explained_whatever_follows(case, others) -> None:
    ref, ans, margin, i = case
    j = judge_answer(ref, ans, tie_margin=margin, others=others)
    assert j.verdict is V.EXPLAINED, j.reason
    assert j.position == i and j.gap is not None and j.gap <= margin + 1e-9


@PROPS
@given(diverging(near=False), st.dictionaries(st.text(max_size=4), answers(), max_size=3))
def test_c_a_divergence_at_no_near_tie_is_corrupt_or_crosstalk(case, others) -> None:
    ref, ans, margin, i = case
    j = judge_answer(ref, ans, tie_margin=margin, others=others)
    assert j.verdict in (V.CORRUPT, V.CROSSTALK), j.reason
    assert j.position == i and j.reason.startswith(f"position {i}: ")
    if j.verdict is V.CROSSTALK:
        other = others[j.crosstalk_with]
        assert other.token_texts[:min(8, len(ans.tokens))] == ans.token_texts[:min(8, len(other.tokens))]


@PROPS
@given(answers(min_size=1), answers(min_size=1), MARGIN)
def test_the_rule_is_symmetric(a, b, margin) -> None:
    # Which of two answers is the reference changes no verdict (the reference may be the one that flipped).
    assert judge_answer(a, b, tie_margin=margin).verdict is judge_answer(b, a, tie_margin=margin).verdict


@PROPS
@given(wide_answers(), wide_answers(), MARGIN)
def test_the_rule_is_symmetric_also_where_answers_end_or_are_cut(a, b, margin) -> None:
    assert judge_answer(a, b, tie_margin=margin).verdict is judge_answer(b, a, tie_margin=margin).verdict


@PROPS
@given(answers(min_size=1), answers(), MARGIN)
def test_match_exactly_when_the_tokens_agree(a, b, margin) -> None:
    j = judge_answer(a, b, tie_margin=margin)
    if b.tokens:
        assert (j.verdict is V.MATCH) == (a.token_texts == b.token_texts)
    if j.verdict in (V.EXPLAINED, V.CORRUPT, V.CROSSTALK):
        assert j.position is not None and a.token_texts[:j.position] == b.token_texts[:j.position]


@PROPS
@given(answers(min_size=1), st.integers(0, 11), MARGIN)
def test_a_larger_margin_never_takes_an_explanation_back(a, cut, margin) -> None:
    b = Answer(a.tokens[:cut] + tuple(reversed(a.tokens[cut:])), "", a.finish_reason, "m")
    small = judge_answer(a, b, tie_margin=margin).verdict
    large = judge_answer(a, b, tie_margin=margin + 1).verdict
    if small in (V.MATCH, V.EXPLAINED):
        assert large is small


# ---- (d) totality over arbitrary JSON ----

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-10**400, max_value=10**400) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30)
# Past a float's range too: JSON's integers are unbounded, and float() of 10**400 raises.
NUMBERISH = st.one_of(LOGPROB, st.floats(), st.sampled_from([10**400, -10**400, 2**1024, 1e308, -0.0]),
                      st.integers(-10**400, 10**400), st.booleans(), st.none(), JSON)


@st.composite
def bodies(draw) -> object:
    """Chat and completions bodies of the right shape down to hostile leaves (most
    draws), or any JSON at all: the readers' inner paths are exercised too, not
    only their first check."""
    leaf_token = st.one_of(TOKENS, TOKENS, JSON)
    entry = st.fixed_dictionaries({"token": leaf_token, "logprob": NUMBERISH,
                                   "top_logprobs": st.one_of(st.lists(st.fixed_dictionaries(
                                       {"token": leaf_token, "logprob": NUMBERISH}), max_size=4), JSON)})
    chat = st.fixed_dictionaries({"content": st.lists(st.one_of(entry, entry, entry, JSON), max_size=6)})
    completion = st.fixed_dictionaries({
        "tokens": st.lists(leaf_token, max_size=6),
        "token_logprobs": st.lists(NUMBERISH, max_size=6),
        "top_logprobs": st.lists(st.one_of(st.dictionaries(TOKENS, NUMBERISH, max_size=4), JSON), max_size=6)})
    choice = st.fixed_dictionaries({"logprobs": st.one_of(chat, completion, chat, completion, JSON),
                                    "finish_reason": st.one_of(FINISH, JSON),
                                    "message": st.one_of(st.fixed_dictionaries({"content": JSON}), JSON),
                                    "text": JSON})
    shaped = st.fixed_dictionaries({"model": JSON, "choices": st.lists(choice, min_size=1, max_size=2)})
    return draw(st.one_of(shaped, shaped, shaped, JSON))


def _checked(j: Judgement) -> None:
    assert isinstance(j, Judgement) and isinstance(j.verdict, V) and isinstance(j.reason, str)
    json.dumps(j.to_json(), allow_nan=False)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies(), bodies(), JSON, MARGIN)
def test_d_the_readers_and_the_judge_are_total(x, y, z, margin) -> None:
    a, b = answer_from_body(x), answer_from_body(y)
    stored = Answer.from_json(z)
    again = Answer.from_json(json.loads(json.dumps(a.to_json(), allow_nan=False)))
    assert again == a or a.malformed  # what the reader kept survives the record's round trip
    for ref, ans in ((a, b), (b, a), (stored, a), (a, stored)):
        _checked(judge_answer(ref, ans, tie_margin=margin, others={"o": stored, "p": b}))
