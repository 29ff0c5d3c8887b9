"""The exit-code ladder under ``prove:`` (soak/judge/ladder.py, docs/prove.md
"contract addition"), over every combination of what a run can know at its end.
Without a prove section nothing changes (tests/judge/test_ladder.py holds)."""

from __future__ import annotations

import itertools

import pytest

from soak.judge.ladder import Problem, outcome_of
from soak.prove.sprt import ProofState
from soak.records import Verdict

STATES = list(ProofState)
COMBOS = list(itertools.product([None, Problem.ENVIRONMENT, Problem.USAGE], [False, True], [False, True],
                                [False, True], [False, True], STATES, [False, True]))


@pytest.mark.parametrize("problem, failed, breached, fault, interrupted, proof, hanged", COMBOS)
def test_the_prove_ladder(problem, failed, breached, fault, interrupted, proof, hanged) -> None:
    """The ladder without prove, where a rejected test is the failure a hang was
    (1 over 99 over 4; 2, 3 and 130 as they were), and its pass split in two:
    0 for an accepted test, 5 for one that did not decide."""
    code, verdict = outcome_of(problem=problem, failed=failed, breached=breached, fault=fault,
                               interrupted=interrupted, proof=proof, hanged=hanged)
    rejected = proof is ProofState.REJECTED
    plain, plain_verdict = outcome_of(problem=problem, failed=failed or rejected, breached=breached, fault=fault,
                                      interrupted=interrupted)
    if plain != 0:
        assert code == plain
        if plain == 130:  # the verdict says the hang unless the test accepted in spite of it
            unproven = hanged and proof is not ProofState.ACCEPTED
            assert verdict is (Verdict.FAIL if failed or rejected or unproven else Verdict.ABORTED)
        else:
            assert verdict is plain_verdict
    elif proof is ProofState.ACCEPTED:  # fixed: a pass, also after a hang
        assert (code, verdict) == (0, Verdict.PASS)
    else:  # undecided or truncated: exit 5, the verdict as without prove
        assert (code, verdict) == (5, Verdict.FAIL if hanged else Verdict.PASS)
    if problem is None and rejected and not interrupted:
        assert (code, verdict) == (1, Verdict.FAIL)  # a rejected test fails the run, whatever else


@pytest.mark.parametrize("failed, breached, fault, interrupted", list(itertools.product([False, True], repeat=4)))
def test_a_hang_alone_decides_nothing_under_prove(failed, breached, fault, interrupted) -> None:
    """What the ladder says of one combination never depends on a hang except
    through the test's state (and the verdicts of 5 and 130)."""
    for proof in STATES:
        codes = {outcome_of(problem=None, failed=failed, breached=breached, fault=fault, interrupted=interrupted,
                            proof=proof, hanged=hanged)[0] for hanged in (False, True)}
        assert len(codes) == 1


def test_exit_5_only_under_prove_and_0_only_on_accept() -> None:
    for problem, failed, breached, fault, interrupted, proof, hanged in COMBOS:
        plain = outcome_of(problem=problem, failed=failed or hanged, breached=breached, fault=fault,
                           interrupted=interrupted)[0]
        proved = outcome_of(problem=problem, failed=failed, breached=breached, fault=fault,
                            interrupted=interrupted, proof=proof, hanged=hanged)[0]
        assert plain != 5
        assert proved != 0 or proof is ProofState.ACCEPTED
        if proof is ProofState.REJECTED:  # never a pass, never "undecided", never only a breach
            assert proved not in (0, 5, 99)
