"""The first-divergence near-tie rule (soak/oracle/compare.py), case by case:
what a healthy batch-variant server does (a flip at a near tie, then its own
continuation) is explained; what a corrupt one does is named, with a sentence."""

from __future__ import annotations

import json

import pytest

from soak.oracle.answer import Answer, TokenChoice
from soak.oracle.compare import END, is_end_token, judge_answer
from soak.samples import CanaryVerdict as V

from tests.oracle.helpers import answer, plain, pos, words

M = 0.2
REF = answer(" The", pos(" cat", -0.30, (" dog", -0.35), (" cow", -2.0)), " sat", " on", " the", " mat",
             finish="length")


def judge(ref: Answer, ans: Answer, **kw) -> object:
    return judge_answer(ref, ans, tie_margin=M, **kw)


def test_the_same_tokens_match_whatever_the_logprobs() -> None:
    noisy = Answer(tuple(TokenChoice(t.token, (t.logprob or 0) - 0.013, t.top) for t in REF.tokens),
                   REF.text, REF.finish_reason, "m")
    j = judge(REF, noisy)
    assert j.verdict is V.MATCH and j.position is None


def test_a_flip_to_a_listed_near_tie_is_explained_and_the_continuation_is_not_compared() -> None:
    # The answer flipped to " dog", listed 0.05 below " cat" in the reference; then went its own way.
    ans = answer(" The", pos(" dog", -0.33, (" cat", -0.36)), " ran", " away", finish="stop")
    j = judge(REF, ans)
    assert j.verdict is V.EXPLAINED
    assert (j.position, j.reference_token, j.answer_token) == (1, " cat", " dog")
    assert j.gap == pytest.approx(0.03)
    assert "near tie" in j.reason and "position 1" in j.reason


def test_the_reference_may_be_the_one_that_flipped() -> None:
    # The answer lists nothing at the position, but the reference lists the answer's token within the margin.
    ans = answer(" The", pos(" dog", None), " ran")
    j = judge(REF, ans)
    assert j.verdict is V.EXPLAINED and j.gap == pytest.approx(0.05)


def test_a_token_listed_past_the_margin_is_corrupt_with_the_gap_in_the_sentence() -> None:
    ans = answer(" The", pos(" cow", -0.1, (" cat", -1.7)), " sat")
    j = judge(REF, ans)
    assert j.verdict is V.CORRUPT and j.position == 1
    assert j.gap == pytest.approx(1.6)
    assert j.reason == 'position 1: answered " cow" where the reference has " cat"; they are 1.6 nats apart, ' \
                       'past the 0.2 margin'


def test_a_token_nobody_listed_is_corrupt_naming_the_alternatives() -> None:
    ans = answer(" The", pos(" the", -0.2, (" a", -0.4), (" an", -0.5), (" of", -1), (" in", -2)), " sat")
    j = judge(REF, ans)
    assert j.verdict is V.CORRUPT
    assert j.reason.startswith('position 1: answered " the" where the reference has " cat"; '
                               '" cat" is not among the answer\'s 5 alternatives; " the" is not among the '
                               "reference's 3 alternatives")
    assert dict(j.alternatives)[" a"] == -0.4 and dict(j.reference_alternatives)[" dog"] == -0.35


def test_a_missing_logprob_at_the_position_explains_nothing() -> None:
    ref = answer(" a", TokenChoice(" x", None, ()), " c")
    ans = answer(" a", TokenChoice(" y", None, ()), " c")
    j = judge(ref, ans)
    assert j.verdict is V.CORRUPT and "lists no" not in j.reason and j.gap is None


def test_the_first_position_decides_even_if_later_ones_would_tie() -> None:
    ref = answer(pos(" a", -0.1), pos(" b", -0.1, (" c", -0.11)))
    ans = answer(pos(" z", -0.1), pos(" c", -0.1, (" b", -0.11)))
    assert judge(ref, ans).verdict is V.CORRUPT and judge(ref, ans).position == 0


def test_the_margin_is_inclusive() -> None:
    ref = answer(pos(" a", -1.0, (" b", -1.2)))
    ans = answer(pos(" b", -1.0, (" a", -1.2)))
    assert judge(ref, ans).verdict is V.EXPLAINED
    assert judge_answer(ref, ans, tie_margin=0.19).verdict is V.CORRUPT


# ---- length differences: ending is a choice ----

def test_an_answer_that_ended_where_the_reference_lists_an_end_token_near_is_explained() -> None:
    ref = answer(" Hi", pos(" there", -0.50, ("<|im_end|>", -0.58)), " friend", finish="stop")
    ans = answer(" Hi", finish="stop")
    j = judge(ref, ans)
    assert j.verdict is V.EXPLAINED and j.position == 1 and j.answer_token is None
    assert "the end of the answer" in j.reason


def test_an_answer_that_went_on_where_the_reference_ended_is_explained_by_its_own_logprobs() -> None:
    ref = answer(" Hi", finish="stop")
    ans = answer(" Hi", pos(" there", -0.5, ("</s>", -0.6)), " friend", finish="stop")
    assert judge(ref, ans).verdict is V.EXPLAINED


def test_an_early_stop_with_no_end_token_listed_near_is_corrupt() -> None:
    ref = answer(" Hi", pos(" there", -0.01, (" friend", -5.0)), " friend", finish="stop")
    ans = answer(" Hi", finish="stop")
    j = judge(ref, ans)
    assert j.verdict is V.CORRUPT
    assert 'answered the end of the answer where the reference has " there"' in j.reason


def test_an_end_token_listed_as_the_last_token_is_the_same_as_ending() -> None:
    ref = answer(" Hi", " there", "<|im_end|>", finish="stop")
    assert judge(ref, answer(" Hi", " there", finish="stop")).verdict is V.MATCH
    assert judge(answer(" Hi", " there", finish="stop"), ref).verdict is V.MATCH


def test_a_listed_end_token_carries_its_own_logprobs() -> None:
    ref = answer(" Hi", pos(" there", -0.50, (" you", -0.9)), finish="stop")
    ans = answer(" Hi", pos("<|eot_id|>", -0.52, (" there", -0.60)), finish="stop")
    assert judge(ref, ans).verdict is V.EXPLAINED


def test_a_length_limit_where_the_reference_went_on_is_not_a_near_tie() -> None:
    ref = plain(words("a b c d"))
    ans = plain(words("a b"))
    j = judge(ref, ans)
    assert j.verdict is V.CORRUPT and "length limit" in j.reason
    assert judge(ans, ref).verdict is V.CORRUPT


def test_the_length_limits_edge_is_a_match() -> None:
    assert judge(answer(" a", " b", finish="stop"), answer(" a", " b", finish="length")).verdict is V.MATCH
    assert judge(answer(" a", finish="stop"), answer(" a", " b", "</s>", finish="length")).verdict is not V.MATCH


@pytest.mark.parametrize("finish", [None, "abort", "error"])
def test_an_answer_cut_off_for_another_reason_agreeing_so_far_is_unjudged(finish) -> None:
    j = judge(REF, answer(" The", " cat", finish=finish))
    assert j.verdict is V.UNJUDGED and "cut off after 2 tokens" in j.reason


def test_a_cut_off_answer_that_diverged_before_its_end_is_still_judged() -> None:
    assert judge(REF, answer(" The", " xyz", finish=None)).verdict is V.CORRUPT


# ---- what cannot be judged ----

def test_a_malformed_or_empty_answer_is_unjudged_never_an_error() -> None:
    assert judge(REF, Answer(malformed="no logprobs")).verdict is V.UNJUDGED
    j = judge(REF, Answer((), "", "stop", "m"))
    assert j.verdict is V.UNJUDGED and "no tokens" in j.reason
    assert judge(Answer(malformed="x"), REF).verdict is V.UNJUDGED
    assert judge(Answer(finish_reason="stop"), Answer(finish_reason="stop")).verdict is V.MATCH


# ---- cross-talk ----

OTHER = plain(words("Paris is the capital of France and its largest city"))


def test_an_answer_that_is_another_canarys_reference_is_crosstalk_naming_it() -> None:
    j = judge(REF, OTHER, others={"geo": OTHER, "x": plain(words("unrelated text here"))})
    assert j.verdict is V.CROSSTALK and j.crosstalk_with == "geo"
    assert "canary geo's reference" in j.reason and j.position == 0


def test_crosstalk_needs_eight_tokens_or_the_whole_answer() -> None:
    ans = plain(words("Paris is the capital of Spain and its"))  # 5 tokens agree
    assert judge(REF, ans, others={"geo": OTHER}).verdict is V.CORRUPT
    short = plain(words("Paris is"))
    assert judge(REF, short, others={"geo": plain(words("Paris is"))}).verdict is V.CROSSTALK


def test_a_shared_opening_names_no_one() -> None:
    # Two canaries whose references open alike: a corruption after the opening is not cross-talk.
    mine = plain(words("Sure here is the answer to your question about cats"))
    theirs = plain(words("Sure here is the answer to your question about dogs"))
    ans = plain(words("Sure here is the answer to your question qqq zzz"))
    assert judge(mine, ans, others={"dogs": theirs}).verdict is V.CORRUPT


def test_an_explained_divergence_is_never_crosstalk() -> None:
    ans = answer(" The", pos(" dog", -0.33, (" cat", -0.36)), " ran")
    assert judge(REF, ans, others={"x": ans}).verdict is V.EXPLAINED


def test_the_judgement_serializes() -> None:
    j = judge(REF, answer(" The", pos(" cow", -0.1, (" cat", -1.7))))
    out = json.loads(json.dumps(j.to_json(), allow_nan=False))
    assert out["verdict"] == "corrupt" and out["position"] == 1 and out["alternatives"][0] == [" cow", -0.1]


@pytest.mark.parametrize("token,end", [("", True), ("</s>", True), ("<|im_end|>", True), ("<|eot_id|>", True),
                                       ("<end_of_turn>", True), ("<｜end▁of▁sentence｜>", True), (" ", False),
                                       (" the", False), ("<", False), ("a<b>", False)])
def test_end_tokens(token, end) -> None:
    assert is_end_token(token) is end
    assert repr(END) == "END"
