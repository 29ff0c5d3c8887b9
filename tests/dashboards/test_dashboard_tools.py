"""The rules and configs through the real tools: promtool and a compose parser."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from soak.export.lint import COMPOSE_PATH, PROMETHEUS_CONFIG_PATH, RULES_PATH, RULES_TEST_PATH, REPO_ROOT


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; scripts/test installs it (Debian's prometheus / docker-compose)")
    return path


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)


def test_promtool_check_rules():
    result = run(tool("promtool"), "check", "rules", str(RULES_PATH))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_test_rules():
    result = run(tool("promtool"), "test", "rules", str(RULES_TEST_PATH))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_test_rules_fails_when_an_alert_is_broken(tmp_path):
    rules = yaml.safe_load(RULES_PATH.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("record") == "soak:pipeline_tail_stall":
                rule["expr"] = "soak:gpus_idle:count * 0"
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "rules" / RULES_PATH.name).write_text(yaml.safe_dump(rules))
    shutil.copy(RULES_TEST_PATH, tmp_path / "tests" / RULES_TEST_PATH.name)
    result = run(tool("promtool"), "test", "rules", str(tmp_path / "tests" / RULES_TEST_PATH.name))
    assert result.returncode != 0
    assert "SoakPipelineTailStall" in result.stdout + result.stderr


def test_promtool_check_config():
    result = run(tool("promtool"), "check", "config", "--syntax-only", str(PROMETHEUS_CONFIG_PATH))
    assert result.returncode == 0, result.stdout + result.stderr


def test_docker_compose_file_parses_with_a_real_compose_parser():
    result = run(tool("docker-compose"), "-f", str(COMPOSE_PATH), "config", "-q")
    assert result.returncode == 0, result.stdout + result.stderr
    resolved = yaml.safe_load(run(tool("docker-compose"), "-f", str(COMPOSE_PATH), "config").stdout)
    services = resolved["services"]
    assert {"prometheus", "grafana"} <= set(services)
    assert services["dcgm-exporter"]["profiles"] == ["dcgm"]
    # Host network, loopback listeners: nothing published beyond the box.
    for name in ("prometheus", "grafana"):
        assert services[name]["network_mode"] == "host"
        assert "ports" not in services[name]
    assert "--web.listen-address=127.0.0.1:9090" in services["prometheus"]["command"]
    assert services["grafana"]["environment"]["GF_SERVER_HTTP_ADDR"] == "127.0.0.1"
    mounted = {v.split(":")[0] if isinstance(v, str) else v["source"] for s in services.values() for v in s.get("volumes", [])}
    for path in ("dashboards/prometheus/prometheus.yml", "dashboards/prometheus/rules",
                 "dashboards/grafana/provisioning", "dashboards/grafana/dashboards"):
        assert str(REPO_ROOT / path) in mounted, path
        assert (REPO_ROOT / path).exists(), path


def test_the_compose_parser_rejects_a_broken_file(tmp_path):
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE_PATH.read_text().replace("network_mode: host", "network_mod: host", 1))
    result = run(tool("docker-compose"), "-f", str(broken), "config", "-q")
    assert result.returncode != 0
    assert "network_mod" in result.stdout + result.stderr


def test_grafana_provisioning_points_at_the_mounted_dashboards():
    provider = yaml.safe_load((REPO_ROOT / "dashboards/grafana/provisioning/dashboards/soak.yml").read_text())
    compose = yaml.safe_load(COMPOSE_PATH.read_text())
    mounts = dict(v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"])
    assert mounts["./dashboards/grafana/dashboards"] == provider["providers"][0]["options"]["path"]
    datasources = yaml.safe_load((REPO_ROOT / "dashboards/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasources["datasources"][0]["type"] == "prometheus"
    assert datasources["datasources"][0]["url"] == "http://127.0.0.1:9090"
