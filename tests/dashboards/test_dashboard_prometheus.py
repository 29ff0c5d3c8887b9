"""A real Prometheus scraping a live simulator and a real ``soak run``.

Prometheus (Debian's package) runs the shipped ``prometheus.yml`` and rules,
with the targets pointed at this test's ports and a 1 s scrape interval. The
harness is ``soak run`` attached to a ``soak sim``, its exporter on a free
port. After a few scrapes of healthy load the simulator deadlocks; the harness
detects it, kills the server and exits 1. Then every PromQL expression of the
dashboard and of the rules must have returned data over the window, the
pipeline-tail-stall signal must have turned on, and the incident must have
reached Prometheus before the harness went away.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from soak.export.lint import (
    dashboard_expressions,
    load_dashboard,
    load_rules,
    rule_expressions,
    signal_of,
)

from prom_helpers import Prometheus, free_port  # make_prometheus: conftest.py

pytestmark = pytest.mark.timeout(90)

SCRAPE_S = 1
# The stage-CPU source's gauge exists only where the run reads stage CPU (no GPUs).
STAGE_CPU_METRIC = "soak_stage_cpu_percent"
# Grafana's variables as a person with "All" boxes and a short range sees them.
GRAFANA_VARIABLES = {"$__rate_interval": "10s", "$__interval": "1s", "$__range": "1h", "$box": ".*"}


def run_config(sim, exporter_port: int) -> dict:
    return {
        "name": "prometheus-test",
        "duration": "60s",
        "target": {"kind": "attached", "base_url": sim.base_url, "pid": sim.pid, "pp_size": 8, "block_size": 256},
        "probes": {"gpu": {"kind": "sim"}},
        "workload": {
            "kind": "synthetic_agentic",
            "min_context_tokens": 600,
            "max_context_tokens": 1000,
            "start_context_tokens": {"dist": "uniform", "low": 600, "high": 700},
            "shared_prefix_tokens": 300,
            "tool_result_tokens": {"dist": "uniform", "low": 50, "high": 100},
            "output_tokens": 32,
            "think_time_s": 0.2,
        },
        "load": {"concurrency": 3, "drain": "2s"},
        "exporter": {"port": exporter_port},
        "view": {"mode": "plain", "plain_interval": "5s"},
    }


@pytest.fixture
def soak_run(tmp_path):
    """Factory: ``soak run CONFIG`` as a subprocess; killed at teardown if still running."""
    started: list[subprocess.Popen] = []

    def start(config: dict) -> tuple[subprocess.Popen, Path]:
        config_path = tmp_path / "run.yaml"
        config_path.write_text(yaml.safe_dump(config))
        out = tmp_path / "run.out"
        with open(out, "w") as log:
            popen = subprocess.Popen(
                [sys.executable, "-m", "soak", "run", str(config_path), "--out", str(tmp_path / "run"), "--no-html"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        started.append(popen)
        return popen, out

    yield start
    for popen in started:
        if popen.poll() is None:
            popen.kill()
            popen.wait(timeout=10)


def has_data(result: list[dict]) -> bool:
    return any(not math.isnan(float(v)) for series in result for _ts, v in series["values"])


def substitute(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def enough_scraped(prometheus: Prometheus) -> bool:
    """Every job scraped at least 4 times, and tokens flowing on the server and the client."""
    scrapes = prometheus.api("query", query="count_over_time(up[1m]) >= 4 and up == 1")["result"]
    flowing = prometheus.api(
        "query",
        query="sum(rate(vllm:generation_tokens_total[10s])) > 0 and on() sum(rate(soak_requests_total[10s])) > 0",
    )["result"]
    return {s["metric"]["job"] for s in scrapes} == {"soak", "vllm", "dcgm"} and bool(flowing)


def wait_until(predicate, timeout_s: float, what: str, popen: subprocess.Popen, out: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if popen.poll() is not None:
            pytest.fail(f"soak run exited {popen.returncode} before {what}:\n{out.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout_s:.0f}s:\n{out.read_text()[-3000:]}")
        time.sleep(0.25)


def test_every_dashboard_and_rule_expression_returns_data(sim_process, soak_run, make_prometheus, monkeypatch):
    # The harness exports no counter's _created series, as in a deployment that sets this:
    # nothing below (the rules, the run-ended mark, SoakHarnessDown quiet after the night) may need one.
    monkeypatch.setenv("PROMETHEUS_DISABLE_CREATED_SERIES", "True")
    sim = sim_process(processes=False, time_scale=5.0)
    sim_address = sim.base_url.removeprefix("http://")
    exporter_port = free_port()
    prometheus = make_prometheus(
        {
            "soak": (f"127.0.0.1:{exporter_port}", "/metrics"),
            "vllm": (sim_address, "/metrics"),
            "dcgm": (sim_address, "/sim/dcgm"),
        }
    )
    start = time.time()
    harness, out = soak_run(run_config(sim, exporter_port))
    wait_until(lambda: enough_scraped(prometheus), 25, "scrapes of healthy load", harness, out)

    # The deadlock: stages 0..6 spin at 100 %, the last stage reads 0 %.
    request = urllib.request.Request(
        sim.base_url + "/sim/fault", data=json.dumps({"kind": "pp_deadlock"}).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200
    try:
        returncode = harness.wait(timeout=40)
    except subprocess.TimeoutExpired:
        pytest.fail(f"soak run did not end after the deadlock:\n{out.read_text()[-3000:]}")
    assert returncode == 1, out.read_text()[-3000:]
    assert not prometheus.api("query", query='{__name__=~".+_created",job="soak"}')["result"]
    # Until Prometheus has scraped the harness as gone (up == 0): the window then
    # holds the rules' last evaluations. Polled, not a fixed sleep a loaded box outruns.
    deadline = time.monotonic() + 20 * SCRAPE_S
    while not prometheus.api("query", query='up{job="soak"} == 0')["result"]:
        assert time.monotonic() < deadline, "Prometheus never scraped the harness as down"
        time.sleep(0.25)
    end = time.time()

    expressions = list(dashboard_expressions(load_dashboard())) + list(rule_expressions(load_rules()))
    empty = []
    for e in expressions:
        if STAGE_CPU_METRIC in e.expr:
            continue  # a GPU-less server's reading: test_the_stage_cpu_panel_reads_a_gpu_less_run
        expr = substitute(signal_of(e.expr) if e.condition else e.expr)
        if not has_data(prometheus.query_range(expr, start, end)):
            empty.append(f"{e.where}: {expr}")
    assert empty == [], "expressions without data:\n" + "\n".join(empty)

    # The deadlock reached the recorded signal the alert reads.
    stall = prometheus.query_range("max(soak:pipeline_tail_stall)", start, end)
    assert max(float(v) for _ts, v in stall[0]["values"]) == 1
    # GPU 7 read 0 % in the harness's metrics and in the dcgm-format ones.
    for metric in ("soak_gpu_utilization_percent", "DCGM_FI_DEV_GPU_UTIL"):
        quiet = prometheus.query_range(f'min(min_over_time({metric}{{gpu="7"}}[3s])) == 0', start, end)
        assert has_data(quiet), metric
    # The incident reached Prometheus before the harness exited, and the
    # dashboard's annotation query, as written, shows it.
    annotations = {a["name"]: a for a in load_dashboard()["annotations"]["list"]}
    incidents = prometheus.query_range(substitute(annotations["Incidents"]["expr"]), start, end)
    assert {(s["metric"]["kind"], s["metric"]["rule"]) for s in incidents} == {("hang", "pp_tail_stall")}
    # The run's start and end marks, as Grafana reads them (useValueForTime: the value is
    # the moment in ms), sit where the run directory says the run started and ended.
    events = [json.loads(line) for line in (out.parent / "run" / "events.jsonl").read_text().splitlines()]
    started = next(e["ts"] for e in events if e["type"] == "run_started")
    ended = next(e["ts"] for e in events if e["type"] == "run_ended")
    for name, at in (("Run started", started), ("Run ended", ended)):
        marks = prometheus.query_range(substitute(annotations[name]["expr"]), start, end)
        assert [s["metric"]["name"] for s in marks] == ["prometheus-test"], name  # the title's {{name}}
        moments = {float(v) for _ts, v in marks[0]["values"]}
        assert len(moments) == 1, (name, moments)  # one mark, whatever the step
        assert moments.pop() / 1000 == pytest.approx(at, abs=1.0), name
    verdicts = prometheus.query_range("max(soak_detector_state)", start, end)
    assert max(float(v) for _ts, v in verdicts[0]["values"]) == 2
    # The morning after, the run table still names the night that ended.
    run_table = next(p for p in load_dashboard()["panels"] if p["title"] == "Run")["targets"][0]["expr"]
    rows = prometheus.api("query", query=substitute(run_table))["result"]
    assert [r["metric"]["name"] for r in rows] == ["prometheus-test"]
    # The harness is gone now, because its run ended: SoakHarnessDown stays quiet
    # (it fired all day after a good night when it read `up == 0` alone).
    up = prometheus.api("query", query='up{job="soak"}')["result"]
    assert [float(s["value"][1]) for s in up] == [0.0]
    harness_stays_quiet(prometheus)


def harness_signal(prometheus: Prometheus) -> list[float]:
    return [float(s["value"][1]) for s in prometheus.api("query", query="soak:harness_missing")["result"]]


def harness_alerts(prometheus: Prometheus) -> list[str]:
    return [a["state"] for a in prometheus.api("alerts")["alerts"] if a["labels"]["alertname"] == "SoakHarnessDown"]


def harness_stays_quiet(prometheus: Prometheus) -> None:
    """A few evaluations after the harness was scraped as down: no run in progress, no alert."""
    deadline = time.monotonic() + 5 * SCRAPE_S
    while time.monotonic() < deadline:
        assert harness_signal(prometheus) == [0.0]
        assert harness_alerts(prometheus) == []
        time.sleep(0.5)


def test_a_harness_killed_in_the_middle_of_its_run_is_missed(sim_process, soak_run, make_prometheus):
    """SoakHarnessDown fires for a run that started and never ended: the harness
    is SIGKILLed mid-run (as the OOM killer or a reboot would), Prometheus
    scrapes it as down, and the alert goes pending at once (firing after its
    minute of ``for``)."""
    sim = sim_process(processes=False, time_scale=5.0)
    exporter_port = free_port()
    prometheus = make_prometheus({"soak": (f"127.0.0.1:{exporter_port}", "/metrics")})
    config = run_config(sim, exporter_port)
    config["duration"] = "10m"
    harness, out = soak_run(config)
    wait_until(lambda: harness_signal(prometheus) == [0.0] and prometheus.api(
        "query", query='soak_run_start_time_seconds{job="soak"} > 0')["result"], 30, "a run in progress", harness, out)
    harness.kill()  # our own child, by its pid
    harness.wait(timeout=10)
    deadline = time.monotonic() + 20 * SCRAPE_S
    while harness_signal(prometheus) != [1.0] or harness_alerts(prometheus) != ["pending"]:
        assert time.monotonic() < deadline, (harness_signal(prometheus), harness_alerts(prometheus))
        time.sleep(0.25)


def test_the_stage_cpu_panel_reads_a_gpu_less_run(soak_run, make_prometheus, monkeypatch):
    """A run that reads stage CPU (the simulator's workers burning the CPU their
    state says) fills the dashboard's stage-CPU panel, and no GPU panel claims it."""
    exporter_port = free_port()
    prometheus = make_prometheus({"soak": (f"127.0.0.1:{exporter_port}", "/metrics")})
    monkeypatch.setenv("SOAK_SIM_BURN_CPU", "1")
    config = {
        "name": "stage-cpu-panel", "duration": "25s",
        "target": {"kind": "simulator", "sim": {"time_scale": 10, "pp_size": 2}},
        "probes": {"gpu": {"kind": "stage_cpu"}},
        "workload": {"kind": "synthetic_agentic", "min_context_tokens": 600, "max_context_tokens": 1000,
                     "start_context_tokens": {"dist": "uniform", "low": 600, "high": 700},
                     "shared_prefix_tokens": 300, "tool_result_tokens": {"dist": "uniform", "low": 50, "high": 100},
                     "output_tokens": 16, "think_time_s": 0.2},
        "load": {"concurrency": 2, "drain": "2s"},
        "exporter": {"port": exporter_port},
        "view": {"mode": "plain", "plain_interval": "5s"},
    }
    start = time.time()
    harness, out = soak_run(config)
    panel = next(e for e in dashboard_expressions(load_dashboard()) if STAGE_CPU_METRIC in e.expr)
    deadline = time.monotonic() + 60
    while not has_data(prometheus.query_range(substitute(panel.expr), start, time.time())):
        if harness.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{panel.where}: no stage CPU reached Prometheus:\n{out.read_text()[-3000:]}")
        time.sleep(0.5)
    gpu = prometheus.query_range("soak_gpu_utilization_percent", start, time.time())
    assert not has_data(gpu), "a stage-CPU run must not publish GPU utilization"
