"""The harness's own Prometheus endpoint."""

from __future__ import annotations

from soak.configbase import StrictModel


class ExporterConfig(StrictModel):
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 9464
