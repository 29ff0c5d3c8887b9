"""The ``oracle:`` section of a run config: the correctness oracle's canaries.

    oracle:
      enabled: true            # on by default wherever the target serves greedy decoding
      interval: 20s            # at most one canary started per interval (and the share below)
      max_share: 0.02          # the canaries' share of server time, at most
      short: 4                 # short canary prompts
      long: 2                  # long ones: the workload's own cached prefixes at full context
      max_tokens: 32           # tokens each canary generates
      top_logprobs: 5          # alternatives asked for at each position
      tie_margin: 0.2          # nats: a divergence is explained when the reference token's
                               #   logprob is within this of the chosen one's (docs/oracle.md)
      timeout: 120s            # one canary's whole request
      reference: FILE          # read: references recorded from a known-good build
      record_reference: FILE   # write: this run's references, for later nights

A relative path is beside the config file. Checked when the config is read: one
``ConfigError`` naming ``oracle.<field>`` (exit 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

from pydantic import Field, ValidationInfo, field_validator

from soak.configbase import Duration, StrictModel

Positive = Annotated[Duration, Field(gt=0)]


class OracleConfig(StrictModel):
    enabled: bool = True
    interval: Positive = 20.0
    max_share: float = Field(default=0.02, gt=0, le=0.5)
    short: int = Field(default=4, ge=0, le=64)
    long: int = Field(default=2, ge=0, le=16)
    max_tokens: int = Field(default=32, ge=1, le=4096)
    top_logprobs: int = Field(default=5, ge=1, le=20)
    tie_margin: float = Field(default=0.2, ge=0, le=5)
    timeout: Positive = 120.0
    reference: Optional[str] = Field(default=None, min_length=1)
    record_reference: Optional[str] = Field(default=None, min_length=1)

    @field_validator("reference", "record_reference")
    @classmethod
    def _beside_the_config(cls, value: str | None, info: ValidationInfo) -> str | None:
        base = (info.context or {}).get("base_dir") if isinstance(info.context, dict) else None
        if value is None or base is None or Path(value).is_absolute():
            return value
        return str(Path(base) / value)
