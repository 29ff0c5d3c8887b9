"""The reference book (soak/oracle/book.py): the first good answer of a canary
is this run's reference; a recorded one wins over it; a wrong answer is never
recorded as right; cross-talk is sought among every other canary's reference."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soak.oracle.answer import Answer
from soak.oracle.book import ReferenceBook
from soak.samples import CanaryVerdict as V

from tests.oracle.helpers import answer, plain, pos, words
from tests.oracle.strategies import answers

A = plain(words("one two three four five six seven eight nine"))
B = plain(words("alpha beta gamma delta epsilon zeta eta theta iota"))
NEAR = answer(" one", pos(" deux", -0.30, (" two", -0.32)), " x")


def test_the_first_answer_is_the_reference_and_later_ones_are_judged_against_it() -> None:
    book = ReferenceBook(tie_margin=0.2)
    assert book.source("a") is None
    assert book.judge("a", A).verdict is V.REFERENCE
    assert book.source("a") == "run"
    assert book.judge("a", A).verdict is V.MATCH
    assert book.judge("a", NEAR).verdict is V.EXPLAINED
    assert book.judge("a", plain(words("one zzz"))).verdict is V.CORRUPT
    assert book.references() == {"a": A}


def test_a_recorded_reference_wins_over_the_runs_own() -> None:
    book = ReferenceBook(tie_margin=0.2, recorded={"a": A})
    assert book.source("a") == "file"
    j = book.judge("a", B)  # the run's first answer is wrong: judged, never adopted
    assert j.verdict is V.CORRUPT
    assert book.source("a") == "file" and book.references() == {}
    assert book.judge("a", A).verdict is V.MATCH
    assert book.references() == {"a": A}  # this build's own first good answer, for the record


def test_an_answer_that_cannot_be_judged_is_never_adopted() -> None:
    book = ReferenceBook(tie_margin=0.2, recorded={"bad": Answer(malformed="x"), "empty": Answer()})
    assert book.ignored == ("bad", "empty") and book.source("bad") is None
    j = book.judge("a", Answer(malformed="no logprobs"))
    assert j.verdict is V.UNJUDGED and "cannot be one" in j.reason
    assert book.judge("a", Answer((), "", "stop")).verdict is V.UNJUDGED
    assert book.source("a") is None
    assert book.judge("a", A).verdict is V.REFERENCE


def test_crosstalk_is_sought_among_every_other_canarys_reference() -> None:
    book = ReferenceBook(tie_margin=0.2, recorded={"b": B})
    book.judge("a", A)
    j = book.judge("a", B)
    assert j.verdict is V.CROSSTALK and j.crosstalk_with == "b"
    j = book.judge("b", A)
    assert j.verdict is V.CROSSTALK and j.crosstalk_with == "a"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.one_of(answers(), st.just(Answer(malformed="m")))),
                max_size=12),
       st.dictionaries(st.sampled_from(["a", "b", "z"]), answers(), max_size=2))
def test_the_book_over_any_sequence_of_answers(events, recorded) -> None:
    book = ReferenceBook(tie_margin=0.2, recorded=recorded)
    recorded_ok = {k for k, v in recorded.items() if v.tokens}
    references: dict[str, Answer] = {}
    for cid, ans in events:
        j = book.judge(cid, ans)
        if cid in recorded_ok:
            assert j.verdict is not V.REFERENCE and book.source(cid) == "file"
        elif cid not in references and ans.tokens and not ans.malformed:
            assert j.verdict is V.REFERENCE
            references[cid] = ans
        else:
            assert j.verdict is not V.REFERENCE
        if cid in references:
            assert book.source(cid) == "run"
        if ans.token_texts == (book.reference(cid) or Answer()).token_texts and ans.tokens and not ans.malformed:
            assert j.verdict in (V.REFERENCE, V.MATCH)
    for cid, ref in book.references().items():
        assert ref.tokens and not ref.malformed
        if cid in references:
            assert ref is references[cid]
