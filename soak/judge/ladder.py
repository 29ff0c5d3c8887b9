"""The exit-code ladder of ``soak run`` (CONTRACTS.md, "Exit status"), pure.

One function of what the run knew at its end: a problem that stopped it before
or during the load (the environment: exit 3; the config or the workload: exit 2),
whether anything failed (an incident, a failed criterion, a failed response),
whether a threshold was breached, the harness's own fault, an operator's
interrupt. When several apply the first of 1, 99, 4 wins: a hang outranks a
breached SLO, which outranks a harness fault.

Under ``prove:`` (docs/prove.md, "contract addition") the sequential test's
decision stands in for the hangs: a hang alone is no failure, a rejected test
is (exit 1); every other failure (a crash, a lost server, a failed criterion or
response) still is. The order is kept (2, 3; 1; 4; 130; 99 over 0, 4 and 5).
An accepted test is exit 0 and a pass, also after a hang; an undecided or
truncated one is exit 5, verdict as without prove (fail after a hang, else pass).
"""

from __future__ import annotations

from enum import Enum

from soak.prove.sprt import ProofState
from soak.records import Verdict
from soak.standing import UNDECIDED_EXIT


# The word a reader leads with for each exit status (the end block, report.html's banner).
# Exit 5 has its own: under prove: an undecided test is neither a pass nor a fail of the
# question asked, and "PASS, exit 5" read as a red CI job with nothing saying why. 2, 3, 4
# and 130 keep the verdict's word (ABORTED, or FAIL after a failure), as 99 keeps FAIL.
HEADLINES = {0: "PASS", 1: "FAIL", UNDECIDED_EXIT: "UNDECIDED", 99: "FAIL"}


class Problem(str, Enum):
    """What stopped the run that is neither the server's nor the harness's fault."""

    ENVIRONMENT = "environment"  # exit 3: not ready, no NVML, port taken, not what the config says
    USAGE = "usage"  # exit 2: bad config, workload or arguments


def outcome_of(*, problem: Problem | None, failed: bool, breached: bool, fault: bool,
               interrupted: bool, proof: ProofState | None = None, hanged: bool = False) -> tuple[int, Verdict]:
    """(exit code, the run's verdict as the run loop saw it at its end). With
    ``proof`` (the run has a ``prove:`` section) ``failed`` is every failure but
    a hang and ``hanged`` whether a hang was recorded."""
    if proof is not None:
        # a hang fails the verdict unless the test accepted in spite of it
        unproven = hanged and proof is not ProofState.ACCEPTED
        failed = failed or proof is ProofState.REJECTED
    if problem is Problem.ENVIRONMENT:
        code, verdict = 3, Verdict.ABORTED
    elif problem is Problem.USAGE:
        code, verdict = 2, Verdict.ABORTED
    elif failed and not interrupted:
        code, verdict = 1, Verdict.FAIL  # an incident or a failed criterion outranks a harness fault
    elif fault:
        code, verdict = 4, Verdict.ABORTED
    elif interrupted:
        code, verdict = 130, (Verdict.FAIL if failed or (proof is not None and unproven) else Verdict.ABORTED)
    elif proof is not None and proof is not ProofState.ACCEPTED:
        code, verdict = UNDECIDED_EXIT, (Verdict.FAIL if unproven else Verdict.PASS)
    else:
        code, verdict = 0, Verdict.PASS
    # A failed criterion or an incident is exit 1, above 99; 99 above a harness fault.
    if breached and not failed and code in (0, 1, 4, UNDECIDED_EXIT):
        code, verdict = 99, Verdict.FAIL
    return code, verdict


def headline(exit_code: int | None, verdict: Verdict | None) -> str:
    """The headline word of a run that ended with ``exit_code`` and ``verdict``: "PASS",
    "FAIL", "UNDECIDED" (exit 5), else the verdict's ("ABORTED"), "UNKNOWN" without one."""
    if exit_code in HEADLINES:
        return HEADLINES[exit_code]
    return verdict.value.upper() if verdict is not None else "UNKNOWN"


__all__ = ["HEADLINES", "Problem", "UNDECIDED_EXIT", "headline", "outcome_of"]
