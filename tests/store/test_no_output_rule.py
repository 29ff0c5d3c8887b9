"""A request that finished ok with nothing generated is not a success (issue: empty
200 answers passed): ``RequestTally`` counts it as the failed outcome ``no_output``
for the error rate and the failure stretches, whatever mix it comes in."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soak.criteria import CriteriaConfig, CriterionState, RequestTally, judge
from soak.criteria.rules import NO_OUTPUT, LoadSpan, generated_tokens

ORIGIN = 1000.0
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# The shapes of an answer with nothing in it, as the client records them.
EMPTY = st.sampled_from([{"output_tokens": 0, "ttft_s": None}, {"output_tokens": 0, "ttft_s": 0.05},
                         {"output_tokens": 7, "ttft_s": None}, {"output_tokens": 0}])


def good(at: float) -> dict:
    return {"outcome": "ok", "ended_at": ORIGIN + at, "output_tokens": 20, "ttft_s": 0.05}


@st.composite
def mixes(draw):
    """Productive and empty answers, every 0.25 s, in a drawn order; an error budget."""
    productive = draw(st.integers(min_value=0, max_value=60))
    empty = draw(st.integers(min_value=0, max_value=60))
    kinds = draw(st.permutations(["good"] * productive + ["empty"] * empty))
    rows = [good(i / 4) if kind == "good" else {"outcome": "ok", "ended_at": ORIGIN + i / 4, **draw(EMPTY)}
            for i, kind in enumerate(kinds)]
    budget = draw(st.sampled_from((0.0, 0.01, 0.05, 0.2, 0.5)))
    return rows, budget


@SETTINGS
@given(mixes())
def test_empty_answers_are_failures_and_past_the_budget_never_pass(mix) -> None:
    rows, budget = mix
    cfg = CriteriaConfig.model_validate({"error_rate": {"max": budget}, "no_success": {"window": "1h"},
                                         "work_evidence": {"window": "1h"}})
    end = len(rows) / 4 + 0.25
    tally = RequestTally.of(cfg, rows, span=LoadSpan(ORIGIN, ORIGIN + end))
    empty = sum(1 for r in rows if generated_tokens(r) == 0)
    # The tally's successes are exactly the answers with generated tokens.
    assert tally.ok == len(rows) - empty and tally.failed == empty
    assert tally.failed_by_outcome.get(NO_OUTPUT, 0) == empty
    decision = judge(cfg, tally, final=True)
    if rows and empty / len(rows) > budget:
        assert not decision.passed, decision.to_json()
        states = {r.name: r.state for r in decision.results}
        assert states["error_rate"] is CriterionState.FAIL or states["work_evidence"] is CriterionState.FAIL
    if rows and empty / len(rows) <= budget and empty < len(rows):
        # Within the budget the empty answers alone fail nothing.
        assert {r.name: r.state for r in decision.results}["error_rate"] is CriterionState.PASS


@SETTINGS
@given(st.integers(min_value=2, max_value=40), EMPTY)
def test_a_run_of_empty_answers_is_a_failure_stretch(n, shape) -> None:
    """One good answer, then only empty ones for longer than the window: no_success fails."""
    rows = [good(0)] + [{"outcome": "ok", "ended_at": ORIGIN + 1 + i * (130 / (n - 1)), **shape} for i in range(n)]
    cfg = CriteriaConfig.model_validate({"no_success": {"window": "2m", "min_failures": 2}})
    tally = RequestTally.of(cfg, rows)
    assert tally.breach is not None and tally.breach.failures == n
    assert not judge(cfg, tally, final=True).passed


def test_one_empty_answer_among_many_good_ones_is_within_the_default_budget() -> None:
    rows = [good(i) for i in range(100)]
    rows.insert(50, {"outcome": "ok", "ended_at": ORIGIN + 49.5, "output_tokens": 0, "ttft_s": None})
    cfg = CriteriaConfig.model_validate({"work_evidence": {"window": "1h"}})
    decision = judge(cfg, RequestTally.of(cfg, rows, span=LoadSpan(ORIGIN, ORIGIN + 100)), final=True)
    assert decision.passed, decision.to_json()
    assert math.isclose(next(r.value for r in decision.results if r.name == "error_rate"), 1 / 101)
