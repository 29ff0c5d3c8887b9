"""The exit-code ladder (CONTRACTS.md, "Exit status"): every combination of what
a run can know at its end, as a table. When several apply, the first of 1, 99, 4
wins; a problem (exit 3, exit 2) outranks them all; an interrupt is 130 unless a
harness fault (4) or a breach of a clean run (99) says more."""

from __future__ import annotations

import itertools

import pytest

from soak.judge.ladder import Problem, outcome_of
from soak.records import Verdict

P, F, A = Verdict.PASS, Verdict.FAIL, Verdict.ABORTED

# failed, breached, fault, interrupted -> exit code, verdict (no problem)
TABLE = [
    (False, False, False, False, 0, P),
    (False, False, False, True, 130, A),
    (False, False, True, False, 4, A),
    (False, False, True, True, 4, A),
    (False, True, False, False, 99, F),
    (False, True, False, True, 130, A),  # an operator's stop is not an SLO verdict
    (False, True, True, False, 99, F),  # 99 outranks a harness fault
    (False, True, True, True, 99, F),
    (True, False, False, False, 1, F),
    (True, False, False, True, 130, F),
    (True, False, True, False, 1, F),  # an incident outranks a harness fault
    (True, False, True, True, 4, A),
    (True, True, False, False, 1, F),  # an incident outranks a breached SLO
    (True, True, False, True, 130, F),
    (True, True, True, False, 1, F),
    (True, True, True, True, 4, A),
]


@pytest.mark.parametrize("failed, breached, fault, interrupted, code, verdict", TABLE)
def test_the_ladder_without_a_problem(failed, breached, fault, interrupted, code, verdict) -> None:
    assert outcome_of(problem=None, failed=failed, breached=breached, fault=fault,
                      interrupted=interrupted) == (code, verdict)


@pytest.mark.parametrize("problem, code", [(Problem.ENVIRONMENT, 3), (Problem.USAGE, 2)])
def test_a_problem_outranks_everything_and_is_aborted(problem, code) -> None:
    for failed, breached, fault, interrupted in itertools.product((False, True), repeat=4):
        assert outcome_of(problem=problem, failed=failed, breached=breached, fault=fault,
                          interrupted=interrupted) == (code, Verdict.ABORTED)


def test_the_table_covers_every_combination() -> None:
    assert {row[:4] for row in TABLE} == set(itertools.product((False, True), repeat=4))
