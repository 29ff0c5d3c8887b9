"""The harness's Prometheus exporter (a run sink), and the dashboards' source."""
