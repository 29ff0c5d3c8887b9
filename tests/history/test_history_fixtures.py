"""soak history over recorded run directories (tests/fixtures/history/generate.py):
two labelled builds and one unlabelled, clean, failing, cut-off, aborted and
restarted nights. Every expected figure below is worked out by hand from the
fixture's round numbers and printed chi-square table values."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from soak.cli import main as soak_main
from soak.history.collect import build_history, find_runs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "history"

# Chi-square quantiles from a printed table (not from scipy):
CHI2_0975_8 = 17.535   # chi2(0.975; 2n+2) for n = 3
CHI2_0025_6 = 1.2373   # chi2(0.025; 2n) for n = 3
CHI2_095_8 = 15.507    # chi2(0.95; 8): one-sided bound with 3 hangs
CHI2_0975_2 = 7.3778   # chi2(0.975; 2): two-sided lower bound with no hang
CHI2_095_2 = 5.9915    # chi2(0.95; 2) = -2 ln 0.05

T_UNFIXED = 900 + (600 + 1200 + 1000) + 1500  # hang night + restarted night + cut-off night
T_FIXED = 3 * 3960 + 2000  # three clean 66-minute nights + one interrupted after 2000 s


@pytest.fixture(scope="module")
def history():
    # The baseline is named: history never guesses one (issue 35).
    return build_history(find_runs([FIXTURES]), confidence=0.95, baseline="unfixed")


def by_build(history):
    return {b.build: b for b in history.builds}


def test_each_night_counts_its_time_at_risk_and_a_restart_splits_it(history):
    runs = {Path(r.path).name: r for r in history.runs}
    assert len(runs) == 8
    hang = runs["n01-unfixed-hang"]
    # stopped at the hang: exposure ends at the onset, not at the kill or the drain
    assert hang.exposure_s == pytest.approx(900) and hang.times_to_hang_s == (900,)
    restarted = runs["n02-unfixed-restarts"]
    # two restarts: three intervals, the restart downtime (100 s each) is not at risk
    assert [i.length_s for i in restarted.intervals] == pytest.approx([600, 1200, 1000])
    assert [i.hang for i in restarted.intervals] == [True, True, False]
    assert restarted.times_to_hang_s == pytest.approx((600, 1200))
    assert restarted.exposure_s == pytest.approx(2800)
    cut = runs["n03-unfixed-cutoff"]
    # cut off: up to its last record, censored
    assert cut.cut_off and cut.verdict == "aborted"
    assert cut.exposure_s == pytest.approx(1500) and cut.hangs == 0
    assert cut.intervals[-1].ended_by == "cut off"
    aborted = runs["n07-fixed-aborted"]
    assert aborted.verdict == "aborted" and aborted.exposure_s == pytest.approx(2000)
    # nights are in start order
    assert [r.started_at for r in history.runs] == sorted(r.started_at for r in history.runs)


def test_pooled_exposure_and_exact_chi_square_mtbf_per_build(history):
    builds = by_build(history)
    unfixed, fixed = builds["unfixed"], builds["fixed"]
    assert unfixed.exposure_s == pytest.approx(T_UNFIXED) and unfixed.hangs == 3 and unfixed.runs == 3
    assert unfixed.mtbf.point_s == pytest.approx(T_UNFIXED / 3)
    assert unfixed.mtbf.lower_s == pytest.approx(2 * T_UNFIXED / CHI2_0975_8, rel=1e-3)  # 593 s
    assert unfixed.mtbf.upper_s == pytest.approx(2 * T_UNFIXED / CHI2_0025_6, rel=1e-3)  # 8406 s
    assert unfixed.mtbf.one_sided_lower_s == pytest.approx(2 * T_UNFIXED / CHI2_095_8, rel=1e-3)
    # four nights without a hang; the interrupted one (aborted) is no clean night
    assert fixed.exposure_s == pytest.approx(T_FIXED) and fixed.hangs == 0 and fixed.hang_free_runs == 4
    assert fixed.clean_runs == 3
    assert fixed.mtbf.lower_s == pytest.approx(2 * T_FIXED / CHI2_0975_2, rel=1e-3)
    assert fixed.mtbf.one_sided_lower_s == pytest.approx(2 * T_FIXED / CHI2_095_2, rel=1e-3)  # 4633 s = 77 min
    assert fixed.mtbf.upper_s == float("inf")


def test_verdict_against_the_baseline_build(history):
    builds = by_build(history)
    assert history.baseline == "unfixed"  # as named
    assert history.baseline_mtbf_s == pytest.approx(T_UNFIXED / 3)  # 28.9 min
    fixed = builds["fixed"]
    assert fixed.fixed is True and fixed.standing == "fixed"
    # the MTBF bound beats the baseline's estimate and the rate test shows it: one sentence says both
    assert fixed.verdict == ("fixed at 95%: 4 nights without a hang, 3.9 h pooled, MTBF above 77 min, "
                             "beat the unfixed MTBF of 29 min; it hangs less often than unfixed with 98.0% "
                             "confidence (exact Poisson rate-ratio test, one-sided)")
    short = builds["vllm 0.11.3 · 5e1f00d"]  # unlabelled: grouped by version and launch digest
    assert short.fixed is None
    # clean time needed: 1733.3 s x chi2(0.95; 2) / 2 = 5192.6 s, 600 s done: 4592.6 s = 77 min to go
    assert "77 min more clean load would beat the unfixed MTBF of 29 min" in short.verdict
    # the rate test needs longer: 5200 s x (0.05^(-1/3) - 1) = 8915 s clean, 600 s done
    assert short.verdict.endswith(", 2.3 h to show it hangs less often than unfixed at 95%")
    assert short.standing == "not yet shown"


def test_poisson_rate_ratio_test_names_the_better_build(history):
    test = next(t for t in history.rate_tests if t.b == "fixed")
    # given 3 hangs in all, the fixed build's count is binomial(3, 13880 / 19080) under equal rates;
    # P(0) = (5200 / 19080)^3
    expected = (T_UNFIXED / (T_UNFIXED + T_FIXED)) ** 3
    assert test.p_b_lower == pytest.approx(expected, rel=1e-9)  # 0.0202
    assert test.rate_ratio == 0.0 and test.ratio_lower == 0.0
    assert history.best["build"] == "fixed" and history.best["significant"]
    assert history.best["confidence"] == pytest.approx(1 - expected)
    # the lead is the build's own sentence, never a second verdict beside it
    fixed = by_build(history)["fixed"]
    assert history.best["statement"] == f"fixed: {fixed.verdict}" and "98.0% confidence" in fixed.verdict


def test_an_explicit_baseline_mtbf_changes_the_verdicts():
    h = build_history(find_runs([FIXTURES]), confidence=0.95, baseline="unfixed", baseline_mtbf_s=90 * 60)
    fixed = by_build(h)["fixed"]
    # 77 min proven is not above 90 min: 90 min x 2.996 = 269.6 min needed, 231.3 done
    assert fixed.fixed is None and "38 min more clean load would beat the unfixed MTBF of 90 min" in fixed.verdict


def test_soak_history_writes_html_csv_and_json(tmp_path, capsys):
    runs = tmp_path / "runs"
    shutil.copytree(FIXTURES, runs, ignore=shutil.ignore_patterns("*.py"))
    os.symlink("n08-unlabelled", runs / "latest")  # the nightly's pointer: not a second run
    assert soak_main(["history", str(runs), "--baseline", "unfixed"]) == 0
    out = capsys.readouterr().out
    assert "\nfixed: fixed at 95%: 4 nights without a hang" in out
    data = json.loads((runs / "history.json").read_text())
    assert len(data["runs"]) == 8
    assert {b["build"] for b in data["builds"]} == {"unfixed", "fixed", "vllm 0.11.3 · 5e1f00d"}
    unfixed = next(b for b in data["builds"] if b["build"] == "unfixed")
    assert unfixed["mtbf_upper_s"] == pytest.approx(2 * T_UNFIXED / CHI2_0025_6, rel=1e-3)
    assert next(b for b in data["builds"] if b["build"] == "fixed")["mtbf_upper_s"] == "inf"
    rows = list(csv.DictReader((runs / "history.csv").open()))
    restarted = next(r for r in rows if r["path"].endswith("n02-unfixed-restarts"))
    assert restarted["times_to_hang_s"] == "600.000;1200.000" and restarted["intervals"] == "3"
    assert restarted["build"] == "unfixed" and restarted["vllm_version"] == "0.11.2"
    assert float(restarted["ttft_p50_s"]) > 0 and float(restarted["output_tokens_per_s"]) > 0
    page = (runs / "history.html").read_text()
    for title in ("MTBF interval per build", "Time to hang per night", "Throughput per night"):
        assert f"alt='{title}'" in page
    assert page.count("data:image/png;base64,") == 3
    assert "fixed at 95%" in page


@pytest.mark.parametrize("args, needle", [
    (["history", "{tmp}/nothing-here"], "not a directory"),
    (["history", "{tmp}"], "neither a run directory nor a folder of them"),
    (["history", str(FIXTURES), "--baseline", "nope", "--out", "{tmp}"], "--baseline: no build 'nope'"),
    (["history", str(FIXTURES), "--confidence", "1.5"], "--confidence"),
    (["history", str(FIXTURES), "--baseline-mtbf", "fifteen"], "not a duration"),
])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, args, needle):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = subprocess.run([sys.executable, "-m", "soak", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
