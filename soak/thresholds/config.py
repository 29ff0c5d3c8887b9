"""The ``thresholds:`` section of a run config, k6 style.

    thresholds:
      ttft_p99: "< 90s"                  # over the whole run
      tpot_p50: ["< 40ms", "< 60ms"]     # several conditions on one metric
      error_rate:
        threshold: "< 1%"
        window: 5m                       # also over every sliding 5-minute window
        abort_on_fail: true              # a breach ends the run at once (exit 99)
        delay_abort_eval: 1m             # no abort in the first minute of load

Keys are names from ``soak.thresholds.metrics.RUN_METRICS``. Each key and
expression is checked when the config is read: an unknown metric, operator or
unit is one ``ConfigError`` naming ``thresholds.<metric>`` (exit 2).
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

from pydantic import AfterValidator, Field, model_validator

from soak.configbase import Duration, StrictModel
from soak.thresholds.metrics import RUN_METRICS


def unknown_metric_message(name: str) -> str:
    """One line for a metric no threshold can name: the one it likely misspells first."""
    from soak.configkeys import suggestion

    known = [m.name for m in RUN_METRICS.values() if m.thresholdable]
    near = suggestion(name, known)
    if near is not None:
        return f"unknown metric {name!r}; did you mean {near!r}? (known: {', '.join(known)})"
    return f"unknown metric {name!r}, known: {', '.join(known)}"


def _known_metric(name: str) -> str:
    if name not in RUN_METRICS or not RUN_METRICS[name].thresholdable:
        raise ValueError(unknown_metric_message(name))
    return name


class ThresholdRule(StrictModel):
    threshold: tuple[str, ...]
    window: Optional[Annotated[Duration, Field(gt=0)]] = None
    abort_on_fail: bool = False
    delay_abort_eval: Duration = 0.0

    @model_validator(mode="before")
    @classmethod
    def _short_forms(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"threshold": (value,)}
        if isinstance(value, list):
            return {"threshold": tuple(value)}
        if isinstance(value, dict) and isinstance(value.get("threshold"), str):
            return {**value, "threshold": (value["threshold"],)}
        if not isinstance(value, dict):
            raise ValueError('expected an expression such as "< 90s", a list of them, or {threshold: ..., window: ...}')
        return value


MetricName = Annotated[str, AfterValidator(_known_metric)]
ThresholdsConfig = dict[MetricName, ThresholdRule]


def threshold_problem(section: ThresholdsConfig) -> tuple[str, str] | None:
    """(field, message) of the first threshold that does not compile (an
    expression the metric cannot take), else None: checked with the rest of the
    config, before anything runs."""
    from soak.thresholds.evaluate import ThresholdConfigError, compile_thresholds

    try:
        compile_thresholds(section)
    except ThresholdConfigError as exc:
        return exc.field, exc.message
    return None
