"""The correctness row of the live dashboard and the corruption marks (issue 49): the
canary pass rate from the exporter's own series, a corruption annotation of its own
colour, the nights dashboard's corruptions per night; the checked-in files are the
generated ones (soak.export.dashboard, soak.export.nights_dashboard)."""

from __future__ import annotations

import re

from soak.export.dashboard import build_dashboard
from soak.export.lint import load_dashboard
from soak.export.names import HARNESS_METRICS, PUSHED_METRICS
from soak.export.nights_dashboard import build_nights_dashboard


def _panel(dashboard, title):
    return next(p for p in dashboard["panels"] if p["title"] == title)


def test_the_pass_rate_is_right_over_judged_canaries_near_the_top():
    board = load_dashboard()
    assert board == build_dashboard()
    rate = _panel(board, "Canary pass rate")
    expr = rate["targets"][0]["expr"]
    rate_expr, none_judged = expr.split(" or on() ")
    numerator, denominator = rate_expr.split(" / ")
    assert none_judged.endswith("* 0 - 1)")  # no canary judged reads -1, mapped to "none judged", never 100%
    assert rate["fieldConfig"]["defaults"]["mappings"][0]["options"]["-1"]["text"] == "none judged"
    assert 'verdict=~"match|explained"' in numerator
    assert 'verdict=~"match|explained|corrupt|crosstalk"' in denominator
    assert "soak_canaries" in HARNESS_METRICS and "soak_canary_share_ratio" in HARNESS_METRICS
    # right under the first row: a person sees "are the answers right?" beside "is it hung?"
    detector = _panel(board, "Detector")
    assert rate["gridPos"]["y"] == detector["gridPos"]["y"] + detector["gridPos"]["h"]
    share = _panel(board, "Canaries' share of server time")
    assert "soak_canary_share_ratio" in share["targets"][0]["expr"]


def test_a_corruption_is_an_annotation_of_its_own():
    marks = {a["name"]: a for a in load_dashboard()["annotations"]["list"]}
    corruption = marks["Corruptions"]
    assert re.search(r'soak_incidents_total\{kind="corruption",', corruption["expr"])
    assert corruption["iconColor"] != marks["Incidents"]["iconColor"]


def test_the_nights_dashboard_counts_corruptions_per_night():
    board = build_nights_dashboard()
    panel = _panel(board, "Corruptions per night")
    assert 'kind="corruption"' in panel["targets"][0]["expr"]
    assert "soak_night_incidents" in PUSHED_METRICS
