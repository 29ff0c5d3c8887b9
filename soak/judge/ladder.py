"""The exit-code ladder of ``soak run`` (CONTRACTS.md, "Exit status"), pure.

One function of what the run knew at its end: a problem that stopped it before
or during the load (the environment: exit 3; the config or the workload: exit 2),
whether anything failed (an incident, a failed criterion, a failed response),
whether a threshold was breached, the harness's own fault, an operator's
interrupt. When several apply the first of 1, 99, 4 wins: a hang outranks a
breached SLO, which outranks a harness fault.
"""

from __future__ import annotations

from enum import Enum

from soak.records import Verdict


class Problem(str, Enum):
    """What stopped the run that is neither the server's nor the harness's fault."""

    ENVIRONMENT = "environment"  # exit 3: not ready, no NVML, port taken, not what the config says
    USAGE = "usage"  # exit 2: bad config, workload or arguments


def outcome_of(*, problem: Problem | None, failed: bool, breached: bool, fault: bool,
               interrupted: bool) -> tuple[int, Verdict]:
    """(exit code, the run's verdict as the run loop saw it at its end)."""
    if problem is Problem.ENVIRONMENT:
        code, verdict = 3, Verdict.ABORTED
    elif problem is Problem.USAGE:
        code, verdict = 2, Verdict.ABORTED
    elif failed and not interrupted:
        code, verdict = 1, Verdict.FAIL  # an incident or a failed criterion outranks a harness fault
    elif fault:
        code, verdict = 4, Verdict.ABORTED
    elif interrupted:
        code, verdict = 130, (Verdict.FAIL if failed else Verdict.ABORTED)
    else:
        code, verdict = 0, Verdict.PASS
    # A failed criterion or an incident is exit 1, above 99; 99 above a harness fault.
    if breached and not failed and code in (0, 1, 4):
        code, verdict = 99, Verdict.FAIL
    return code, verdict


__all__ = ["Problem", "outcome_of"]
