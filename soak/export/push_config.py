"""The ``pushgateway:`` section: push the night's result to a Prometheus Pushgateway
at the end of a run (soak/report/push.py; docs/nightly.md).

    pushgateway:
      url: http://127.0.0.1:9091
      job: soak-nightly
      grouping: {box: rtx3090-01}        # the build label is added from the run's build

The grouping key names the group a push replaces: one group per box and build
keeps every build's last night side by side.
"""

from __future__ import annotations

import re
from typing import Annotated, Optional

from pydantic import Field, field_validator

from soak.configbase import Duration, StrictModel

_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class PushgatewayConfig(StrictModel):
    url: Optional[str] = None  # None: no push
    job: str = Field("soak", min_length=1)
    grouping: dict[str, str] = {}
    # Add the run's build (its label, else vLLM version and launch digest) as the `build` label.
    build_label: bool = True
    timeout: Annotated[Duration, Field(gt=0)] = 10.0
    # Of the pushed MTBF lower bound.
    confidence: float = Field(0.95, gt=0, lt=1)

    @field_validator("url")
    @classmethod
    def _url(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not re.match(r"^https?://[^/\s]+", value):
            raise ValueError(f"{value!r} is not a URL such as http://127.0.0.1:9091")
        return value.rstrip("/") if value else value

    @field_validator("grouping")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _LABEL.match(key) or key.startswith("__") or key == "job":
                raise ValueError(f"{key!r} is not a label name a grouping key can use")
        return value
