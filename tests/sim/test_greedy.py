"""The simulated model's answers, pure: determinism, distinct prompts, near ties
that the oracle's rule always explains, and a misalignment that it does not."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings, strategies as st

from soak.oracle.answer import answer_from_body
from soak.oracle.compare import judge_answer
from soak.samples import CanaryVerdict
from soak.sim import greedy, logprobs
from soak.sim.engine import SimRequest
from soak.tokens import tokenizer

MARGIN = 0.005  # the oracle's default tie margin (docs/oracle.md)


def _req(digest: int, *, number: int = 0, prompt_tokens: int = 10, k: int | None = 5) -> SimRequest:
    return SimRequest(f"r{number}", prompt_tokens, [], 10**6, "length", 0.0, digest=digest, number=number, logprobs=k)


def generate(digest: int, n: int, *, layout: int, rate: float = 0.02, flip: float = 0.3,
             misalign: greedy.Misalignment | None = None, companions: int | None = None, pp: int = 8,
             varying: bool = False) -> SimRequest:
    """``n`` tokens of one request run beside companions; ``layout`` seeds the batch
    composition (step numbers, batch sizes, its place, tokens per step)."""
    rng = random.Random(layout)
    target = _req(digest)
    others = [_req(rng.getrandbits(64), number=i + 1) for i in range(rng.randint(0, 5) if companions is None else companions)]
    step = rng.randint(0, 10**6)
    thr = greedy.tie_threshold(rate)
    while len(target.tokens) < n:
        batch = [r for r in others if not varying or rng.random() < 0.5]
        batch.insert(rng.randint(0, len(batch)), target)
        emitting = [(r, min(rng.randint(1, 6), n - len(target.tokens)) if r is target else rng.randint(1, 6)) for r in batch]
        greedy.sample_batch(step, len(batch) + rng.randint(0, 3), emitting, threshold=thr, flip=flip, misalign=misalign, pp=pp)
        step += rng.randint(1, 50)
    return target


def answer_of(req: SimRequest, rate: float = 0.02, k: int = 5):
    content = logprobs.chat_content(req, 0, len(req.tokens), k, greedy.tie_threshold(rate))
    body = {"model": "m", "choices": [{"index": 0, "message": {"content": req.output_text(0, len(req.tokens))},
                                       "logprobs": {"content": content}, "finish_reason": "length"}]}
    return answer_from_body(body)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200), st.integers(1, 120), st.integers(), st.integers())
def test_a_batch_invariant_sim_answers_a_prompt_the_same_in_any_batch(text, n, a, b):
    d = greedy.prompt_digest(text)
    one, two = generate(d, n, layout=a, flip=0.0), generate(d, n, layout=b, flip=0.0)
    assert one.tokens == two.tokens
    assert len(tokenizer.encode(one.output_text(0, n))) == n  # token counts stay exact


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=200), st.data())
def test_different_prompts_of_one_length_answer_differently(text, data):
    i = data.draw(st.integers(0, len(text) - 1))
    c = data.draw(st.characters().filter(lambda ch: ch != text[i]))
    other = text[:i] + c + text[i + 1:]
    one = generate(greedy.prompt_digest(text), 16, layout=0, flip=0.0)
    two = generate(greedy.prompt_digest(other), 16, layout=0, flip=0.0)
    assert one.tokens != two.tokens


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**64 - 1), st.integers(0, 20), st.floats(0.0, 1.0))
def test_each_position_is_a_distribution_with_a_clear_winner_or_a_near_tie(state, k, rate):
    thr = greedy.tie_threshold(rate)
    full = greedy.distribution(state, 20, thr)
    toks = [t for t, _ in full]
    lps = [lp for _, lp in full]
    assert len(set(toks)) == 20 and toks[0] == greedy.top_of(state) and toks[1] == greedy.runner_up(state)
    assert lps == sorted(lps, reverse=True) and all(lp < 0 for lp in lps)
    assert sum(math.exp(lp) for lp in lps) <= 1.0
    gap = lps[0] - lps[1]
    assert gap <= greedy.TIE_GAP_MAX + 1e-12 if greedy.is_tie(state, thr) else gap >= 1.0 - 1e-12
    assert greedy.distribution(state, k, thr) == full[:max(2, k)]


def test_near_ties_come_at_the_configured_rate():
    for rate in (0.02, 0.1):
        req = generate(greedy.prompt_digest("rate"), 20000, layout=1, rate=rate, flip=0.0)
        ties = sum(greedy.is_tie(s, greedy.tie_threshold(rate)) for s in req.dists)
        assert abs(ties / 20000 - rate) < 4 * math.sqrt(rate / 20000)


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=100), st.integers(), st.integers())
def test_a_healthy_flip_is_always_explained_by_the_logprobs(text, a, b):
    """Two healthy answers to one prompt, in different batches: where they first
    differ, each lists the other's token within the margin, both ways."""
    d = greedy.prompt_digest(text)
    one = generate(d, 80, layout=a, rate=0.2, flip=0.5)
    two = generate(d, 80, layout=b, rate=0.2, flip=0.5)
    x, y = answer_of(one, 0.2), answer_of(two, 0.2)
    for ref, ans in ((x, y), (y, x)):
        assert judge_answer(ref, ans, tie_margin=MARGIN).verdict in (CanaryVerdict.MATCH, CanaryVerdict.EXPLAINED)
    if one.tokens != two.tokens:
        i = next(p for p, (u, v) in enumerate(zip(one.tokens, two.tokens)) if u != v)
        assert dict(x.tokens[i].top)[y.tokens[i].token] >= x.tokens[i].logprob - MARGIN - 1e-9


def test_the_default_sim_flips_now_and_then():
    """Not batch-invariant by default: some prompts' answers differ between batches."""
    differ = sum(generate(greedy.prompt_digest(f"p{i}"), 200, layout=i).tokens
                 != generate(greedy.prompt_digest(f"p{i}"), 200, layout=i + 1000).tokens for i in range(60))
    assert 5 <= differ <= 55


def test_a_misaligned_batch_gives_answers_the_rule_calls_corrupt():
    mis = greedy.Misalignment()
    verdicts = []
    for i in range(200):
        d = greedy.prompt_digest(f"prompt {i}")
        healthy = answer_of(generate(d, 40, layout=i))
        bad = answer_of(generate(d, 40, layout=i + 7, misalign=mis, companions=3))
        verdicts.append(judge_answer(healthy, bad, tie_margin=MARGIN).verdict)
    assert verdicts.count(CanaryVerdict.CORRUPT) >= 0.95 * len(verdicts), verdicts


def test_a_lone_misaligned_request_receives_its_own_sample_pp_positions_back():
    d = greedy.prompt_digest("alone")
    healthy = generate(d, 40, layout=3, flip=0.0, companions=0)
    bad = generate(d, 40, layout=3, flip=0.0, companions=0, misalign=greedy.Misalignment(), pp=4)
    assert bad.tokens[:4] == healthy.tokens[:4] and bad.tokens[4] == healthy.tokens[0]
    assert judge_answer(answer_of(healthy), answer_of(bad), tie_margin=MARGIN).verdict is CanaryVerdict.CORRUPT


@given(st.integers(1, 12), st.integers(0, 2**32))
def test_one_in_n_affects_about_one_answer_in_n(n, seed):
    mis = greedy.Misalignment(one_in=n, seed=seed)
    hit = sum(mis.affects(i, 10) for i in range(3000))
    assert abs(hit / 3000 - 1 / n) < 4 * math.sqrt((1 / n) / 3000) + 1e-9


def test_long_scope_spares_short_prompts():
    mis = greedy.Misalignment(long_only=True, long_tokens=2048)
    assert not mis.affects(1, 2047) and mis.affects(1, 2048)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.data())
def test_long_prompts_that_differ_anywhere_answer_differently(seed, data):
    rng = random.Random(seed)
    text = "".join(rng.choice(greedy.WORDS) for _ in range(rng.randint(14000, 60000)))  # 70-300 KB
    i = data.draw(st.integers(0, len(text) - 1))
    c = data.draw(st.characters().filter(lambda ch: ch != text[i]))
    other = text[:i] + c + text[i + 1:]
    assert greedy.prompt_digest(text) != greedy.prompt_digest(other)
    assert greedy.prompt_digest(text) == greedy.prompt_digest(text[:i] + text[i] + text[i + 1:])


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=50), st.integers(), st.integers(1, 12), st.integers(1, 4))
def test_a_misaligned_request_in_batches_that_come_and_go_is_served_whole(text, layout, pp, one_in):
    """Alone in one step, batched in the next: every position still gets a token
    (the delay line keeps the request's own samples whatever its batch)."""
    req = generate(greedy.prompt_digest(text), 100, layout=layout, misalign=greedy.Misalignment(one_in=one_in),
                   companions=3, pp=pp, varying=True)
    assert len(req.tokens) == 100 == len(req.dists)
    assert len(tokenizer.encode(req.output_text(0, 100))) == 100
