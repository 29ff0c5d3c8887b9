"""Hypothesis strategies for the oracle's tests: answers whose tokens collide often."""

from __future__ import annotations

from hypothesis import strategies as st

from soak.oracle.answer import Answer, TokenChoice

# Few ordinary tokens, so that draws collide; no end tokens (ending is drawn by the finish reason).
TOKENS = st.sampled_from([" a", " b", " c", " the", " of", "x", "Paris", "\n", " é", "1"])
LOGPROB = st.floats(min_value=-30, max_value=0, allow_nan=False)
MARGIN = st.floats(min_value=0, max_value=2, allow_nan=False)
FINISH = st.sampled_from(["stop", "length"])


@st.composite
def positions(draw, token=TOKENS) -> TokenChoice:
    chosen = draw(token)
    lp = draw(LOGPROB)
    alts = draw(st.lists(st.tuples(TOKENS, LOGPROB), max_size=5))
    top = tuple(sorted({t: l for t, l in [(chosen, lp), *alts]}.items(), key=lambda a: -a[1]))
    return TokenChoice(chosen, lp, top)


@st.composite
def answers(draw, min_size=0, max_size=12) -> Answer:
    tokens = tuple(draw(st.lists(positions(), min_size=min_size, max_size=max_size)))
    return Answer(tokens, "".join(t.token for t in tokens), draw(FINISH), "m")

# Wider: end tokens among the tokens, and every finish reason a server sends.
WIDE_TOKENS = st.sampled_from([" a", " b", "x", "", "</s>", "<|im_end|>"])
WIDE_FINISH = st.sampled_from(["stop", "length", None, "abort"])


@st.composite
def wide_answers(draw, min_size=1, max_size=6) -> Answer:
    tokens = tuple(draw(st.lists(positions(WIDE_TOKENS), min_size=min_size, max_size=max_size)))
    return Answer(tokens, "", draw(WIDE_FINISH), "m")
