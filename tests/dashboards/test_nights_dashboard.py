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


def _last_night():
    by_title = {p["title"]: p for p in load_dashboard(NIGHTS_DASHBOARD_PATH)["panels"]}
    return by_title["Last night"]


def _shown(panel, value):
    """What the stat shows for a value: its mapping's text and colour."""
    for mapping in panel["fieldConfig"]["defaults"]["mappings"]:
        if mapping["type"] == "value" and str(value) in mapping["options"]:
            return mapping["options"][str(value)]
        if mapping["type"] == "special" and value is None:
            return mapping["options"]["result"]
    return None


def test_last_night_tells_an_slo_breach_from_a_hang_and_no_run_is_grey():
    panel = _last_night()
    assert "soak_night_exit_code" in panel["targets"][0]["expr"]
    assert _shown(panel, 0) == {"text": "pass", "color": "green", "index": 1}
    assert _shown(panel, 1)["color"] == "red"  # a hang (exit 1)
    assert _shown(panel, 99)["color"] == "orange" and "SLO" in _shown(panel, 99)["text"]
    for no_run in (-1, None):
        assert _shown(panel, no_run)["text"] == "no run" and _shown(panel, no_run)["color"] not in ("red", "orange")
    # the thresholds agree with the mappings wherever a value has no mapping of its own
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    colour = lambda v: [s["color"] for s in steps if s["value"] is None or v >= s["value"]][-1]  # noqa: E731
    assert (colour(-1), colour(0), colour(1), colour(99)) == (_shown(panel, -1)["color"], "green", "red", "orange")
    assert colour(5) == _shown(panel, 5)["color"] and colour(4) == colour(6) == _shown(panel, 4)["color"]


def _colour(panel, value):
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    return [s["color"] for s in steps if s["value"] is None or value >= s["value"]][-1]


def test_last_night_shows_an_undecided_prove_night_as_its_own_state():
    """Exit 5 (a prove: test that did not decide) is neither pass green, fail red, SLO orange
    nor the harness's purple: it reads "undecided" in a colour of its own."""
    panel = _last_night()
    undecided = _shown(panel, 5)
    assert undecided["text"] == "undecided"
    others = {_shown(panel, code)["color"] for code in (-1, 0, 1, 2, 3, 4, 99, 130)}
    assert undecided["color"] not in others and _colour(panel, 5) == undecided["color"]
    assert "exit 5" in panel["description"]


def test_an_undecided_night_is_pushed_as_exit_5_and_shown_as_undecided():
    """The push's value for the night (soak/report/push.py) is the exit status itself, 5,
    beside a pass verdict (0); the "Last night" stat maps that very value."""
    import json
    from pathlib import Path

    from soak.report.push import night_families
    from soak.summary_file import RunSummary

    run = Path(__file__).resolve().parents[1] / "fixtures" / "prove" / "real_undecided"
    summary = RunSummary.from_json(json.loads((run / "summary.json").read_text()))
    families = night_families(summary, exit_code=None, confidence=0.95)  # None: the summary's own
    pushed = {s.name: s.value for m in families.registry.collect() for s in m.samples}
    assert pushed["soak_night_exit_code"] == 5 and pushed["soak_night_verdict"] == 0
    assert _shown(_last_night(), int(pushed["soak_night_exit_code"]))["text"] == "undecided"
    assert "5 prove: undecided" in PUSHED_METRICS["soak_night_exit_code"].help


def test_ttft_and_tpot_are_not_on_one_linear_axis():
    from soak.export.lint import scale_problems

    dashboard = load_dashboard(NIGHTS_DASHBOARD_PATH)
    assert scale_problems(dashboard) == []
    by_title = {p["title"]: p for p in dashboard["panels"]}
    assert "soak_night_ttft_seconds" in str(by_title["TTFT per night"]["targets"])
    assert "soak_night_tpot_seconds" in str(by_title["TPOT per night"]["targets"])
    assert "soak_night_ttft_seconds" not in str(by_title["TPOT per night"]["targets"])


def test_the_default_range_holds_a_month_of_nights():
    from soak.export.lint import time_range_problems

    assert time_range_problems(load_dashboard(NIGHTS_DASHBOARD_PATH), at_least_s=14 * 86400) == []
