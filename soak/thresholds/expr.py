"""Threshold expressions: ``"< 90s"``, ``"<= 40ms"``, ``"< 1%"``, ``"> 60"``, ``"> 0.9"``.

``parse_condition(metric_name, text)`` is pure and raises ``ThresholdSyntaxError``
with a message fit for one line of output. A duration needs its unit (a bare
``90`` could mean milliseconds, as in k6, or seconds: we refuse to guess); a
ratio is ``0.9`` or ``90%``; a rate is ``60`` or ``60/s`` (``/min``, ``/h``).
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass
from typing import Callable

from soak.thresholds.metrics import Quantity, metric

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
}
UNITS: dict[Quantity, dict[str, float]] = {
    Quantity.DURATION: {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0},
    Quantity.RATIO: {"": 1.0, "%": 0.01},
    Quantity.RATE: {"": 1.0, "/s": 1.0, "/min": 1 / 60.0, "/m": 1 / 60.0, "/h": 1 / 3600.0},
    Quantity.COUNT: {"": 1.0},
}
_EXPR = re.compile(r"^\s*(?P<op>[<>=!~]*)\s*(?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(?P<unit>\S*)\s*$")


class ThresholdSyntaxError(ValueError):
    pass


@dataclass(frozen=True)
class Condition:
    op: str
    value: float  # in the metric's base unit (seconds, ratio 0..1, per second)
    text: str  # as written

    def holds(self, observed: float) -> bool:
        return OPERATORS[self.op](observed, self.value)


def parse_condition(metric_name: str, text: object) -> Condition:
    spec = metric(metric_name)
    if not isinstance(text, str):
        raise ThresholdSyntaxError(f"expected an expression such as \"< 90s\", got {text!r}")
    m = _EXPR.match(text)
    if m is None:
        raise ThresholdSyntaxError(f"{text!r} is not an expression such as \"< 90s\" or \"> 0.9\"")
    op, unit = m.group("op"), m.group("unit")
    if op not in OPERATORS:
        what = f"unknown operator {op!r}" if op else "no operator"
        raise ThresholdSyntaxError(f"{what} in {text!r}, known: {', '.join(OPERATORS)}")
    units = UNITS[spec.quantity]
    if unit not in units:
        if spec.quantity is Quantity.DURATION and unit == "":
            raise ThresholdSyntaxError(f"{text!r} needs a unit ({metric_name} is a duration: us, ms, s, m, h)")
        known = ", ".join(repr(u) if u else "none" for u in units)
        raise ThresholdSyntaxError(f"unknown unit {unit!r} in {text!r} for {metric_name} (a {spec.quantity.value}; units: {known})")
    value = float(m.group("num")) * units[unit]
    if not math.isfinite(value):
        raise ThresholdSyntaxError(f"{text!r} is not a finite number")
    return Condition(op=op, value=value, text=" ".join(text.split()))
