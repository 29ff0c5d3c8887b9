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

- ``work_evidence``: no evidence, no pass. Once the load has started, the
  target must finish requests with generated tokens: at least ``min_requests``
  such requests and ``min_tokens`` generated tokens in every full ``window``
  (default 10 minutes: one floor for every window, 1 request and 1 token by
  default); the first such request within ``startup`` of the load's start, and
  after it never ``max_gap`` without another (both default to the window). At
  the end of a load that was applied, no such request at all is a fail however
  short the run: a start-up allowance never hides a server that accepted
  requests and produced nothing. A generated token is content the client saw
  (``ttft_s`` set) on a request that ended ``ok`` with ``output_tokens`` > 0;
  bytes, SSE comments, a usage count without content, and requests still
  streaming when the harness cut them are not work. After a restart
  (``response.on_hang: restart``) the new server life owes the same again; the
  time it was down is not owed.

``stop_on_breach``: a no-success stretch past its window, or missing work,
decides the verdict for good, so the soak ends there (exit 1) instead of
hammering a broken server for the rest of the duration. The error rate can
still recover, so it is judged at the end.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, model_validator

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


class WorkEvidenceCriterion(StrictModel):
    enabled: bool = True
    # Ten minutes: dozens of agentic turns on a healthy box even at long contexts,
    # and longer than any prefill the first-token timeout (15 min) is meant for
    # only on a cold start, which ``startup`` can widen together with the window.
    window: Annotated[Duration, Field(gt=0)] = 600.0
    # Per full window: requests that finished with generated tokens, and those tokens.
    min_requests: int = Field(1, ge=0)
    min_tokens: int = Field(1, ge=0)
    # The longest time after the first productive request without another; None: the window.
    max_gap: Annotated[Duration, Field(gt=0)] | None = None
    # The load's start to the first productive request; None: the window.
    startup: Annotated[Duration, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _startup_within_window(self) -> "WorkEvidenceCriterion":
        if self.startup is not None and self.startup > self.window:
            raise ValueError(f"startup ({self.startup:g}s) must not exceed window ({self.window:g}s): the first "
                             f"window would miss its floor before the start-up allowance ran out; widen the window")
        return self

    @property
    def gap_s(self) -> float:
        return self.window if self.max_gap is None else self.max_gap

    @property
    def startup_s(self) -> float:
        return self.window if self.startup is None else self.startup


class CriteriaConfig(StrictModel):
    error_rate: ErrorRateCriterion = ErrorRateCriterion()
    no_success: NoSuccessCriterion = NoSuccessCriterion()
    work_evidence: WorkEvidenceCriterion = WorkEvidenceCriterion()
    stop_on_breach: bool = True
