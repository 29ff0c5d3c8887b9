"""What a request record is evidence of: the one definition of work
(``generated_tokens``) and when a request ended (``record_time``).

A shared leaf: the judge's criteria (``soak.criteria.rules``) and the time at
risk (``soak.exposure``, ``soak.prove.live``) read records by these, so the
verdict and the exposure agree on what work was. Pure; records are outside
input, so every field is read by its exact type.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any


def getter(record: Mapping[str, Any] | Any) -> Callable[..., Any]:
    # A plain dict first: a typing/abc isinstance check costs a microsecond, and
    # the end of a 24-hour run folds a few hundred thousand records.
    if type(record) is dict or isinstance(record, Mapping):
        return record.get
    return lambda key, default=None: getattr(record, key, default)


def finite_number(value: Any) -> float | None:
    """A finite number as a float; None for anything else (bool, NaN, inf, text).
    Exact-type checks first: the end of a 24-hour run reads a few hundred thousand."""
    kind = type(value)
    if kind is float:
        return value if value - value == 0.0 else None  # NaN and inf are not
    if kind is int:
        return float(value)
    if kind is bool or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def record_time(record: Mapping[str, Any] | Any, *, offset: float | None = None) -> float | None:
    """When a request ended, on the clock its run's span is read on: ``ended_mono``
    (seconds on the run's monotonic clock) when the run recorded monotonic times
    (``offset``, wall minus monotonic at the load's start, is known) and the record
    has one; else ``ended_at`` (unix seconds), moved onto the monotonic clock by
    ``offset`` when there is one. None: the record says nothing usable."""
    get = record.get if type(record) is dict else getter(record)
    if offset is not None:
        mono = finite_number(get("ended_mono"))
        if mono is not None:
            return mono
    wall = finite_number(get("ended_at"))
    if wall is None:
        return None
    return wall - offset if offset is not None else wall


def generated_tokens(record: Mapping[str, Any] | Any) -> int:
    """The tokens this request is evidence of: its ``output_tokens`` when it ended
    ``ok`` and content reached the client (``ttft_s`` set), else 0. The one
    definition of work: a comment, a byte, a usage count without content or a
    stream the harness cut is not."""
    get = record.get if type(record) is dict else getter(record)
    if get("outcome") != "ok" or finite_number(get("ttft_s")) is None:
        return 0
    tokens = get("output_tokens")
    # Exactly int: a bool, a float or text in a damaged line is not a count.
    return tokens if type(tokens) is int and tokens > 0 else 0
