"""The Grafana panel model the dashboards are built from (``Panel``, ``Target``)
and its Grafana 10 JSON (``panel_json``), shared by soak.json
(``soak.export.dashboard``) and soak-nights.json (``soak.export.nights_dashboard``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24


@dataclass
class Target:
    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False


@dataclass
class Panel:
    title: str
    type: str
    targets: list[Target]
    width: int = 12
    height: int = 8
    description: str = ""
    unit: str | None = None
    min: float | None = None
    max: float | None = None
    mappings: list[dict[str, Any]] | None = None
    thresholds: dict[str, Any] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    overrides: list[dict[str, Any]] = field(default_factory=list)
    transformations: list[dict[str, Any]] = field(default_factory=list)


def panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"custom": {}}
    if panel.unit:
        defaults["unit"] = panel.unit
    if panel.min is not None:
        defaults["min"] = panel.min
    if panel.max is not None:
        defaults["max"] = panel.max
    if panel.mappings:
        defaults["mappings"] = panel.mappings
    if panel.thresholds:
        defaults["thresholds"] = panel.thresholds
        if panel.type in ("state-timeline", "stat"):
            defaults["color"] = {"mode": "thresholds"}
    out: dict[str, Any] = {
        "id": panel_id,
        "type": panel.type,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": panel.width, "h": panel.height},
        "fieldConfig": {"defaults": defaults, "overrides": panel.overrides},
        "options": panel.options,
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DATASOURCE,
                "expr": t.expr,
                "legendFormat": t.legend or "__auto",
                "range": not t.instant,
                "instant": t.instant,
                "format": "table" if t.table else "time_series",
            }
            for i, t in enumerate(panel.targets)
        ],
    }
    if panel.transformations:
        out["transformations"] = panel.transformations
    return out
