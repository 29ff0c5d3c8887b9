"""Failure criteria beyond hangs (section ``criteria:`` of a run config).

A soak whose server answers but serves nothing is not a pass. Two criteria,
each with its own block so a config can tune or switch off one:

- ``error_rate``: more than ``max`` of the finished requests failed (default
  5%). Requests the harness itself cut short (the end-of-run drain, an
  incident's kill, Ctrl-C) are not finished requests: they count neither way.
- ``no_success``: requests kept failing for ``window`` (default 2 minutes) with
  no request succeeding in between, and at least ``min_failures`` of them.
  Measured from the end of the first failure after the last success to the end
  of the latest failure, so a slow but healthy server (a long prefill, no
  request finishing for minutes) does not trip it: silence is the hang
  detector's business, failures are this criterion's.

``stop_on_breach``: a no-success stretch past its window decides the verdict
for good, so the soak ends there (exit 1) instead of hammering a broken server
for the rest of the duration. The error rate can still recover, so it is judged
at the end.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from soak.configbase import Duration, StrictModel


def _fraction(value: Any) -> Any:
    """``0.05`` or ``"5%"``; a bare number above 1 is refused, not guessed to be a percent."""
    if isinstance(value, bool):
        raise ValueError("expected a fraction such as 0.05 or a percentage such as 5%")
    if isinstance(value, str):
        text = value.strip()
        try:
            if text.endswith("%"):
                return float(text[:-1]) / 100.0
            return float(text)
        except ValueError:
            raise ValueError(f"{value!r} is not a fraction such as 0.05 or a percentage such as 5%") from None
    if isinstance(value, (int, float)) and value > 1:
        raise ValueError(f"{value} is not a fraction between 0 and 1 (write 0.05 or \"5%\" for five percent)")
    return value


Fraction = Annotated[float, BeforeValidator(_fraction), Field(ge=0, le=1)]


class ErrorRateCriterion(StrictModel):
    enabled: bool = True
    # The largest failed share of finished requests that still passes.
    max: Fraction = 0.05
    # Below this many finished requests the rate is not judged.
    min_requests: int = Field(1, ge=1)


class NoSuccessCriterion(StrictModel):
    enabled: bool = True
    # Two minutes: several agentic turns on a healthy box, a few seconds of
    # failures are a blip, two minutes of nothing but failures are not.
    window: Annotated[Duration, Field(gt=0)] = 120.0
    min_failures: int = Field(3, ge=1)


class CriteriaConfig(StrictModel):
    error_rate: ErrorRateCriterion = ErrorRateCriterion()
    no_success: NoSuccessCriterion = NoSuccessCriterion()
    stop_on_breach: bool = True
