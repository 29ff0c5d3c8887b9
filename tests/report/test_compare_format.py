"""``soak compare``'s table: latencies in the unit a person reads (651 us, 12.3 ms,
7.46 s; never 0.000651), and TTFT p95 beside p50 and p99."""

from __future__ import annotations

from pathlib import Path

from soak.report.compare import Comparison, compare_runs, format_comparison
from soak.report.rundir import load_run
from soak.report.stats import Change, Difference, Estimate

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"


def _row(metric: str, a: float, b: float, unit: str = "s") -> Difference:
    return Difference(metric, unit, Estimate(a, a * 0.9, a * 1.1, 400), Estimate(b, b * 0.9, b * 1.1, 400), 0.01,
                      Change.WORSE, "bootstrap of p50 (400 resamples)")


def test_sub_millisecond_latencies_print_in_microseconds():
    table = format_comparison(Comparison("a", "b", 60.0, 0.95, (
        _row("ITL (mean per request)", 0.000651, 0.000702),
        _row("TTFT p99", 1.2, 7.46),
    )))
    itl = next(line for line in table.splitlines() if line.startswith("ITL"))
    assert "651 us [586 us, 716 us] n=400" in itl and "702 us" in itl
    assert "+51 us (+7.8%)" in itl
    ttft = next(line for line in table.splitlines() if line.startswith("TTFT p99"))
    assert "1.2 s" in ttft and "7.46 s" in ttft and "+6.26 s" in ttft
    assert "0.000" not in table and "e-0" not in table
    assert "(s)" not in table  # each cell carries its unit


def test_a_faster_b_shows_a_negative_change_in_milliseconds():
    table = format_comparison(Comparison("a", "b", 60.0, 0.95, (_row("TTFT p50", 0.0450, 0.0321),)))
    assert "-12.9 ms (-28.7%)" in table


def test_compare_lists_ttft_p95_between_p50_and_p99():
    comparison = compare_runs(load_run(RUNS / "pass"), load_run(RUNS / "fail"), a_name="pass", b_name="fail",
                              resamples=50)
    names = [row.name for row in comparison.rows]
    assert names.index("ttft_p50") < names.index("ttft_p95") < names.index("ttft_p99")
    p95 = next(row for row in comparison.rows if row.name == "ttft_p95")
    p50 = next(row for row in comparison.rows if row.name == "ttft_p50")
    p99 = next(row for row in comparison.rows if row.name == "ttft_p99")
    for side in ("a", "b"):
        lo, mid, hi = (getattr(r, side).value for r in (p50, p95, p99))
        assert lo <= mid <= hi
    assert "TTFT p95" in format_comparison(comparison)
