"""Checks of the dashboard and the Prometheus rules, pure functions over their data.

The tests run these on the files in ``dashboards/``; each returns the list of
problems found (empty when all is well), so a failure names every offender.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import yaml

from soak.export.names import exported_series_names, pushed_series_names
from soak.metric_names import DCGM_FIELDS, VLLM_METRICS

# The checked-in files beside the package (a source checkout or an editable install).
REPO_ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_PATH = REPO_ROOT / "dashboards" / "grafana" / "dashboards" / "soak.json"
NIGHTS_DASHBOARD_PATH = REPO_ROOT / "dashboards" / "grafana" / "dashboards" / "soak-nights.json"
RULES_PATH = REPO_ROOT / "dashboards" / "prometheus" / "rules" / "soak.rules.yml"
RULES_TEST_PATH = REPO_ROOT / "dashboards" / "prometheus" / "tests" / "soak.rules.test.yml"
PROMETHEUS_CONFIG_PATH = REPO_ROOT / "dashboards" / "prometheus" / "prometheus.yml"
COMPOSE_PATH = REPO_ROOT / "docker-compose.yml"

DATASOURCE_UID = "${datasource}"
# Prometheus's own series that the dashboard and rules may read.
PROMETHEUS_BUILTINS = frozenset({"up", "ALERTS", "ALERTS_FOR_STATE"})

_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
     "inf", "nan", "Inf", "NaN"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_GRAFANA_VARIABLE = re.compile(r"\$\{?\w+\}?")
# An alert or annotation condition: `<signal> <comparison> <number>`.
_TRAILING_COMPARISON = re.compile(r"^(?P<signal>.*?)\s*(?:==|!=|>=|<=|>|<)\s*(?:bool\s+)?-?[0-9.]+\s*$", re.S)


def metric_names_in(expr: str) -> set[str]:
    """The series names a PromQL expression selects (functions, labels and keywords left out)."""
    text = _STRING.sub('""', expr)
    text = _BRACES.sub("{}", text)
    text = _BRACKETS.sub("[]", text)
    text = _GROUPING.sub(" ", text)
    text = _GRAFANA_VARIABLE.sub(" ", text)
    names: set[str] = set()
    for match in _IDENT.finditer(text):
        name = match.group()
        rest = text[match.end():].lstrip()
        if rest.startswith("("):
            continue  # a function call
        if name in _KEYWORDS:
            continue
        before = text[: match.start()]
        if before and (before[-1].isdigit() or before[-1] == "."):
            continue  # an exponent or unit inside a number, e.g. 1e3
        names.add(name)
    return names


def signal_of(expr: str) -> str:
    """An alert's or annotation's condition with its trailing comparison taken off."""
    match = _TRAILING_COMPARISON.match(expr.strip())
    return match.group("signal").strip() if match else expr.strip()


@dataclass(frozen=True)
class Expression:
    where: str  # "panel 3 'Token rates' target B", "rule soak:gpus:count", ...
    expr: str
    condition: bool = False  # an alert or annotation: compared, may be empty when healthy


def load_dashboard(path: Path = DASHBOARD_PATH) -> dict[str, Any]:
    import json

    return json.loads(Path(path).read_text(encoding="utf-8"))


def load_rules(path: Path = RULES_PATH) -> dict[str, Any]:
    return yaml.safe_load(Path(path).read_text(encoding="utf-8"))


def dashboard_expressions(dashboard: dict[str, Any]) -> Iterator[Expression]:
    for panel in dashboard.get("panels", []):
        for target in panel.get("targets", []):
            yield Expression(f"panel {panel.get('id')} {panel.get('title')!r} target {target.get('refId')}", target["expr"])
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if "expr" in annotation:
            yield Expression(f"annotation {annotation.get('name')!r}", annotation["expr"], condition=True)
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable.get("query")
            text = query.get("query") if isinstance(query, dict) else query
            inner = re.fullmatch(r"\s*label_values\((?:(.*),)?\s*\w+\s*\)\s*", text or "")
            if inner and inner.group(1):
                yield Expression(f"variable {variable.get('name')!r}", inner.group(1).strip())


def rule_expressions(rules: dict[str, Any]) -> Iterator[Expression]:
    for group in rules.get("groups", []):
        for rule in group.get("rules", []):
            if "record" in rule:
                yield Expression(f"rule {rule['record']}", rule["expr"])
            else:
                yield Expression(f"alert {rule['alert']}", rule["expr"], condition=True)


def recorded_names(rules: dict[str, Any]) -> set[str]:
    return {rule["record"] for group in rules.get("groups", []) for rule in group.get("rules", []) if "record" in rule}


def known_series_names(rules: dict[str, Any]) -> set[str]:
    """What an expression may select: the harness (exported and pushed), vLLM and DCGM tables,
    recording rules, Prometheus's own. Never a ``_created`` series: a harness with
    PROMETHEUS_DISABLE_CREATED_SERIES, or a Prometheus ingesting created timestamps, has none."""
    vllm = {name for spec in VLLM_METRICS.values() for name in spec.sample_names}
    dcgm = {field.exposed for field in DCGM_FIELDS.values()}
    known = (set(exported_series_names()) | set(pushed_series_names()) | vllm | dcgm | recorded_names(rules)
             | set(PROMETHEUS_BUILTINS))
    return {name for name in known if not name.endswith("_created")}


def unknown_metric_names(expressions: Iterable[Expression], known: set[str]) -> list[str]:
    problems = []
    for e in expressions:
        for name in sorted(metric_names_in(e.expr) - known):
            if name.endswith("_created"):
                problems.append(f"{e.where}: {name} is a _created series, absent where the harness or "
                                "Prometheus is set not to keep them; export an explicit gauge")
            else:
                problems.append(f"{e.where}: {name} is exported by neither the harness, vLLM, DCGM nor a rule")
    return problems


def dashboard_problems(dashboard: dict[str, Any], *, grid_width: int = 24) -> list[str]:
    """Datasource variable everywhere, unique ids, valid non-overlapping gridPos."""
    problems: list[str] = []
    variables = {v.get("name"): v for v in dashboard.get("templating", {}).get("list", [])}
    if variables.get("datasource", {}).get("type") != "datasource":
        problems.append("no datasource template variable named 'datasource'")
    if "box" not in variables:
        problems.append("no 'box' template variable")
    ids: dict[Any, str] = {}
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard.get("panels", []):
        name = f"panel {panel.get('id')} {panel.get('title')!r}"
        if panel.get("id") in ids:
            problems.append(f"{name}: id also used by {ids[panel.get('id')]}")
        ids[panel.get("id")] = name
        sources = [panel.get("datasource")] + [t.get("datasource") for t in panel.get("targets", [])]
        for source in sources:
            if not isinstance(source, dict) or source.get("uid") != DATASOURCE_UID:
                problems.append(f"{name}: datasource {source!r} is not the ${{datasource}} variable")
        if not panel.get("targets"):
            problems.append(f"{name}: no queries")
        grid = panel.get("gridPos") or {}
        try:
            x, y, w, h = (int(grid[k]) for k in ("x", "y", "w", "h"))
        except (KeyError, TypeError, ValueError):
            problems.append(f"{name}: gridPos {grid!r} lacks integer x, y, w, h")
            continue
        if x < 0 or y < 0 or w < 1 or h < 1 or x + w > grid_width:
            problems.append(f"{name}: gridPos {grid!r} falls outside the {grid_width}-column grid")
            continue
        for cx in range(x, x + w):
            for cy in range(y, y + h):
                if (cx, cy) in cells and cells[(cx, cy)] != name:
                    problems.append(f"{name}: overlaps {cells[(cx, cy)]} at column {cx}, row {cy}")
                    break
                cells[(cx, cy)] = name
            else:
                continue
            break
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if (annotation.get("datasource") or {}).get("uid") != DATASOURCE_UID:
            problems.append(f"annotation {annotation.get('name')!r}: not on the ${{datasource}} variable")
    return problems


# Series whose values lie orders of magnitude apart: one linear axis holding two of
# these groups flattens the smaller to a line at 0 (prompt tokens run about 3000
# times faster than generated ones, and flattened the hang signal; TTFT runs to
# seconds where TPOT stays below a millisecond).
SCALE_GROUPS: dict[str, frozenset[str]] = {
    "prompt tokens": frozenset({"vllm:prompt_tokens_total", "soak_prompt_tokens_total"}),
    "generated tokens": frozenset({"vllm:generation_tokens_total", "soak_generated_tokens_total",
                                   "soak_client_streamed_tokens_total"}),
    "TTFT": frozenset({"soak_night_ttft_seconds"}),
    "TPOT": frozenset({"soak_night_tpot_seconds"}),
}


def _right_axis_fields(panel: dict[str, Any]) -> set[str]:
    """Display names an override moves to the right axis."""
    names = set()
    for override in panel.get("fieldConfig", {}).get("overrides", []):
        matcher = override.get("matcher", {})
        if matcher.get("id") != "byName":
            continue
        if any(p.get("id") == "custom.axisPlacement" and p.get("value") == "right" for p in override.get("properties", [])):
            names.add(matcher.get("options"))
    return names


def scale_problems(dashboard: dict[str, Any]) -> list[str]:
    """Time-series panels that put two scale groups on one linear axis (a log axis,
    or a right-axis override for one group, is fine)."""
    problems = []
    for panel in dashboard.get("panels", []):
        if panel.get("type") != "timeseries":
            continue
        custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
        if (custom.get("scaleDistribution") or {}).get("type") == "log":
            continue
        right = _right_axis_fields(panel)
        sides: dict[str, set[str]] = {}
        for target in panel.get("targets", []):
            names = metric_names_in(target.get("expr", ""))
            side = "right" if target.get("legendFormat") in right else "left"
            for group, members in SCALE_GROUPS.items():
                if names & members:
                    sides.setdefault(side, set()).add(group)
        for side, groups in sorted(sides.items()):
            if len(groups) > 1:
                problems.append(f"panel {panel.get('id')} {panel.get('title')!r}: "
                                f"{' and '.join(sorted(groups))} on one linear {side} axis")
    return problems


_RELATIVE = re.compile(r"^now-(?P<n>\d+)(?P<unit>[smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def default_range_s(dashboard: dict[str, Any]) -> float | None:
    """Seconds the dashboard's default time range reaches back ("now-24h" to "now"),
    None for anything else (an absolute range shows one night only, forever)."""
    time_range = dashboard.get("time") or {}
    match = _RELATIVE.match(str(time_range.get("from", "")))
    if not match or time_range.get("to") != "now":
        return None
    return int(match.group("n")) * _UNIT_S[match.group("unit")]


def time_range_problems(dashboard: dict[str, Any], *, at_least_s: float) -> list[str]:
    reach = default_range_s(dashboard)
    if reach is None:
        return [f"default time range {dashboard.get('time')!r} is not 'now-N' to 'now'"]
    if reach < at_least_s:
        return [(f"default time range reaches back {reach / 3600:g} h, less than the {at_least_s / 3600:g} h "
                 "a person needs to see last night the morning after")]
    return []
