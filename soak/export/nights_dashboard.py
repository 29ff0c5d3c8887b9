"""The "soak nights" Grafana dashboard: the nightly's memory, from what runs and
``soak history`` push to the Pushgateway (soak/report/push.py).

``build_nights_dashboard()`` returns the model that
``dashboards/grafana/dashboards/soak-nights.json`` holds; the lint test checks
the checked-in file equals it. Regenerate after an edit here with::

    python -m soak.export.nights_dashboard > dashboards/grafana/dashboards/soak-nights.json

Pushed values are the last push of each group (box, build), scraped again and
again: over weeks each series steps once a night, which is the history a person
wants to see (exposure, hangs, MTBF per build over time).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from soak.export.grafana import DATASOURCE, GRID_WIDTH, Panel, Target, panel_json
from soak.standing import FIXED_VALUES, UNDECIDED_EXIT

BOX = 'box=~"$box"'
SEL = f'{{{BOX},build=~"$build"}}'
_STAT = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "colorMode": "background"}
NO_RUN_GREY = "#808080"
# A night older than this is not last night's: the stat reads "no run" (grey).
LAST_NIGHT_S = 36 * 3600
NO_RUN = -1
# By soak run's exit status (CONTRACTS.md): a hang or a crash (1) is red, a breached
# SLO without an incident (99, k6's convention) orange; a prove: run whose test did not
# decide (5) blue, "soak more", as the live dashboard draws an undecided test: neither a
# pass nor a failure, and no "harness" purple; no run grey, never red.
UNDECIDED_BLUE = "blue"
_NIGHT_MAPPINGS = [
    {"type": "value", "options": {
        str(NO_RUN): {"text": "no run", "color": NO_RUN_GREY, "index": 0},
        "0": {"text": "pass", "color": "green", "index": 1},
        "1": {"text": "fail: incident", "color": "red", "index": 2},
        "2": {"text": "bad config", "color": "purple", "index": 3},
        "3": {"text": "target never ready", "color": "purple", "index": 4},
        "4": {"text": "harness fault", "color": "purple", "index": 5},
        str(UNDECIDED_EXIT): {"text": "undecided", "color": UNDECIDED_BLUE, "index": 6},
        "99": {"text": "SLO breached", "color": "orange", "index": 7},
        "130": {"text": "interrupted", "color": "purple", "index": 8},
    }},
    {"type": "special", "options": {"match": "null+nan", "result": {"text": "no run", "color": NO_RUN_GREY,
                                                                    "index": 9}}},
]
_NIGHT_COLORS = {"mode": "absolute", "steps": [
    {"color": NO_RUN_GREY, "value": None}, {"color": "green", "value": 0}, {"color": "red", "value": 1},
    {"color": "purple", "value": 2}, {"color": UNDECIDED_BLUE, "value": UNDECIDED_EXIT},
    {"color": "purple", "value": UNDECIDED_EXIT + 1}, {"color": "orange", "value": 99},
    {"color": "purple", "value": 100},
]}
# Each build's latest exit status while its latest night started within LAST_NIGHT_S, else NO_RUN.
_LAST_NIGHT = (
    f"(max by (build) (soak_night_exit_code{SEL}) and on (build) "
    f"(time() - max by (build) (soak_night_start_time_seconds{SEL}) < {LAST_NIGHT_S})) "
    f"or on (build) (0 * max by (build) (soak_night_start_time_seconds{SEL}) - {-NO_RUN})"
)
# soak_build_fixed back to the words of the one verdict it was pushed from (soak.history.verdict)
_FIXED_COLOURS = {-1: "orange", 0: "red", 1: "green"}
_FIXED_MAPPINGS = [{"type": "value", "options": {
    str(value): {"text": standing.value, "color": _FIXED_COLOURS[value], "index": i}
    for i, (standing, value) in enumerate(sorted(FIXED_VALUES.items(), key=lambda kv: kv[1]))
}}]
# The verdict's sentence beside its build: the words the terminal and history.html say.
_VERDICT_COLUMNS = {"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True},
                                                  "indexByName": {"build": 0, "standing": 1, "sentence": 2}}}
_STEPS_LINE = {"custom": {"lineInterpolation": "stepAfter", "showPoints": "always", "spanNulls": True}}


def panels() -> list[list[Panel]]:
    return [
        [
            Panel("Last night", "stat", [Target(_LAST_NIGHT, "{{build}}")], width=8,
                  height=5, description="Each build's latest night by soak run's exit status: pass (green), an "
                  "incident such as a hang (red), thresholds breached without an incident (exit 99, orange), "
                  "a prove: test that did not decide (exit 5, blue: soak more), "
                  f"no night in the last {LAST_NIGHT_S // 3600} h (grey).", mappings=_NIGHT_MAPPINGS,
                  thresholds=_NIGHT_COLORS, options=_STAT),
            Panel("Fixed?", "stat", [Target(f"max by (build) (soak_build_fixed{SEL})", "{{build}}")],
                  width=8, height=5, description="soak history's one verdict per build (the table below says its "
                  "sentence): the sequential test's where --prove tested the build, else the MTBF bound and the "
                  "rate-ratio test against the baseline build.", mappings=_FIXED_MAPPINGS,
                  thresholds={"mode": "absolute", "steps": [{"color": "orange", "value": None},
                                                            {"color": "red", "value": 0},
                                                            {"color": "green", "value": 1}]}, options=_STAT),
            Panel("Better than the baseline (confidence)", "stat",
                  [Target(f"max by (build) (soak_build_better_confidence{SEL})", "{{build}}")], width=8, height=5,
                  unit="percentunit", min=0, max=1, description="Exact Poisson rate-ratio test, one-sided.",
                  thresholds={"mode": "absolute", "steps": [{"color": "orange", "value": None},
                                                            {"color": "green", "value": 0.95}]}, options=_STAT),
        ],
        [
            Panel("Is it fixed? One verdict per build", "table", [
                Target(f"max by (build, standing, sentence) (soak_build_verdict_info{SEL})", instant=True, table=True),
            ], width=24, height=5, description="soak history's sentence for each build, as history.html and the "
               "terminal say it (soak.history.verdict).", options={"showHeader": True},
               transformations=[_VERDICT_COLUMNS]),
        ],
        [
            Panel("MTBF per build (pooled)", "timeseries", [
                Target(f"max by (build) (soak_build_mtbf_lower_bound_seconds{SEL})", "{{build}} proven above"),
                Target(f"max by (build) (soak_build_mtbf_seconds{SEL})", "{{build}} estimate"),
            ], unit="s", description="soak history's pooled MTBF: the one-sided lower bound at its confidence "
               "(what the nights prove) and the point estimate (builds that hung).", options={}),
            Panel("Pooled exposure per build", "timeseries", [
                Target(f"max by (build) (soak_build_exposure_seconds{SEL})", "{{build}} exposure"),
            ], unit="s", description="Time at risk pooled over every night of the build.", options={}),
        ],
        [
            Panel("Hangs per build (pooled)", "timeseries",
                  [Target(f"max by (build) (soak_build_hangs{SEL})", "{{build}}")], width=6, options={}),
            Panel("Hangs per night", "timeseries",
                  [Target(f"max by (build) (soak_night_hangs{SEL})", "{{build}}")], width=6, options={}),
            # the oracle's: a night whose answers were wrong failed, whether or not it hung
            Panel("Corruptions per night", "timeseries",
                  [Target(f'max by (build) (soak_night_incidents{{{BOX},build=~"$build",kind="corruption"}})',
                          "{{build}}")], width=6, min=0, description="Wrong answers the correctness oracle could "
                  "not explain (a failed night, exit 1; the night's report shows the answers side by side).",
                  options={}),
            Panel("Exposure per night", "timeseries",
                  [Target(f"max by (build) (soak_night_exposure_seconds{SEL})", "{{build}}")], width=6, unit="s",
                  options={}),
        ],
        [
            Panel("MTBF proven by each night", "timeseries",
                  [Target(f"max by (build) (soak_night_mtbf_lower_bound_seconds{SEL})", "{{build}}")], width=8,
                  unit="s", options={}),
            Panel("Throughput per night", "timeseries",
                  [Target(f"max by (build) (soak_night_output_tokens_per_second{SEL})", "{{build}}")], width=8,
                  unit="short", description="Generated tokens per second, warm-up excluded.", options={}),
            # TTFT runs to seconds, TPOT to milliseconds: one axis would flatten TPOT to 0.
            Panel("TTFT per night", "timeseries", [
                Target(f'max by (build) (soak_night_ttft_seconds{{{BOX},build=~"$build",quantile="0.5"}})',
                       "{{build}} TTFT p50"),
                Target(f'max by (build) (soak_night_ttft_seconds{{{BOX},build=~"$build",quantile="0.99"}})',
                       "{{build}} TTFT p99"),
            ], width=4, unit="s", min=0, options={}),
            Panel("TPOT per night", "timeseries", [
                Target(f'max by (build) (soak_night_tpot_seconds{{{BOX},build=~"$build",quantile="0.5"}})',
                       "{{build}} TPOT p50"),
                Target(f'max by (build) (soak_night_tpot_seconds{{{BOX},build=~"$build",quantile="0.99"}})',
                       "{{build}} TPOT p99"),
            ], width=4, unit="s", min=0, options={}),
        ],
        [
            Panel("Nights", "table", [
                Target(f"max by (build, run, vllm_version, launch_digest, verdict) (soak_night_info{SEL})",
                       instant=True, table=True),
            ], width=24, height=7, description="The last pushed night of each build.", options={"showHeader": True}),
        ],
    ]


def _variable(name: str, label: str) -> dict[str, Any]:
    query = f"label_values(soak_night_exposure_seconds, {name})"
    return {
        "name": name, "label": label, "type": "query", "datasource": DATASOURCE, "definition": query,
        "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "hide": 0, "refresh": 2, "regex": "",
        "sort": 1, "options": [], "includeAll": True, "allValue": ".*", "multi": True,
    }


def build_nights_dashboard() -> dict[str, Any]:
    grid: list[dict[str, Any]] = []
    panel_id, y = 1, 0
    for row in panels():
        x, line_height = 0, 0
        for panel in row:
            if x + panel.width > GRID_WIDTH:
                x, y, line_height = 0, y + line_height, 0
            model = panel_json(panel, panel_id, x, y)
            if panel.type == "timeseries":
                model["fieldConfig"]["defaults"]["custom"] = dict(_STEPS_LINE["custom"])
            grid.append(model)
            panel_id += 1
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return {
        "uid": "soak-nights",
        "title": "soak nights",
        "description": "Across nights: exposure, hangs and MTBF per build; does the fix hold, what does it cost.",
        "tags": ["soak", "vllm", "nightly"],
        "timezone": "utc",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "5m",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-30d", "to": "now"},
        "timepicker": {},
        "links": [{"title": "soak: vLLM soak test", "type": "link", "url": "/d/soak-overview"}],
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "annotations": {"list": []},
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus", "current": {},
             "hide": 0, "refresh": 1, "regex": "", "options": [], "includeAll": False, "multi": False},
            _variable("box", "Box"),
            _variable("build", "Build"),
        ]},
        "panels": grid,
    }


def main() -> int:
    json.dump(build_nights_dashboard(), sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
