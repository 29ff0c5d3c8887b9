"""The ``prove:`` section of a run config (issue 36): is this build fixed?
Wald's sequential test (``soak.prove.sprt``) on the run's own time at risk and
hangs.

    prove:
      broken_mtbf: 20m        # θ1, the broken build's MTBF (or broken_build: its label in history,
                              #   with history: the folder of run directories it is read from)
      target_mtbf: 200m       # θ0 (or ratio: 10, θ0 = ratio x θ1)
      alpha: 0.05             # risk of calling a fixed build broken
      beta: 0.05              # risk of calling a broken build fixed
      max_exposure: 6h        # optional truncation (or truncate: auto, MIL-HDBK-781A's)
      max_hangs: 6
      stop_at_decision: true  # end the run at the decision

Checked when the config is read: one ``ConfigError`` naming ``prove.<field>``
(exit 2). A broken MTBF from history is resolved by the caller that reads the
history (``plan_of(section, broken_mtbf_s=...)``; ``soak run`` does it before the
target starts); this section only names the build and the folder (``history``, a
path beside the config file when relative).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

from pydantic import Field, ValidationInfo, field_validator, model_validator

from soak.configbase import Duration, StrictModel
from soak.prove.sprt import MAX_RATIO, MIN_RATIO, Plan, plan, truncation

Positive = Annotated[Duration, Field(gt=0)]


class ProveConfig(StrictModel):
    broken_mtbf: Optional[Positive] = None
    broken_build: Optional[str] = Field(default=None, min_length=1)
    history: Optional[str] = Field(default=None, min_length=1)  # where broken_build's nights are
    target_mtbf: Optional[Positive] = None
    ratio: Optional[float] = Field(default=None, ge=MIN_RATIO, le=MAX_RATIO)  # sprt's bounds
    alpha: float = Field(default=0.05, gt=0, lt=0.5)
    beta: float = Field(default=0.05, gt=0, lt=0.5)
    max_exposure: Optional[Positive] = None
    max_hangs: Optional[int] = Field(default=None, ge=1)
    truncate: Optional[str] = None  # "auto": MIL-HDBK-781A's truncation for these risks
    stop_at_decision: bool = False

    @field_validator("history")
    @classmethod
    def _beside_the_config(cls, value: str | None, info: ValidationInfo) -> str | None:
        base = (info.context or {}).get("base_dir") if isinstance(info.context, dict) else None
        if value is None or base is None or Path(value).is_absolute():
            return value
        return str(Path(base) / value)

    @model_validator(mode="after")
    def _one_of_each(self) -> "ProveConfig":
        # each pair names one quantity two ways: both given would disagree silently
        if (self.broken_mtbf is None) == (self.broken_build is None):
            raise ValueError("give one of broken_mtbf (a duration) and broken_build (a build in history)")
        if (self.broken_build is None) != (self.history is None):
            raise ValueError("broken_build and history go together: the build's name and the folder of its runs")
        if (self.target_mtbf is None) == (self.ratio is None):
            raise ValueError("give one of target_mtbf (a duration) and ratio (target over broken)")
        if self.broken_mtbf is not None and self.target_mtbf is not None and self.target_mtbf <= self.broken_mtbf:
            raise ValueError(f"target_mtbf ({self.target_mtbf:g} s) must be above broken_mtbf "
                             f"({self.broken_mtbf:g} s): the test asks whether the MTBF rose")
        if self.truncate is not None and self.truncate != "auto":
            raise ValueError(f"truncate takes 'auto', not {self.truncate!r}")
        if self.truncate == "auto" and (self.max_exposure is not None or self.max_hangs is not None):
            raise ValueError("truncate: auto chooses max_exposure and max_hangs; give one or the other")
        return self


def plan_of(section: ProveConfig, *, broken_mtbf_s: float | None = None) -> Plan:
    """The section's plan; ``broken_mtbf_s`` is the MTBF history gave for
    ``broken_build`` (required then, ignored otherwise). ValueError as ``plan``."""
    broken = section.broken_mtbf if section.broken_mtbf is not None else broken_mtbf_s
    if broken is None:
        raise ValueError(f"no MTBF for the broken build {section.broken_build!r}: history has none")
    target = section.target_mtbf if section.target_mtbf is not None else broken * (section.ratio or 0.0)
    max_exposure, max_hangs = section.max_exposure, section.max_hangs
    if section.truncate == "auto":
        max_exposure, max_hangs = truncation(broken_mtbf_s=broken, target_mtbf_s=target,
                                             alpha=section.alpha, beta=section.beta)
    return plan(broken_mtbf_s=broken, target_mtbf_s=target, alpha=section.alpha, beta=section.beta,
                max_exposure_s=max_exposure, max_hangs=max_hangs)
