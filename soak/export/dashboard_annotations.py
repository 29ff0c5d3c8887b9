"""The live dashboard's annotations: a night's start and end, its incidents (a corruption
also in a colour of its own) and
the detector's hung verdicts on every time panel (``soak.export.dashboard``
puts them in; the real-Prometheus test checks each mark lands where the run
directory says)."""

from __future__ import annotations

from typing import Any

from soak.export.dashboard_panels import BOX
from soak.export.grafana import DATASOURCE

# The run's name and id beside each run mark (soak_run_info is 1: multiplying by it keeps the value).
_WITH_RUN = f'* on (instance, job) group_left (name, run) soak_run_info{{run!="",{BOX}}}'


def annotations() -> list[dict[str, Any]]:
    """A night on every time panel: its start and end, its incidents, the detector's hung verdicts.

    The start and the end are series whose value is the moment itself (unix
    seconds; ``useValueForTime`` reads milliseconds), so the mark sits where
    the run started or ended, whatever the query's step. The end is
    ``soak_run_end_time_seconds`` (0 until the harness records ``run_ended``;
    the exporter holds it until one last scrape has read it), never a counter's
    ``_created``, which a harness or Prometheus may be set not to keep."""
    return [
        {
            "name": "Run started",
            "datasource": DATASOURCE,
            "enable": True,
            "iconColor": "blue",
            "expr": f"(soak_run_start_time_seconds{{{BOX}}} > 0) * 1000 {_WITH_RUN}",
            "step": "1m",
            "titleFormat": "run started: {{name}}",
            "textFormat": "run {{run}}",
            "tagKeys": "name",
            "useValueForTime": True,
        },
        {
            "name": "Run ended",
            "datasource": DATASOURCE,
            "enable": True,
            "iconColor": "purple",
            "expr": f"(soak_run_end_time_seconds{{{BOX}}} > 0) * 1000 {_WITH_RUN}",
            "step": "1m",
            "titleFormat": "run ended: {{name}}",
            "textFormat": "run {{run}}; verdict and report: the run directory, the nights dashboard",
            "tagKeys": "name",
            "useValueForTime": True,
        },
        {
            "name": "Incidents",
            "datasource": DATASOURCE,
            "enable": True,
            "iconColor": "red",
            "expr": f"sum by (kind, rule) (increase(soak_incidents_total{{{BOX}}}[1m])) > 0",
            "step": "15s",
            "titleFormat": "incident: {{kind}}",
            "textFormat": "rule {{rule}}",
            "tagKeys": "kind,rule",
            "useValueForTime": False,
        },
        {
            # The oracle's: a wrong answer, while the server still answers (its own colour: no hang)
            "name": "Corruptions",
            "datasource": DATASOURCE,
            "enable": True,
            "iconColor": "purple",
            "expr": f'sum by (rule) (increase(soak_incidents_total{{kind="corruption",{BOX}}}[1m])) > 0',
            "step": "15s",
            "titleFormat": "corruption: a canary's answer was wrong",
            "textFormat": "rule {{rule}}; the run's report.html shows the reference and the answer side by side",
            "tagKeys": "rule",
            "useValueForTime": False,
        },
        {
            "name": "Detector hung",
            "datasource": DATASOURCE,
            "enable": True,
            "iconColor": "orange",
            "expr": f"max(soak_detector_state{{{BOX}}}) == 2",
            "step": "15s",
            "titleFormat": "detector: hung",
            "textFormat": "",
            "tagKeys": "",
            "useValueForTime": False,
        },
    ]
