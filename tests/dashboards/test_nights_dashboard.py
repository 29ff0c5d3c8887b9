"""The "soak nights" dashboard passes the same lint as the live one."""

from __future__ import annotations

import copy

from soak.export.lint import (
    NIGHTS_DASHBOARD_PATH, dashboard_expressions, dashboard_problems, known_series_names, load_dashboard, load_rules,
    unknown_metric_names,
)
from soak.export.names import PUSHED_METRICS
from soak.export.nights_dashboard import build_nights_dashboard


def test_checked_in_nights_dashboard_is_the_generated_one():
    # Regenerate: python -m soak.export.nights_dashboard > dashboards/grafana/dashboards/soak-nights.json
    assert load_dashboard(NIGHTS_DASHBOARD_PATH) == build_nights_dashboard()


def test_datasource_variable_unique_ids_grid_and_known_names():
    dashboard = load_dashboard(NIGHTS_DASHBOARD_PATH)
    assert dashboard_problems(dashboard) == []
    assert unknown_metric_names(dashboard_expressions(dashboard), known_series_names(load_rules())) == []
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["build"]["includeAll"] and variables["box"]["allValue"] == ".*"
    assert dashboard["uid"] != load_dashboard()["uid"]  # provisioned beside soak.json


def test_exposure_hangs_and_mtbf_per_build_are_on_it():
    exprs = " ".join(e.expr for e in dashboard_expressions(load_dashboard(NIGHTS_DASHBOARD_PATH)))
    for name in ("soak_build_exposure_seconds", "soak_build_hangs", "soak_build_mtbf_lower_bound_seconds",
                 "soak_night_exposure_seconds", "soak_night_hangs", "soak_night_output_tokens_per_second"):
        assert name in exprs and name in PUSHED_METRICS, name
    assert 'build=~"$build"' in exprs and 'box=~"$box"' in exprs


def test_the_lint_catches_an_unknown_pushed_name_and_a_hard_coded_uid():
    dashboard = copy.deepcopy(load_dashboard(NIGHTS_DASHBOARD_PATH))
    dashboard["panels"][0]["targets"][0]["expr"] = "soak_night_exposure_minutes"
    dashboard["panels"][1]["datasource"] = {"type": "prometheus", "uid": "P1809F7CD0C75ACF3"}
    assert any("soak_night_exposure_minutes" in p
               for p in unknown_metric_names(dashboard_expressions(dashboard), known_series_names(load_rules())))
    assert any("P1809F7CD0C75ACF3" in p for p in dashboard_problems(dashboard))
