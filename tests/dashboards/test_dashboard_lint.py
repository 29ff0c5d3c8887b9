"""The Grafana dashboard as checked in: its structure and every name it queries."""

from __future__ import annotations

import pytest

import copy

from soak.export.dashboard import build_dashboard
from soak.export.lint import (
    dashboard_expressions,
    dashboard_problems,
    known_series_names,
    load_dashboard,
    load_rules,
    metric_names_in,
    rule_expressions,
    signal_of,
    unknown_metric_names,
)


def test_checked_in_dashboard_is_the_generated_one():
    # Regenerate with: python -m soak.export.dashboard > dashboards/grafana/dashboards/soak.json
    assert load_dashboard() == build_dashboard()


def test_panels_use_the_datasource_variable_unique_ids_and_a_grid_without_overlaps():
    assert dashboard_problems(load_dashboard()) == []


def test_the_linter_catches_a_hard_coded_uid_a_duplicate_id_and_an_overlap():
    dashboard = copy.deepcopy(load_dashboard())
    first, second = dashboard["panels"][0], dashboard["panels"][1]
    first["targets"][0]["datasource"] = {"type": "prometheus", "uid": "P1809F7CD0C75ACF3"}
    second["id"] = first["id"]
    second["gridPos"] = dict(first["gridPos"], x=first["gridPos"]["x"] + 1)
    problems = dashboard_problems(dashboard)
    assert any("P1809F7CD0C75ACF3" in p for p in problems)
    assert any("id also used" in p for p in problems)
    assert any("overlaps" in p for p in problems)


def test_grafana_10_model_with_datasource_and_box_variables():
    dashboard = load_dashboard()
    assert dashboard["schemaVersion"] >= 38  # Grafana 10.0 writes 38
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["box"]["includeAll"] and variables["box"]["allValue"] == ".*"
    assert "P1809F7CD0C75ACF3" not in str(dashboard)


def test_every_panel_the_morning_check_needs_is_there():
    by_title = {p["title"]: p for p in load_dashboard()["panels"]}
    gpu = by_title["GPU utilization (harness)"]
    # A state timeline whose colours split idle (red) from busy (green).
    assert gpu["type"] == "state-timeline"
    steps = gpu["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[0]["color"] == "red" and steps[-1]["color"] == "green"
    exprs = " ".join(t["expr"] for p in by_title.values() for t in p["targets"])
    for needed in (
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
        "soak_client_streamed_tokens_total",
        "vllm:prefix_cache_hits_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "soak_detector_rule_state",
    ):
        assert needed in exprs, needed
    ratio = by_title["Prefix-cache hit ratio"]["targets"][0]["expr"]
    assert "prefix_cache_hits_total" in ratio and "prefix_cache_queries_total" in ratio
    assert "prompt_tokens" not in ratio
    annotations = load_dashboard()["annotations"]["list"]
    assert any("soak_incidents_total" in a["expr"] for a in annotations)


def test_every_queried_name_is_exported_by_the_harness_vllm_dcgm_or_a_rule():
    rules = load_rules()
    expressions = list(dashboard_expressions(load_dashboard())) + list(rule_expressions(rules))
    assert unknown_metric_names(expressions, known_series_names(rules)) == []


def test_the_name_check_rejects_a_misspelt_vllm_name():
    rules = load_rules()
    problems = unknown_metric_names(
        list(dashboard_expressions({"panels": [{"id": 1, "title": "t", "targets": [
            {"refId": "A", "expr": 'sum(rate(vllm:generation_token_total{box=~"$box"}[5m]))'}]}]})),
        known_series_names(rules),
    )
    assert problems == ["panel 1 't' target A: vllm:generation_token_total is exported by neither the harness, vLLM, DCGM nor a rule"]


def test_the_name_check_rejects_a_created_series():
    """soak_events_created vanishes with PROMETHEUS_DISABLE_CREATED_SERIES (or created-timestamp
    ingestion), which once made SoakHarnessDown fire all day after a good night."""
    problems = unknown_metric_names(
        list(dashboard_expressions({"panels": [{"id": 1, "title": "t", "targets": [
            {"refId": "A", "expr": 'soak_events_created{type="run_ended"} * 1000'}]}]})),
        known_series_names(load_rules()),
    )
    assert len(problems) == 1 and "soak_events_created is a _created series" in problems[0]


def test_promql_name_extraction():
    assert metric_names_in(
        'histogram_quantile(0.99, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{box=~"$box"}[$__rate_interval])))'
    ) == {"vllm:e2e_request_latency_seconds_bucket"}
    assert metric_names_in('sum(up{job="soak"}) or vector(0) and on(box) x > bool 1e3') == {"up", "x"}
    assert signal_of("soak:pipeline_tail_stall == 1") == "soak:pipeline_tail_stall"
    assert signal_of('up{job="soak"} == 0') == 'up{job="soak"}'


def test_every_vllm_and_dcgm_name_queried_is_one_facts_md_lists():
    import re

    from soak.export.lint import REPO_ROOT

    facts_path = REPO_ROOT.parent / "shared" / "design" / "FACTS.md"
    if not facts_path.exists():
        pytest.skip("../shared/design/FACTS.md is absent (a user's own clone)")
    facts = facts_path.read_text(encoding="utf-8")
    listed = set(re.findall(r"vllm:[a-z0-9_]+|DCGM_FI_[A-Z0-9_]+", facts))
    rules = load_rules()
    used = set()
    for e in list(dashboard_expressions(load_dashboard())) + list(rule_expressions(rules)):
        used |= {n for n in metric_names_in(e.expr) if n.startswith(("vllm:", "DCGM_FI_"))}
    assert used, "the dashboard reads no vLLM or DCGM metric"
    for suffix in ("_bucket", "_total"):
        used = {n.removesuffix(suffix) for n in used}
    assert sorted(used - listed) == []


# -- the morning after (issue 35) ---------------------------------------------

NIGHT_S = 12 * 3600  # 21:00 to 09:00: a night started at 01:30, seen at 09:00, with margin either side


def test_the_default_time_range_shows_last_night_the_morning_after():
    from soak.export.lint import default_range_s, time_range_problems

    dashboard = load_dashboard()
    assert time_range_problems(dashboard, at_least_s=NIGHT_S) == []
    # 09:00 minus the range reaches back past a 01:30 start
    assert 9 * 3600 - default_range_s(dashboard) < 1.5 * 3600
    three_hours = dict(dashboard, time={"from": "now-3h", "to": "now"})
    assert time_range_problems(three_hours, at_least_s=NIGHT_S) == [
        "default time range reaches back 3 h, less than the 12 h a person needs to see last night the morning after"]
    assert time_range_problems(dict(dashboard, time={"from": "2026-12-06T01:30:00Z", "to": "now"}),
                               at_least_s=NIGHT_S)


def test_a_runs_start_end_and_incidents_are_annotations():
    annotations = {a["name"]: a for a in load_dashboard()["annotations"]["list"]}
    start, end, incidents = annotations["Run started"], annotations["Run ended"], annotations["Incidents"]
    # the value is the moment (ms), so the mark sits at the start or end whatever the step
    assert start["useValueForTime"] and "soak_run_start_time_seconds" in start["expr"] and "* 1000" in start["expr"]
    assert end["useValueForTime"] and "soak_run_end_time_seconds" in end["expr"] and "* 1000" in end["expr"]
    assert "soak_incidents_total" in incidents["expr"] and not incidents["useValueForTime"]
    for a in (start, end):
        assert "{{name}}" in a["titleFormat"] and a["enable"]


def test_prompt_and_generated_tokens_never_share_an_axis():
    from soak.export.lint import scale_problems

    dashboard = load_dashboard()
    assert scale_problems(dashboard) == []
    by_title = {p["title"]: p for p in dashboard["panels"]}
    generated = " ".join(t["expr"] for t in by_title["Generated tokens"]["targets"])
    assert "vllm:generation_tokens_total" in generated and "prompt_tokens" not in generated
    assert "vllm:prompt_tokens_total" in by_title["Prompt tokens (prefill)"]["targets"][0]["expr"]
    # the old panel (both on one linear axis) is caught, and a right-axis override cures it
    mixed = copy.deepcopy(by_title["Generated tokens"])
    mixed["targets"].append({"refId": "Z", "expr": 'sum(rate(vllm:prompt_tokens_total{box=~"$box"}[5m]))',
                             "legendFormat": "server prompt"})
    problem = scale_problems({"panels": [mixed]})
    assert problem == [f"panel {mixed['id']} 'Generated tokens': generated tokens and prompt tokens on one linear left axis"]
    mixed["fieldConfig"]["overrides"] = [{"matcher": {"id": "byName", "options": "server prompt"},
                                          "properties": [{"id": "custom.axisPlacement", "value": "right"}]}]
    assert scale_problems({"panels": [mixed]}) == []


def test_no_run_is_grey_never_a_red_down():
    by_title = {p["title"]: p for p in load_dashboard()["panels"]}
    assert "Harness scrape" not in by_title
    run = by_title["Run now"]
    assert 'up{job="soak"' in run["targets"][0]["expr"]
    defaults = run["fieldConfig"]["defaults"]
    values = {k: v for m in defaults["mappings"] if m["type"] == "value" for k, v in m["options"].items()}
    special = [m["options"]["result"] for m in defaults["mappings"] if m["type"] == "special"]
    assert values["0"]["text"] == "no run" and values["1"]["text"] == "running"
    for shown in (values["0"], *special):  # exporter gone, or no series at all in the range
        assert shown["text"] == "no run" and shown["color"] not in ("red", "dark-red", "semi-dark-red")
    assert defaults["thresholds"]["steps"][0]["color"] == values["0"]["color"]
    assert "down" not in str(run).lower()
