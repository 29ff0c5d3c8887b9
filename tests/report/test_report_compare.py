"""``soak compare`` and ``soak plan`` through the real command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _soak(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "soak", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def ab_runs(tmp_path_factory, generator):
    """A baseline and a candidate that is 30% slower; a third like the baseline; a failing one."""
    root = tmp_path_factory.mktemp("ab")
    common = dict(duration_s=600.0, gpu_period=5.0, metrics_period=2.0, client_period=2.0, request_period=3.0)
    a = generator.write_run(root / "baseline", kind="pass", seed=11, gen_rate=100.0, **common)
    b = generator.write_run(root / "capped", kind="pass", seed=12, gen_rate=70.0, **common)
    c = generator.write_run(root / "rerun", kind="pass", seed=13, gen_rate=100.0, **common)
    f = generator.write_run(root / "hung", kind="fail", seed=14, gen_rate=100.0, onset_s=400.0, **common)
    return a, b, c, f


def test_slower_candidate_is_judged_worse_on_throughput(ab_runs):
    a, b, _, _ = ab_runs
    done = _soak("compare", str(a), str(b), "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["metric"]: r for r in json.loads(done.stdout)["rows"]}
    tput = rows["throughput (generated tokens/s per window)"]
    assert tput["verdict"] == "worse"
    assert tput["a"]["lower"] < tput["a"]["value"] < tput["a"]["upper"]
    assert tput["b"]["value"] == pytest.approx(0.7 * tput["a"]["value"], rel=0.1)
    assert rows["hang rate"]["verdict"] == "no significant difference"
    assert set(rows) >= {"TTFT p50", "TTFT p99", "ITL (mean per request)", "prefix-cache hit ratio (per window)"}


def test_same_setup_twice_shows_no_significant_throughput_difference(ab_runs):
    a, _, c, _ = ab_runs
    done = _soak("compare", str(a), str(c))
    assert done.returncode == 0, done.stderr
    line = next(l for l in done.stdout.splitlines() if l.startswith("throughput"))
    assert line.endswith("no significant difference")
    assert "95% intervals in brackets" in done.stdout


def test_hang_rate_row_counts_hangs_over_exposure(ab_runs):
    a, _, _, f = ab_runs
    rows = {r["metric"]: r for r in json.loads(_soak("compare", str(a), str(f), "--json").stdout)["rows"]}
    hang = rows["hang rate"]
    assert (hang["a"]["n"], hang["b"]["n"]) == (0, 1)
    assert hang["method"] == "exact Poisson rate-ratio test"
    # Hung windows are left out of the throughput comparison.
    assert rows["throughput (generated tokens/s per window)"]["verdict"] == "no significant difference"


def test_error_rate_row_compares_failed_shares_of_finished_requests(ab_runs):
    a, _, c, f = ab_runs
    rows = {r["metric"]: r for r in json.loads(_soak("compare", str(a), str(f), "--json").stdout)["rows"]}
    err = rows["error rate (failed / finished requests)"]
    assert err["a"]["value"] == 0.0 and err["a"]["lower"] == 0.0 and err["a"]["upper"] > 0
    # The hung run's 12 streams reset at the kill are failures of its server.
    assert err["b"]["value"] == pytest.approx(12 / err["b"]["n"]) and err["b"]["n"] > 100
    assert err["verdict"] == "worse" and err["p_value"] < 0.01
    assert err["method"].startswith("Fisher exact test")
    text = _soak("compare", str(a), str(c)).stdout
    line = next(l for l in text.splitlines() if l.startswith("error rate"))
    assert "0.00%" in line and line.endswith("no significant difference")


def test_compare_bad_arguments_are_one_line_exit_2(ab_runs, tmp_path):
    a = ab_runs[0]
    done = _soak("compare", str(a), str(tmp_path / "nope"))
    assert done.returncode == 2 and "not a run directory" in done.stderr and "Traceback" not in done.stderr
    done = _soak("compare", str(a), str(a), "--window", "soon")
    assert done.returncode == 2 and "--window" in done.stderr


def test_plan_prints_how_long_a_clean_soak_must_run():
    done = _soak("plan", "--baseline-mtbf", "15m", "--confidence", "0.95")
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first == "To show MTBF above 15 min at 95% confidence, run 44m56s (44.9 min of load) with no hang."
    assert "With 1 hang in the run: 1h11m9s" in done.stdout
    bad = _soak("plan", "--baseline-mtbf", "fifteen")
    assert bad.returncode == 2 and "--baseline-mtbf" in bad.stderr
