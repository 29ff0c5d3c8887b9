"""The degenerate-text detector (soak.load.degenerate): total over any text,
bounded in memory, flags every short-period loop, and leaves natural text and
the simulator's healthy answers alone."""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soak.load import degenerate as dg
from soak.load.degenerate import DegenerateText, periodic_tail
from soak.load.sse import SSEDecoder
from soak.sim import greedy
from soak.sim.greedy import WORDS
from soak.workload.config import StdlibCorpus
from soak.workload.corpus import load_corpus

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REPO = Path(__file__).resolve().parents[2]
VERDICTS = {None, dg.REPETITION, dg.REPLACEMENT_CHAR, dg.UNDECODABLE}
# Any character, lone surrogates included (a JSON "\ud800" escape makes one).
ANY_CHAR = st.characters(codec=None, exclude_categories=())
HELD_BOUND = 2 * dg.WINDOW + dg.CHECK_EVERY + dg.MAX_PERIOD + 16


def fed(text: str, rng: random.Random, *, most: int = 24) -> DegenerateText:
    """``text`` fed as a stream would: in deltas of 1..``most`` characters."""
    detector = DegenerateText()
    i = 0
    while i < len(text):
        step = rng.randint(1, most)
        detector.feed(text[i:i + step])
        assert detector.held <= HELD_BOUND
        i += step
    return detector


def span_for(period: int) -> int:
    return max(dg.MIN_REPEATS * period, dg.MIN_SPAN)


@SETTINGS
@given(st.lists(st.text(alphabet=ANY_CHAR, max_size=3000), max_size=12), st.integers(0, 2**32))
def test_the_detector_is_total_and_bounded_over_any_text(pieces, seed) -> None:
    detector = DegenerateText()
    rng = random.Random(seed)
    for piece in pieces:
        for _ in range(rng.randint(1, 3)):  # the same text again: loops of any length
            detector.feed(piece)
            assert detector.held <= HELD_BOUND
    assert detector.verdict in VERDICTS
    assert detector.held <= HELD_BOUND


def test_memory_stays_bounded_over_a_long_answer() -> None:
    rng = random.Random(7)
    text = "".join(rng.choice(WORDS) + rng.choice(("", ",", ".\n")) for _ in range(120_000))
    detector = fed(text, rng)
    assert len(text) > 100 * HELD_BOUND and detector.held <= HELD_BOUND
    one = DegenerateText()
    one.feed(text)  # one delta of it all: the detector keeps the end only
    assert one.held <= HELD_BOUND


@SETTINGS
@given(st.text(alphabet=ANY_CHAR, max_size=400), st.text(min_size=1, max_size=dg.MAX_PERIOD),
       st.integers(0, 3), st.integers(0, 2**32))
def test_any_text_ending_in_a_short_unit_repeated_enough_is_a_loop(prefix, unit, more, seed) -> None:
    unit = unit.encode("utf-8", "replace").decode("utf-8")  # a loop of text (surrogates are their own verdict)
    reps = -(-span_for(len(unit)) // len(unit)) + 1 + more
    detector = fed(prefix + unit * reps, random.Random(seed))
    verdict = detector.verdict
    if verdict == dg.REPETITION:
        period, covered = detector.loop
        assert len(unit) % period == 0 and covered >= span_for(period)
    else:  # only a verdict that outranks it: the prefix's own bytes
        assert verdict in (dg.UNDECODABLE, dg.REPLACEMENT_CHAR), verdict


@SETTINGS
@given(st.text(min_size=1, max_size=dg.MAX_PERIOD).filter(lambda u: u.isascii()),
       st.text(alphabet=st.characters(max_codepoint=0x7E), max_size=3000), st.integers(0, 2**32))
def test_a_loop_the_answer_leaves_again_is_still_seen(unit, after, seed) -> None:
    """A loop mid-answer, long enough to meet a check (span + CHECK_EVERY + one
    delta), then any text: the mark is sticky."""
    reps = -(-(span_for(len(unit)) + dg.CHECK_EVERY + 2 * 24) // len(unit)) + 1
    detector = fed("Sure. " + unit * reps + after, random.Random(seed))
    assert detector.verdict == dg.REPETITION


def test_the_issues_loops_are_loops() -> None:
    rng = random.Random(3)
    for text in ("can " * 60, "Hello!! How can can I helpHello How I" * 12,
                 "The answer is 42.\n" * 20, "!" * 300, "<|im_end|>" * 40):
        assert fed("Here it is: " + text, rng).verdict == dg.REPETITION, text[:40]


def test_short_repeats_are_ordinary_text() -> None:
    """Below MIN_SPAN: doubled words, a rule, a small literal table, a few equal lines."""
    rng = random.Random(4)
    for text in ("I had had enough, that that was it. " * 3, "-" * 80 + "\n", "x = [0, 0, 0, 0, 0, 0, 0, 0]\n",
                 "    pass\n" * 6, "ha ha ha ha"):
        assert fed(text, rng).verdict is None, text
    assert periodic_tail("ab" * 99) is None and periodic_tail("ab" * 100) == (2, 200)


def test_a_period_longer_than_max_period_is_not_a_loop() -> None:
    """The trade-off, pinned: a paragraph repeated is not flagged."""
    rng = random.Random(5)
    unit = "".join(rng.choice("abcdefgh ") for _ in range(dg.MAX_PERIOD + 1))
    assert fed(unit * 30, rng).verdict is None
    # The old simulator's healthy text was such a cycle: 76 distinct words, 317 characters.
    assert len("".join(WORDS)) > dg.MAX_PERIOD
    assert fed("".join(WORDS) * 40, rng).verdict is None


def greedy_answer(prompt: str, tokens: int) -> str:
    """The simulator's healthy greedy answer to ``prompt`` (soak.sim.greedy: the top
    token at each state, the state advanced by it)."""
    state = greedy.prompt_digest(prompt)
    words = []
    for _ in range(tokens):
        token = greedy.top_of(state)
        words.append(WORDS[token])
        state = greedy.advance(state, token)
    return "".join(words)


@SETTINGS
@given(st.text(max_size=40), st.integers(1, 16_384), st.integers(1, 64))
def test_the_simulators_healthy_answers_are_not_degenerate(prompt, tokens, most) -> None:
    assert fed(greedy_answer(prompt, tokens), random.Random(tokens), most=most).verdict is None


def test_natural_text_from_the_workload_corpus_and_the_repo_is_not_degenerate() -> None:
    """The workload's default corpus (the standard library's source, its first
    2 MB) and this repository's docs and code, streamed in small deltas."""
    rng = random.Random(6)
    corpus = load_corpus(StdlibCorpus(max_bytes=2_000_000))
    texts = {f"stdlib:{f.name}": "".join(f.lines) for f in corpus.files}
    for path in sorted((REPO / "docs").rglob("*.md")) + sorted((REPO / "soak").rglob("*.py")):
        texts[str(path.relative_to(REPO))] = path.read_text(encoding="utf-8")
    flagged = [name for name, text in texts.items() if fed(text, rng).verdict is not None]
    assert len(texts) > 300 and sum(map(len, texts.values())) > 3_000_000
    assert flagged == [], flagged


@SETTINGS
@given(st.text(alphabet=st.characters(max_codepoint=0x7E), max_size=500),
       st.integers(0, 12), st.integers(0, 2**32))
def test_replacement_characters_past_a_few_mark_the_answer(text, count, seed) -> None:
    rng = random.Random(seed)
    chars = list(text)
    for _ in range(count):
        chars.insert(rng.randint(0, len(chars)), "\ufffd")
    detector = fed("".join(chars), rng)
    if count > dg.MAX_REPLACEMENTS:
        assert detector.verdict == dg.REPLACEMENT_CHAR
    else:
        assert detector.verdict in (None, dg.REPETITION)


def test_text_that_does_not_decode_marks_the_answer() -> None:
    detector = DegenerateText()
    detector.feed("fine so far \ud83d and a lone surrogate")
    assert detector.verdict == dg.UNDECODABLE
    detector = DegenerateText()
    detector.feed("ok")
    detector.undecodable(0)
    assert detector.verdict is None
    detector.undecodable(1)
    assert detector.verdict == dg.UNDECODABLE


@SETTINGS
@given(st.lists(st.binary(max_size=12) | st.sampled_from([b"\xef\xbf\xbd", b"\xef", b"\xbf\xbd", b"\xff"]),
                max_size=30), st.integers(0, 2**32))
def test_the_sse_decoder_counts_bytes_that_do_not_decode_not_a_sent_fffd(parts, seed) -> None:
    raw = b"data: " + b"".join(parts)
    expected = raw.decode("utf-8", "replace").count("\ufffd") - raw.count("\ufffd".encode())
    rng = random.Random(seed)
    decoder = SSEDecoder()
    i = 0
    while i < len(raw):
        step = rng.randint(1, 5)
        decoder.feed(raw[i:i + step])
        i += step
    decoder.flush()
    assert decoder.undecodable == expected
