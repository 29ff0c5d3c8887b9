"""The harness's own Prometheus endpoint (section ``exporter:``)."""

from __future__ import annotations

from pydantic import Field

from soak.configbase import StrictModel


class ExporterConfig(StrictModel):
    enabled: bool = True
    # Loopback unless the operator opens it up (docker-compose's Prometheus
    # uses the host network, so it reaches 127.0.0.1).
    host: str = "127.0.0.1"
    # 9464: the port OpenTelemetry's Prometheus exporters use; 0 picks a free one.
    port: int = Field(9464, ge=0, le=65535)
