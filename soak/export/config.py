"""What the run shows the outside world: the harness's own Prometheus endpoint
(section ``exporter:``) and the live view on the terminal (section ``view:``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from soak.configbase import Duration, StrictModel


class ExporterConfig(StrictModel):
    enabled: bool = True
    # Loopback unless the operator opens it up (docker-compose's Prometheus
    # uses the host network, so it reaches 127.0.0.1).
    host: str = "127.0.0.1"
    # 9464: the port OpenTelemetry's Prometheus exporters use; 0 picks a free one.
    port: int = Field(9464, ge=0, le=65535)
    # At the end of a run, wait this long at most for one more scrape, so the
    # final incident and verdict reach Prometheus (only when something has
    # been scraping; 0: never wait). Above docker-compose's 5 s interval.
    final_scrape_wait: Duration = 6.0


class ViewConfig(StrictModel):
    """The live view: a refreshing status on a terminal, plain lines otherwise."""

    # auto: rich on a terminal, plain lines when stdout is not one.
    mode: Literal["auto", "rich", "plain", "off"] = "auto"
    refresh: Annotated[Duration, Field(gt=0)] = 1.0
    plain_interval: Annotated[Duration, Field(gt=0)] = 30.0
