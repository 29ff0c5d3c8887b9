"""One metric-name table: thresholds, `soak compare` and `soak history` speak the same names."""

from __future__ import annotations

from pathlib import Path

from soak.history.model import RUN_FIGURES
from soak.report.compare import compare_runs
from soak.report.rundir import load_run
from soak.thresholds.config import _known_metric
from soak.thresholds.metrics import RUN_METRICS

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"


def test_compare_rows_and_history_figures_are_named_from_the_table():
    comparison = compare_runs(load_run(RUNS / "pass"), load_run(RUNS / "fail"), a_name="pass", b_name="fail")
    names = [row.name for row in comparison.rows]
    assert None not in names and set(names) <= set(RUN_METRICS)
    assert {"output_tokens_per_s", "ttft_p99", "prefix_hit_ratio", "hang_rate"} <= set(names)
    assert set(RUN_FIGURES) <= set(RUN_METRICS)
    for name in RUN_FIGURES:
        assert _known_metric(name) == name  # what history shows, a threshold can gate
