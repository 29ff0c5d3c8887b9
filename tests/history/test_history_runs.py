"""history.html's runs, pure: what counts as a clean night, the thresholds and report
cells (every string from a run directory escaped), the verdict of an exit-99 night,
and the time-to-hang axis from 0."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from soak.history.model import History, Interval, RunRecord, build_stats
from soak.history.render import history_html, per_night_figure, report_cell, thresholds_cell, verdict_text
from soak.summary_file import IncidentEntry


def record(*, verdict="pass", hangs=0, breached=(), passed=None, cut_off=False, report=None,
           path="/srv/runs/n1", lengths=(600.0,)) -> RunRecord:
    intervals = tuple(Interval(1.8e9 + i, length, i < hangs, "hang" if i < hangs else "end of load")
                      for i, length in enumerate(lengths))
    incidents = tuple(IncidentEntry.from_json({"number": i + 1, "kind": "hang", "rule": "pp_tail_stall"})
                      for i in range(hangs))
    return RunRecord(path=path, run_id="r", name="n", started_at=1.8e9, build="b", vllm_version=None,
                     launch_digest=None, label="b", verdict=verdict, cut_off=cut_off, intervals=intervals,
                     incidents=incidents, figures={}, thresholds_passed=passed, restarts=0,
                     thresholds_breached=tuple(breached), report=report)


@settings(max_examples=100, deadline=None)
@given(verdict=st.sampled_from(["pass", "fail", "aborted"]), hangs=st.integers(0, 2),
       breached=st.lists(st.sampled_from(["ttft_p99 < 2s", "error_rate < 1%"]), max_size=2, unique=True),
       passed=st.sampled_from([None, True, False]), cut_off=st.booleans())
def test_a_clean_night_passed_without_incident_and_kept_every_threshold(verdict, hangs, breached, passed, cut_off):
    r = record(verdict=verdict, hangs=hangs, breached=breached, passed=passed if not breached else False,
               cut_off=cut_off, lengths=(600.0, 300.0, 200.0)[: hangs + 1])
    assert r.clean == (verdict == "pass" and hangs == 0 and not breached and passed is not False and not cut_off)
    cell = thresholds_cell(r)
    assert cell.startswith("<span class='bad'>✗") == bool(breached or (passed is False))
    for name in breached:
        assert name.replace("<", "&lt;") in cell


def test_an_slo_breach_is_a_fail_without_incident_not_a_hang_and_not_clean():
    slo = record(verdict="fail", breached=["output_tokens_per_s > 1000000"], passed=False)
    assert not slo.clean and slo.hangs == 0
    assert verdict_text(slo) == "fail: thresholds breached, no incident"
    assert verdict_text(record(verdict="fail", hangs=1, lengths=(600.0, 100.0))) == "fail"
    assert thresholds_cell(record(passed=True)) == "<span class='good'>✓</span>"


def test_report_links_are_relative_and_a_hostile_run_name_is_text():
    hostile = "/srv/runs/<img src=x onerror=alert(1)>'"
    linked = report_cell(record(path=hostile, report=hostile + "/report.html"), Path("/srv/history"))
    assert "<img" not in linked and "&lt;img" in linked
    assert linked.startswith("<a href='../runs/&lt;img src=x onerror=alert(1)&gt;&#x27;/report.html'")
    missing = report_cell(record(path="/srv/runs/n6"), Path("/srv/history"))
    assert "href" not in missing and ">n6<" in missing


def test_without_a_baseline_the_page_says_so_and_names_the_builds():
    runs = (record(),)
    h = History(confidence=0.95, runs=runs, builds=(build_stats("b", runs, confidence=0.95),), baseline=None,
                baseline_mtbf_s=None, rate_tests=())
    page = history_html(h, out_dir=Path("/srv/history"))
    assert "id='no-baseline'" in page and "--baseline BUILD (builds: b)" in page


def test_the_time_to_hang_axis_starts_at_zero():
    # the night: every time to hang near 0.7 min, drawn on an axis from 0.68
    runs = tuple(record(hangs=2, lengths=(41.0, 44.0, 43.0)) for _ in range(3))
    h = History(confidence=0.95, runs=runs, builds=(build_stats("b", runs, confidence=0.95),), baseline=None,
                baseline_mtbf_s=None, rate_tests=())
    for what in ("tth", "throughput"):
        assert per_night_figure(h, what).axes[0].get_ylim()[0] == 0
