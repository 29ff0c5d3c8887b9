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

- ``work_rate``, ``server_work``, ``wrong_model`` (the work claims, cross-checked:
  ``soak.criteria.claims``): a collapse of the work rate below a floor of the
  run's own healthy rate; a server whose own counters show a small fraction of
  the work the client received; answers from another model than the one served.
  ``claims``: the tolerance a usage count is held to (noted, never a figure).

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


class WorkRateCriterion(StrictModel):
    """The work rate (generated tokens of productive requests, by when they
    ended) in every window must stay above ``floor`` times the median of the
    windows judged before it (the run's own healthy rate)."""

    enabled: bool = True
    floor: Fraction = 0.1
    # None: sized once per run so a window holds ``window_requests`` productive
    # requests at the rate the load started with, and at least ``min_window``.
    window: Annotated[Duration, Field(gt=0)] | None = None
    min_window: Annotated[Duration, Field(gt=0)] = 10.0
    window_requests: int = Field(20, ge=1)
    # Earlier windows the healthy rate needs before a window is judged against it.
    min_windows: int = Field(1, ge=1)
    # Windows in a row below the floor that make a collapse (one short window is noise).
    consecutive: int = Field(2, ge=1)
    # The healthy rate is the median of the latest this many healthy windows.
    history: int = Field(30, ge=1)


class ServerWorkCriterion(StrictModel):
    """The server's own ``generation_tokens`` counter over the load's span must
    cover at least ``min_ratio`` of what the client received (a replay cache or a
    proxy answering for the server does not pass)."""

    enabled: bool = True
    min_ratio: Fraction = 0.5
    # Below this many client-counted tokens the comparison is not judged.
    min_tokens: int = Field(1000, ge=1)
    # The server counting more than this many times the client's work is noted.
    note_ratio: float = Field(2.0, gt=1)


class WrongModelCriterion(StrictModel):
    """Answers whose chunks name a model other than the one served."""

    enabled: bool = True
    max: Fraction = 0.0  # the largest share of such answers that still passes


class UsageClaims(StrictModel):
    """A usage count that disagrees with the tokens counted from the text by more
    than ``tolerance`` (relative) and ``slack`` tokens is a disagreement: noted."""

    tolerance: Fraction = 0.1
    slack: int = Field(2, ge=0)
    # The degenerate share is reported per window of this length.
    degenerate_window: Annotated[Duration, Field(gt=0)] = 60.0


class CriteriaConfig(StrictModel):
    error_rate: ErrorRateCriterion = ErrorRateCriterion()
    no_success: NoSuccessCriterion = NoSuccessCriterion()
    work_evidence: WorkEvidenceCriterion = WorkEvidenceCriterion()
    work_rate: WorkRateCriterion = WorkRateCriterion()
    server_work: ServerWorkCriterion = ServerWorkCriterion()
    wrong_model: WrongModelCriterion = WrongModelCriterion()
    claims: UsageClaims = UsageClaims()
    stop_on_breach: bool = True
