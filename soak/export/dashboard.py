"""The Grafana dashboard, built from data (``soak.export.dashboard_panels``) so
layout and queries stay consistent.

``build_dashboard()`` returns the Grafana 10 dashboard model that
``dashboards/grafana/dashboards/soak.json`` holds; the test suite checks the
checked-in file equals it. Regenerate after an edit here with::

    python -m soak.export.dashboard > dashboards/grafana/dashboards/soak.json

Every query goes through the ``$datasource`` variable and filters on the
``box`` label (``$box``; "All" also matches series without the label), so the
same dashboard serves any Prometheus that scrapes the harness, the server and
dcgm-exporter.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from soak.export.dashboard_annotations import annotations
from soak.export.dashboard_oracle import oracle_row
from soak.export.dashboard_panels import panels
from soak.export.grafana import DATASOURCE, GRID_WIDTH, panel_json

DEFAULT_FROM = "now-24h"


def build_dashboard() -> dict[str, Any]:
    grid: list[dict[str, Any]] = []
    panel_id = 1
    y = 0
    rows = panels()
    rows.insert(1, oracle_row())  # right after the verdict: are the answers right?
    for row in rows:
        x, line_height = 0, 0
        for panel in row:
            if x + panel.width > GRID_WIDTH:
                x, y, line_height = 0, y + line_height, 0
            grid.append(panel_json(panel, panel_id, x, y))
            panel_id += 1
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return {
        "uid": "soak-overview",
        "title": "soak: vLLM soak test",
        "description": "Is the soak healthy, when did a hang begin, which GPU went quiet.",
        "tags": ["soak", "vllm"],
        "timezone": "utc",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "schemaVersion": 39,
        "version": 1,
        # A person opening it at 09:00 sees the whole night (a 01:30 start, 66 minutes or
        # 8 hours of it): the run's start, end and incidents are annotations on it.
        "time": {"from": DEFAULT_FROM, "to": "now"},
        "timepicker": {},
        "links": [],
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "annotations": {"list": annotations()},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "refresh": 1,
                    "regex": "",
                    "options": [],
                    "includeAll": False,
                    "multi": False,
                },
                {
                    "name": "box",
                    "label": "Box",
                    "type": "query",
                    "datasource": DATASOURCE,
                    "definition": "label_values(up, box)",
                    "query": {"query": "label_values(up, box)", "refId": "PrometheusVariableQueryEditor-VariableQuery"},
                    # All by default: a Prometheus without box labels still shows everything.
                    "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                    "hide": 0,
                    "refresh": 2,
                    "regex": "",
                    "sort": 1,
                    "options": [],
                    "includeAll": True,
                    # "All" also matches series without a box label.
                    "allValue": ".*",
                    "multi": True,
                },
            ]
        },
        "panels": grid,
    }


def main() -> int:
    json.dump(build_dashboard(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
