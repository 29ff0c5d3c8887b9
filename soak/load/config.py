"""Load generation: closed-loop sessions or open-loop arrivals, and timeouts.

``mode: closed`` keeps ``concurrency`` agentic sessions going, each sending its
next turn after the think time once the previous one finished. ``mode: open``
sends turns at ``rate`` per second with gamma gaps of shape ``burstiness``
(1 = Poisson, as ``vllm bench serve``), at most ``concurrency`` in flight. A
workload that is a timestamped trace is replayed at its own offsets either way.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from soak.configbase import Duration, StrictModel


PositiveDuration = Annotated[Duration, Field(gt=0)]


class TimeoutsConfig(StrictModel):
    # A cold 230K-token prompt at 256 tokens a step is ~900 engine steps before
    # the first token, so the first-token timeout is far longer than the stall one.
    connect: PositiveDuration = 10.0
    first_token: PositiveDuration = 900.0
    stall: PositiveDuration = 180.0
    total: PositiveDuration = 3600.0


class LoadConfig(StrictModel):
    mode: Literal["closed", "open"] = "closed"
    concurrency: int = Field(default=8, ge=1, le=4096)
    rate: float | None = Field(default=None, gt=0, allow_inf_nan=False, description="requests per second (open mode)")
    burstiness: float = Field(default=1.0, gt=0)
    max_requests: int | None = Field(default=None, ge=1)
    drain: Duration = 30.0
    timeouts: TimeoutsConfig = TimeoutsConfig()
    # Cross-field rules (open mode needs a rate, ...) are checked in soak.config,
    # where the error can name the exact field.
