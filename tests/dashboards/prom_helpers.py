"""A real Prometheus for the dashboard and Pushgateway tests."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from soak.export.lint import PROMETHEUS_CONFIG_PATH, RULES_PATH
from ports import free_port  # per-worker ports: tests/ports.py

SCRAPE_S = 1


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
        # Only the jobs the test has a target for (the shipped file also scrapes a Pushgateway).
        config["scrape_configs"] = [job for job in config["scrape_configs"] if job["job_name"] in targets]
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


