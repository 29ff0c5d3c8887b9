"""Where a build stands and how a run's end is numbered: the words and values that
the history's one verdict (soak.history.verdict), the Pushgateway push
(soak.report.push), Grafana's dashboards (soak.export) and the exit-code ladder
(soak.judge.ladder) share. A leaf, so each floor reads the same constants
without importing the floor above it."""

from __future__ import annotations

from enum import Enum
from typing import Mapping

UNDECIDED_EXIT = 5  # prove: the test ended undecided (docs/prove.md, CONTRACTS.md)


class Standing(str, Enum):
    """Where a build stands; the values are the words every reader shows."""

    FIXED = "fixed"
    NOT_FIXED = "not fixed"
    OPEN = "not yet shown"
    BASELINE = "baseline"
    NONE = ""  # nothing to judge against


# soak_build_fixed's value for each judged standing (soak/report/push.py); Grafana's
# "Fixed?" stat maps each back to the standing's own words. The others push none.
FIXED_VALUES: Mapping[Standing, int] = {Standing.FIXED: 1, Standing.NOT_FIXED: 0, Standing.OPEN: -1}


def pushed_fixed(standing: str) -> int | None:
    """soak_build_fixed's value for a standing (history.json's ``standing``), None: push none."""
    try:
        return FIXED_VALUES.get(Standing(standing))
    except ValueError:
        return None


__all__ = ["FIXED_VALUES", "Standing", "UNDECIDED_EXIT", "pushed_fixed"]
