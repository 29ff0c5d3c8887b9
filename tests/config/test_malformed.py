"""Malformed run configs: each exits 2 with one line that names the file and the
field, and no traceback, before anything starts (no run directory is made)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from soak.cli import main as soak_main

GOOD = {
    "duration": "10s",
    "target": {"kind": "simulator"},
    "load": {"concurrency": 2},
    "exporter": {"enabled": False},
}


def with_(path: str, value, base=None):
    config = yaml.safe_load(yaml.safe_dump(base or GOOD))
    node = config
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return config


# (config or raw YAML text, field the line must name, words the message must carry)
CASES = [
    pytest.param(with_("bogus", 1), "bogus", "unknown key", id="unknown-top-key"),
    pytest.param(with_("load.concurrency_cap", 4), "load.concurrency_cap", "unknown key", id="unknown-nested-key"),
    pytest.param(with_("duration", -5), "duration", "negative", id="negative-duration"),
    pytest.param(with_("duration", "soon"), "duration", "not a duration", id="duration-not-a-duration"),
    pytest.param(with_("duration", 0), "duration", "greater than 0", id="zero-duration"),
    pytest.param(with_("warmup", "10s"), "warmup", "shorter than the duration", id="warmup-not-below-duration"),
    pytest.param(with_("load.concurrency", 0), "load.concurrency", "greater than or equal to 1", id="concurrency-zero"),
    pytest.param(with_("load.concurrency", "eight"), "load.concurrency", "integer", id="concurrency-wrong-type"),
    pytest.param(with_("load.mode", "burst"), "load.mode", "closed", id="unknown-load-mode"),
    pytest.param(with_("load.mode", "open"), "load.rate", "needs a rate", id="open-without-rate"),
    pytest.param(with_("load.rate", -1.0, with_("load.mode", "open")), "load.rate", "greater than 0", id="negative-rate"),
    pytest.param(with_("load.burstiness", 0, with_("load.rate", 2.0, with_("load.mode", "open"))), "load.burstiness",
                 "greater than 0", id="zero-burstiness"),
    pytest.param(with_("load.timeouts.stall", "0s"), "load.timeouts.stall", "greater than 0", id="zero-stall-timeout"),
    pytest.param(with_("load.timeouts.stall", "2h"), "load.timeouts.stall", "total", id="stall-above-total"),
    pytest.param(with_("load.max_requests", 0), "load.max_requests", "greater than or equal to 1", id="request-cap-zero"),
    pytest.param(with_("target", {"kind": "docker"}), "target.kind", "unknown kind 'docker', known: simulator, launched, attached",
                 id="unknown-target-kind"),
    pytest.param(with_("target", {"kind": "attached"}), "target.base_url", "required", id="attached-without-url"),
    pytest.param(with_("target", {"kind": "attached", "base_url": "localhost:8000"}), "target.base_url", "base URL",
                 id="url-without-scheme"),
    pytest.param(with_("target", {"kind": "attached", "base_url": "http://127.0.0.1:8000/v1"}), "target.base_url",
                 "ends in /v1: drop it and give the server's root ('http://127.0.0.1:8000')", id="url-ending-in-v1"),
    pytest.param(with_("target", {"kind": "launched", "command": "vllm serve m", "base_url": "http://h:8000/v1/"}),
                 "target.base_url", "ends in /v1: drop it", id="launch-url-ending-in-v1-slash"),
    pytest.param(with_("target", {"kind": "attached", "base_url": "http://127.0.0.1:8000", "pid": -3}), "target.pid",
                 "greater than or equal to 2", id="negative-pid"),
    pytest.param(with_("target", {"kind": "launched", "command": []}), "target.command", "must not be empty", id="empty-command"),
    pytest.param(with_("target", {"kind": "launched", "command": "vllm serve m", "api_key_env": "MY KEY"}),
                 "target.api_key_env", "environment variable", id="bad-api-key-env"),
    pytest.param(with_("target.sim", {"pp_size": 0}), "target.sim.pp_size", "greater than or equal to 1", id="sim-pp-zero"),
    pytest.param(with_("response.on_hang", "reboot"), "response.on_hang", "stop", id="unknown-on-hang"),
    pytest.param(with_("view.mode", "fancy"), "view.mode", "auto", id="unknown-view-mode"),
    pytest.param(with_("exporter.port", 70000), "exporter.port", "65535", id="exporter-port-range"),
    pytest.param(with_("seed", [1, 2]), "seed", "integer", id="seed-wrong-type"),
    pytest.param("duration: [unclosed\n", ":2", "invalid YAML", id="invalid-yaml"),
    pytest.param("- just\n- a list\n", "", "mapping at the top level", id="not-a-mapping"),
]


def write(tmp_path, config) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(config if isinstance(config, str) else yaml.safe_dump(config), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("config, field, words", CASES)
def test_malformed_config_exits_2_with_one_line(tmp_path, capsys, config, field, words) -> None:
    path = write(tmp_path, config)
    out_dir = tmp_path / "run"
    assert soak_main(["run", path, "--out", str(out_dir)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    line = lines[0]
    assert path in line
    assert f"{field}: " in line or (field.startswith(":") and f"{path}{field}" in line), line
    assert words in line, line
    assert "Traceback" not in captured.err + captured.out
    assert not out_dir.exists(), "nothing may start for a bad config"


def test_the_same_lines_from_a_real_process(tmp_path) -> None:
    """The installed entry point, as a nightly script sees it."""
    for config, field in ((with_("load.concurrency", 0), "load.concurrency"), (with_("target", {"kind": "k8s"}), "target.kind")):
        path = write(tmp_path, config)
        proc = subprocess.run([sys.executable, "-m", "soak", "run", path], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2
        assert proc.stderr.count("\n") == 1 and f"{path}: {field}: " in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_bad_duration_flag_is_one_line(tmp_path, capsys) -> None:
    path = write(tmp_path, GOOD)
    assert soak_main(["run", path, "--duration", "forever"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--duration" in err


def test_duration_flag_overrides_and_is_checked_against_warmup(tmp_path, capsys) -> None:
    path = write(tmp_path, with_("warmup", "5s"))
    assert soak_main(["validate", path, "--duration", "3s"]) == 2
    assert "warmup: must be shorter than the duration (3s)" in capsys.readouterr().err


def test_missing_file_is_one_line(tmp_path, capsys) -> None:
    missing = str(tmp_path / "nope.yaml")
    assert soak_main(["run", missing]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"soak run: {missing}: no such file"
