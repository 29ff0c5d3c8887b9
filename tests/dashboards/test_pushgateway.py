"""The nightly's results through Debian's real ``prometheus-pushgateway`` into a real
Prometheus, read back through Prometheus's HTTP API.

A real ``soak run`` against the simulator pushes its night at the end
(``pushgateway:`` section); ``soak history --pushgateway`` pushes each build's
pooled figures; Prometheus (the shipped config's ``pushgateway`` job, honor_labels)
scrapes the gateway. Then the values must be the ones in summary.json and
history.json, and every expression of the "soak nights" dashboard returns data.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from prom_helpers import free_port
from soak.export.lint import NIGHTS_DASHBOARD_PATH, dashboard_expressions, load_dashboard

pytestmark = pytest.mark.timeout(240)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "history"
RUN_HELPERS = Path(__file__).resolve().parents[1] / "run"
sys.path.insert(0, str(RUN_HELPERS))

from soakrun_helpers import small_config, soak_cmd, write_config  # noqa: E402


@pytest.fixture
def pushgateway(tmp_path):
    binary = shutil.which("prometheus-pushgateway")
    if binary is None:
        pytest.fail("prometheus-pushgateway is not installed; scripts/test installs Debian's package")
    for _attempt in range(3):
        port = free_port()
        log = open(tmp_path / f"pushgateway-{port}.log", "w")
        # Debian's build persists to /var/lib/prometheus/pushgateway.data by default: a
        # gateway started there holds the last test's groups, and a stale "fixed" group
        # reached Prometheus beside the one this test pushed. In memory only.
        popen = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}", "--persistence.file="], stdout=log,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while popen.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        else:
            popen.kill()
            popen.wait(timeout=10)
            log.close()
            continue
        try:
            yield port
        finally:
            popen.terminate()
            try:
                popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(timeout=10)
            log.close()
        return
    pytest.fail("the Pushgateway never became ready")


def instant(prometheus, expr: str) -> dict[tuple, float]:
    result = prometheus.api("query", query=expr)["result"]
    return {tuple(sorted((k, v) for k, v in r["metric"].items() if k not in ("__name__", "instance", "job")
                         or k == "job")): float(r["value"][1]) for r in result}


def one(prometheus, expr: str) -> float:
    values = list(instant(prometheus, expr).values())
    assert len(values) == 1, (expr, values)
    return values[0]


def wait_for(prometheus, expr: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not prometheus.api("query", query=expr)["result"]:
        if time.monotonic() > deadline:
            raise AssertionError(f"no data for {expr} within {timeout_s:.0f}s")
        time.sleep(0.5)


def test_a_night_and_the_history_reach_prometheus_through_the_pushgateway(tmp_path, pushgateway, make_prometheus):
    gateway = f"127.0.0.1:{pushgateway}"
    prometheus = make_prometheus({"pushgateway": (gateway, "/metrics")})

    # one real night of build "fixed", pushed by soak run itself
    config = small_config(duration="4s", build="fixed")
    config["pushgateway"] = {"url": f"http://{gateway}", "job": "soak-nightly", "grouping": {"box": "test-box"}}
    run_dir = tmp_path / "runs" / "n09-fixed-live"
    done = subprocess.run(soak_cmd("run", str(write_config(tmp_path / "night.yaml", config)), "--out", str(run_dir), "--no-html"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    pushed = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if '"pushed"' in line]
    assert pushed and pushed[0]["grouping"] == {"box": "test-box", "build": "fixed"}

    # history over the recorded nights plus this one, pushed per build
    for night in FIXTURES.iterdir():
        if night.is_dir():
            shutil.copytree(night, tmp_path / "runs" / night.name)
    done = subprocess.run(soak_cmd("history", str(tmp_path / "runs"), "--baseline", "unfixed", "--pushgateway",
                                   f"http://{gateway}", "--label", "box=test-box"),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    history = json.loads((tmp_path / "runs" / "history.json").read_text())
    builds = {b["build"]: b for b in history["builds"]}

    # history pushes one group per build: a scrape between two pushes holds only the first
    for build in ("unfixed", "fixed"):
        wait_for(prometheus, f'soak_build_hangs{{build="{build}",job="soak_history"}}')
    wait_for(prometheus, 'soak_night_exposure_seconds{build="fixed"}')
    night = 'box="test-box",build="fixed",job="soak-nightly"'
    # the night's time at risk, as history counts it (soak.exposure), not its seconds of load
    row = next(r for r in history["runs"] if r["path"].endswith("n09-fixed-live"))
    exposure = one(prometheus, f"soak_night_exposure_seconds{{{night}}}")
    assert exposure == pytest.approx(row["exposure_s"]) and 0 < exposure <= summary["duration_s"]
    assert one(prometheus, f"soak_night_verdict{{{night}}}") == 0
    assert one(prometheus, f"soak_night_exit_code{{{night}}}") == 0
    assert one(prometheus, f"soak_night_hangs{{{night}}}") == 0
    assert one(prometheus, f'soak_night_incidents{{{night},kind="hang"}}') == 0
    assert one(prometheus, f"soak_night_start_time_seconds{{{night}}}") == pytest.approx(summary["started_at"], abs=1e-3)
    # one clean night of T seconds proves MTBF > T / -ln(0.05)
    assert one(prometheus, f"soak_night_mtbf_lower_bound_seconds{{{night}}}") == pytest.approx(
        exposure / 2.995732, rel=1e-5)
    assert one(prometheus, f"soak_night_output_tokens_per_second{{{night}}}") == pytest.approx(
        summary["throughput"]["generated_tokens_per_s"])
    assert one(prometheus, f'soak_night_ttft_seconds{{{night},quantile="0.99"}}') == pytest.approx(
        summary["latency"]["ttft_s"]["p99"])
    assert one(prometheus, f'soak_night_tpot_seconds{{{night},quantile="0.5"}}') == pytest.approx(
        summary["latency"]["tpot_s"]["p50"])
    assert one(prometheus, f"soak_night_prefix_hit_ratio{{{night}}}") == pytest.approx(summary["prefix_cache_hit_ratio"])
    info = prometheus.api("query", query=f"soak_night_info{{{night}}}")["result"][0]["metric"]
    assert info["verdict"] == "pass" and info["build_label"] == "fixed" and info["vllm_version"]

    for build in ("unfixed", "fixed"):
        sel = f'box="test-box",build="{build}",job="soak_history"'
        b = builds[build]
        assert one(prometheus, f"soak_build_exposure_seconds{{{sel}}}") == pytest.approx(b["exposure_s"])
        assert one(prometheus, f"soak_build_hangs{{{sel}}}") == b["hangs"]
        assert one(prometheus, f"soak_build_runs{{{sel}}}") == b["runs"]
        assert one(prometheus, f"soak_build_mtbf_lower_bound_seconds{{{sel}}}") == pytest.approx(
            b["mtbf_one_sided_lower_s"])
    assert builds["unfixed"]["hangs"] == 3 and builds["fixed"]["hangs"] == 0
    assert one(prometheus, 'soak_build_mtbf_seconds{build="unfixed"}') == pytest.approx(5200 / 3)
    assert instant(prometheus, 'soak_build_mtbf_seconds{build="fixed"}') == {}  # no hang: no point estimate
    assert one(prometheus, 'soak_build_mtbf_interval_seconds{build="unfixed",bound="upper"}') == pytest.approx(
        builds["unfixed"]["mtbf_upper_s"])
    assert one(prometheus, 'soak_build_fixed{build="fixed"}') == 1
    assert one(prometheus, 'soak_build_better_confidence{build="fixed"}') == pytest.approx(
        1 - next(t for t in history["rate_tests"] if t["b"] == "fixed")["p_b_lower"])

    # "Last night": this night's exit status for its build (green pass); a build whose
    # latest night is three days old reads "no run" (-1, grey), not its old red fail
    from soak.export.names import PUSHED_METRICS

    old_night = "".join(  # with the HELP the harness pushes: the Pushgateway refuses a second wording
        f"# HELP {name} {PUSHED_METRICS[name].help}\n# TYPE {name} gauge\n{name} {value}\n"
        for name, value in (("soak_night_exit_code", 1), ("soak_night_start_time_seconds", f"{time.time() - 3 * 86400:.0f}")))
    request = urllib.request.Request(f"http://{gateway}/metrics/job/soak-nightly/box/test-box/build/old",
                                     data=old_night.encode(), method="PUT")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status in (200, 202)
    wait_for(prometheus, 'soak_night_exit_code{build="old"}')
    last_night = next(p for p in load_dashboard(NIGHTS_DASHBOARD_PATH)["panels"] if p["title"] == "Last night")
    shown = instant(prometheus, last_night["targets"][0]["expr"].replace("$box", ".*").replace("$build", ".*"))
    assert shown == {(("build", "fixed"),): 0, (("build", "old"),): -1}, shown

    # every query of the "soak nights" dashboard returns data
    dashboard = load_dashboard(NIGHTS_DASHBOARD_PATH)
    empty = []
    for e in dashboard_expressions(dashboard):
        expr = e.expr.replace("$box", ".*").replace("$build", ".*")
        if not prometheus.api("query", query=expr)["result"]:
            empty.append(f"{e.where}: {expr}")
    assert empty == []


HANG_RESTART = Path(__file__).resolve().parents[1] / "report" / "fixtures" / "hang-restart"


def test_a_night_with_hangs_and_restarts_pushes_the_exposure_history_and_the_report_count(tmp_path, pushgateway):
    """A recorded 22-second night with two hangs, each followed by a restart (the
    server down 3 s while loading): the pushed exposure is its time at risk, the
    figure soak history, report.html's MTBF and soak compare's hang rate count,
    not its 22 s of load."""
    from prometheus_client.parser import text_string_to_metric_families

    from soak.export.push_config import PushgatewayConfig
    from soak.history.collect import read_night
    from soak.report.compare import hangs_and_exposure
    from soak.report.push import push_run
    from soak.report.render import build
    from soak.report.rundir import load_run
    from soak.report.stats import mtbf_estimate

    run_dir = tmp_path / "night"
    shutil.copytree(HANG_RESTART, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    config = PushgatewayConfig(url=f"http://127.0.0.1:{pushgateway}", job="soak-nightly", grouping={"box": "b"})
    push_run(config, summary, exit_code=1, run_dir=run_dir)
    with urllib.request.urlopen(f"http://127.0.0.1:{pushgateway}/metrics", timeout=10) as response:
        text = response.read().decode()
    pushed = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
              if s.labels.get("job") == "soak-nightly"}

    record = read_night(run_dir, window_s=60)[0]
    run = load_run(run_dir)
    report = build(run, with_plots=False).mtbf
    assert report is not None
    hangs, exposure = hangs_and_exposure(run)  # soak compare's hang rate
    assert hangs == 2 and exposure == pytest.approx(record.exposure_s)
    assert pushed["soak_night_exposure_seconds"] == pytest.approx(record.exposure_s) == pytest.approx(report.exposure_s)
    assert pushed["soak_night_hangs"] == record.hangs == report.failures == 2
    assert pushed["soak_night_mtbf_lower_bound_seconds"] == pytest.approx(
        mtbf_estimate(2, record.exposure_s, confidence=0.95).one_sided_lower_s)
    # the two waits for a restart are not time at risk: well under the 22 s of load
    assert pushed["soak_night_exposure_seconds"] < summary["duration_s"] - 6
