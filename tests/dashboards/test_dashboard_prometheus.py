"""A real Prometheus scraping a live simulator and the harness's exporter.

Prometheus (Debian's package) runs the shipped ``prometheus.yml`` and rules,
with the targets pointed at this test's ports and a 1 s scrape interval. The
harness side is the exporter fed the way the run loop feeds it: GPU samples
read from the simulator, the real streaming client's requests and progress,
detector assessments and an incident. Then every PromQL expression of the
dashboard and of the rules must return data over the test's window, and the
pipeline-tail-stall signal must turn on once the simulator deadlocks.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import yaml
from prometheus_client import CollectorRegistry

from soak.detect.types import Assessment, DetectorState, RuleState, RuleStatus
from soak.export.config import ExporterConfig
from soak.export.exporter import Exporter
from soak.export.lint import (
    PROMETHEUS_CONFIG_PATH,
    RULES_PATH,
    dashboard_expressions,
    load_dashboard,
    load_rules,
    rule_expressions,
    signal_of,
)
from soak.load.client import StreamingClient
from soak.load.config import TimeoutsConfig
from soak.load.progress import ProgressTracker
from soak.respond.incident import IncidentRecord
from soak.run.sinks import RunInfo
from soak.samples import GpuReading, GpuSample, GpuSource, HealthSample, ServerSample

pytestmark = pytest.mark.timeout(90)

SCRAPE_S = 1
# Grafana's variables as a person with "All" boxes and a short range sees them.
GRAFANA_VARIABLES = {"$__rate_interval": "10s", "$__interval": "1s", "$box": ".*"}
SHARED_PREFIX = " ".join(f"word{i % 97}" for i in range(1500))


@dataclass(frozen=True)
class Turn:
    session_id: str | None
    turn: int | None
    path: str
    body: bytes
    planned_prompt_tokens: int | None
    max_tokens: int


def chat_turn(model: str, n: int) -> Turn:
    body = {
        "model": model,
        "messages": [
            {"role": "system", "content": SHARED_PREFIX},
            {"role": "user", "content": f"turn {n}: say something about soak tests"},
        ],
        "max_tokens": 64,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return Turn(f"s{n % 3}", n, "/v1/chat/completions", json.dumps(body).encode(), None, 64)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    def __init__(self, popen: subprocess.Popen, url: str, log_path: Path) -> None:
        self.popen, self.url, self.log_path = popen, url, log_path

    def api(self, path: str, **params: str) -> dict:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query_range(self, expr: str, start: float, end: float) -> list[dict]:
        return self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step="1")["result"]

    def close(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)


@pytest.fixture
def make_prometheus(tmp_path):
    """Factory: a Prometheus on a free loopback port running the shipped config with ``targets``."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed; scripts/test installs Debian's package")
    started: list[Prometheus] = []

    def make(targets: dict[str, tuple[str, str]]) -> Prometheus:
        config = yaml.safe_load(PROMETHEUS_CONFIG_PATH.read_text())
        config["global"]["scrape_interval"] = f"{SCRAPE_S}s"
        config["global"]["evaluation_interval"] = f"{SCRAPE_S}s"
        config["rule_files"] = [str(RULES_PATH)]
        for job in config["scrape_configs"]:
            address, metrics_path = targets[job["job_name"]]
            job["static_configs"][0]["targets"] = [address]
            job["metrics_path"] = metrics_path
        config_path = tmp_path / f"prometheus-{len(started)}.yml"
        config_path.write_text(yaml.safe_dump(config))
        for _attempt in range(3):  # a free port can be taken between the probe and the bind
            port = free_port()
            log_path = tmp_path / f"prometheus-{len(started)}-{port}.log"
            with open(log_path, "w") as log:
                popen = subprocess.Popen(
                    [binary, f"--config.file={config_path}", f"--storage.tsdb.path={tmp_path / f'tsdb-{port}'}",
                     f"--web.listen-address=127.0.0.1:{port}"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                )
            prometheus = Prometheus(popen, f"http://127.0.0.1:{port}", log_path)
            started.append(prometheus)
            deadline = time.monotonic() + 30
            while popen.poll() is None and time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(prometheus.url + "/-/ready", timeout=2) as response:
                        if response.status == 200:
                            return prometheus
                except OSError:
                    time.sleep(0.1)
            prometheus.close()
        pytest.fail(f"Prometheus never became ready:\n{log_path.read_text()[-3000:]}")

    yield make
    for prometheus in started:
        prometheus.close()


@pytest.fixture
def exporter():
    exporter = Exporter(ExporterConfig(port=0), registry=CollectorRegistry())
    exporter.start()
    yield exporter
    exporter.close()


def gpu_sample(state: dict, ts: float) -> GpuSample:
    return GpuSample(
        ts=ts,
        source=GpuSource.SIM,
        gpus=tuple(
            GpuReading(index=g["index"], util_pct=g["util_pct"], mem_used_mib=g.get("mem_used_mib"),
                       mem_total_mib=g.get("mem_total_mib"), power_w=g.get("power_w"), pids=tuple(g.get("pids", ())),
                       uuid=g.get("uuid"))
            for g in state["gpus"]
        ),
    )


def assessment(now: float, state: DetectorState, stall: RuleState) -> Assessment:
    return Assessment(
        now=now,
        state=state,
        rules=(
            RuleStatus(rule="pp_tail_stall", state=stall),
            RuleStatus(rule="generation_frozen", state=RuleState.CLEAR),
            RuleStatus(rule="log_signature", state=RuleState.INACTIVE),
        ),
    )


def has_data(result: list[dict]) -> bool:
    return any(not math.isnan(float(v)) for series in result for _ts, v in series["values"])


def substitute(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


async def drive_harness(exporter: Exporter, sim_url: str, *, prometheus: Prometheus, started_at: float) -> None:
    """What the run loop does, bounded: probes, a few requests, then a deadlock and its incident."""
    tracker = ProgressTracker()
    timeouts = TimeoutsConfig(connect=5, first_token=20, stall=20, total=30)
    exporter.on_start(
        RunInfo(run_id="prometheus-test", run_dir=Path("."), started_at=started_at, duration_s=600.0, warmup_s=0.0,
                target_kind="simulator", base_url=sim_url, model="deepseek-v4-flash", root_pid=None,
                config={"name": "prometheus-test", "workload": {"kind": "synthetic_agentic"}})
    )
    async with aiohttp.ClientSession() as http, StreamingClient(
        base_url=sim_url, timeouts=timeouts, tracker=tracker, max_connections=8
    ) as client:

        async def sample_once() -> None:
            now = time.time()
            async with http.get(f"{sim_url}/sim/state") as response:
                exporter.on_sample(gpu_sample(await response.json(), now))
            exporter.on_sample(tracker.snapshot(now, time.monotonic()))
            exporter.on_sample(HealthSample(ts=now, ok=True, status=200))
            exporter.on_sample(ServerSample(ts=now, ok=True))

        async def send(n: int) -> None:
            exporter.on_request(await client.send(chat_turn("deepseek-v4-flash", n), request_id=str(n)))

        # Healthy load: at most one new request a probe tick (250 ms), three
        # in flight, 80 in all, so traffic spans the scrapes; until Prometheus
        # holds several scrapes of every job with tokens flowing (at most 20 s).
        requests: set[asyncio.Task] = set()
        sent, deadline = 0, time.monotonic() + 20
        exporter.on_assessment(assessment(time.time(), DetectorState.HEALTHY, RuleState.CLEAR))
        while time.monotonic() < deadline:
            requests = {t for t in requests if not t.done()}
            if len(requests) < 3 and sent < 80:
                requests.add(asyncio.create_task(send(sent)))
                sent += 1
            await sample_once()
            await asyncio.sleep(0.25)
            if sent >= 6 and await asyncio.to_thread(_enough_scraped, prometheus):
                break
        await asyncio.gather(*requests)

        # The deadlock: stages 0..6 spin at 100 %, the last stage reads 0 %.
        async with http.post(f"{sim_url}/sim/fault", json={"kind": "pp_deadlock"}) as response:
            assert response.status == 200, await response.text()
        onset = time.time()
        exporter.on_assessment(assessment(time.time(), DetectorState.SUSPECT, RuleState.PENDING))
        for _ in range(12):
            await sample_once()
            await asyncio.sleep(0.25)
        exporter.on_assessment(assessment(time.time(), DetectorState.HUNG, RuleState.FIRED))
        exporter.on_incident(
            IncidentRecord(number=1, kind="hang", rule="pp_tail_stall", onset_at=onset, detected_at=time.time(),
                           killed_pids=(), gpus_released=True, gpu_free_s=0.2, evidence="incidents/1",
                           summary="pp tail stall")
        )
        exporter.on_event("incident", {"number": 1})
        for _ in range(12):  # a few more scrapes and rule evaluations
            await sample_once()
            await asyncio.sleep(0.25)


def _enough_scraped(prometheus: Prometheus) -> bool:
    """Every job scraped at least 4 times and the server's generated-token rate above zero."""
    scrapes = prometheus.api("query", query="count_over_time(up[1m]) >= 4 and up == 1")["result"]
    generating = prometheus.api("query", query="sum(rate(vllm:generation_tokens_total[10s])) > 0")["result"]
    return {s["metric"]["job"] for s in scrapes} == {"soak", "vllm", "dcgm"} and bool(generating)


async def test_every_dashboard_and_rule_expression_returns_data(sim_process, exporter, make_prometheus):
    sim = sim_process(processes=False, time_scale=5.0)
    sim_address = sim.base_url.removeprefix("http://")
    prometheus = make_prometheus(
        {
            "soak": (f"127.0.0.1:{exporter.port}", "/metrics"),
            "vllm": (sim_address, "/metrics"),
            "dcgm": (sim_address, "/sim/dcgm"),
        }
    )
    start = time.time()
    await drive_harness(exporter, sim.base_url, prometheus=prometheus, started_at=start)
    end = time.time()

    expressions = list(dashboard_expressions(load_dashboard())) + list(rule_expressions(load_rules()))
    empty = []
    for e in expressions:
        expr = substitute(signal_of(e.expr) if e.condition else e.expr)
        if not has_data(prometheus.query_range(expr, start, end)):
            empty.append(f"{e.where}: {expr}")
    assert empty == [], "expressions without data:\n" + "\n".join(empty)

    # The deadlock reached the recorded signal the alert reads, from the
    # harness's GPU metrics and from the dcgm-format ones alike.
    stall = prometheus.query_range("max(soak:pipeline_tail_stall)", start, end)
    assert max(float(v) for _ts, v in stall[0]["values"]) == 1
    by_source = prometheus.query_range(
        '(sum(min_over_time(soak_gpu_utilization_percent{gpu="7"}[2s]) == 0) >= 0)'
        ' and (sum(min_over_time(DCGM_FI_DEV_GPU_UTIL{gpu="7"}[2s]) == 0) >= 0)', start, end
    )
    assert has_data(by_source), "GPU 7 never read 0 % in both the harness's and the dcgm metrics"
    # Incidents reached the annotation query as it is written.
    incidents = prometheus.query_range(substitute(load_dashboard()["annotations"]["list"][0]["expr"]), start, end)
    assert {s["metric"]["kind"] for s in incidents} == {"hang"}
    # And the harness's rule states came through with their rule names.
    rules = prometheus.query_range("max by (rule) (soak_detector_rule_state)", start, end)
    assert {s["metric"]["rule"] for s in rules} == {"pp_tail_stall", "generation_frozen", "log_signature"}
