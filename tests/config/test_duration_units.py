"""Durations need a unit. On the command line a bare number is refused (exit 2,
one line), as thresholds refuse ``"< 90"``: ``--duration 40`` could mean 40 s or
40 min. In a config file a bare number is still read as seconds, for the configs
that say ``duration: 300``, with one warning line on stderr naming the file, line
and field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.cli import main as soak_main
from soak.config import load_run_config
from soak.durations import duration_flag
from soak.errors import ArgumentError

ROOT = Path(__file__).resolve().parents[2]
GOOD = "duration: 10s\nexporter:\n  enabled: false\n"


def _validate(path, *extra):
    return subprocess.run([sys.executable, "-m", "soak", "validate", str(path), *extra], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("value", ["40", "40.5", " 40 ", "0", "1e3"])
def test_a_flag_without_a_unit_is_refused(value):
    with pytest.raises(ArgumentError) as info:
        duration_flag(value)
    bare = value.strip()
    assert str(info.value) == f"--duration: {bare!r} has no unit: write {bare}s or {bare}m"


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=10**6), st.sampled_from(["s", "m", "h", "ms"]))
def test_a_flag_with_a_unit_reads_as_before(n, unit):
    assert duration_flag(f"{n}{unit}") == pytest.approx(n * {"s": 1, "m": 60, "h": 3600, "ms": 0.001}[unit])


def test_soak_run_duration_40_is_exit_2_with_one_line(tmp_path):
    path = tmp_path / "night.yaml"
    path.write_text(GOOD)
    proc = subprocess.run([sys.executable, "-m", "soak", "run", str(path), "--duration", "40", "--out",
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr == "soak run: --duration: '40' has no unit: write 40s or 40m\n"
    assert not (tmp_path / "run").exists()


def test_every_duration_flag_wants_a_unit(tmp_path, capsys):
    assert soak_main(["compare", str(tmp_path), str(tmp_path), "--window", "60"]) == 2
    assert "--window: '60' has no unit: write 60s or 60m" in capsys.readouterr().err
    assert soak_main(["plan", "--baseline-mtbf", "15"]) == 2
    assert "--baseline-mtbf: '15' has no unit" in capsys.readouterr().err


def test_a_bare_duration_in_a_file_is_read_as_seconds_with_one_warning(tmp_path):
    path = tmp_path / "night.yaml"
    path.write_text("duration: 10s\nload:\n  timeouts:\n    stall: 30\nexporter:\n  enabled: false\n")
    proc = _validate(path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == (f"warning: {path}:4: load.timeouts.stall: 30 has no unit and is read as 30s; "
                           "write 30s (or 30m if minutes were meant)\n")
    assert load_run_config(path, warn=lambda line: None).load.timeouts.stall == 30.0


def test_several_bare_durations_are_still_one_line(tmp_path):
    path = tmp_path / "night.yaml"
    path.write_text("duration: 600\nwarmup: 30\ntarget:\n  startup_timeout: 90\nthresholds:\n"
                    "  error_rate: {threshold: '< 1%', window: 300}\n")
    heard: list[str] = []
    load_run_config(path, warn=heard.append)
    assert heard == [f"warning: {path}: 4 durations have no unit and are read as seconds: duration (line 1), "
                     "warmup (line 2), target.startup_timeout (line 4), thresholds.error_rate.window (line 6); "
                     "write the unit (30s, 30m)"]


def test_the_flag_replaces_a_bare_file_duration_without_a_warning(tmp_path):
    path = tmp_path / "night.yaml"
    path.write_text("duration: 600\n")
    heard: list[str] = []
    assert load_run_config(path, duration=40.0, warn=heard.append).duration == 40.0
    assert heard == []


# (YAML under the key, the field the warning names) across the sections that hold durations
FIELDS = [
    ("warmup: {v}", "warmup"),
    ("load:\n  drain: {v}", "load.drain"),
    ("load:\n  timeouts:\n    first_token: {v}", "load.timeouts.first_token"),
    ("target:\n  kind: attached\n  base_url: http://127.0.0.1:8000\n  startup_timeout: {v}", "target.startup_timeout"),
    ("target:\n  sim:\n    faults:\n      - kind: pp_deadlock\n        at: {v}", "target.sim.faults[0].at"),
    ("probes:\n  gpu:\n    kind: nvml\n    deadline: {v}", "probes.gpu.deadline"),
    ("detector:\n  pp_tail_stall:\n    progress_grace: {v}", "detector.pp_tail_stall.progress_grace"),
    ("criteria:\n  work_evidence:\n    max_gap: {v}", "criteria.work_evidence.max_gap"),
    ("criteria:\n  no_success:\n    window: {v}", "criteria.no_success.window"),
    ("thresholds:\n  ttft_p95:\n    threshold: '< 9s'\n    window: {v}", "thresholds.ttft_p95.window"),
]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(FIELDS), st.integers(min_value=1, max_value=9))
def test_any_bare_duration_is_named_with_its_line(tmp_path_factory, field, n):
    text, name = field
    body = "duration: 1h\n" + text.format(v=n) + "\n"
    path = tmp_path_factory.mktemp("d") / "night.yaml"
    path.write_text(body)
    heard: list[str] = []
    try:
        load_run_config(path, warn=heard.append)
    except Exception as exc:  # a value out of a field's range: the error, not a warning, is the answer
        assert "has no unit" not in str(exc)
        return
    line = body.splitlines().index(next(l for l in body.splitlines() if l.strip().endswith(f": {n}"))) + 1
    assert heard == [f"warning: {path}:{line}: {name}: {n} has no unit and is read as {n}s; "
                     f"write {n}s (or {n}m if minutes were meant)"]


@pytest.mark.parametrize("config", sorted([*ROOT.glob("workloads/*.yaml"), *ROOT.glob("examples/*.yaml"),
                                           *ROOT.glob("bench/*.yaml")]), ids=lambda p: p.name)
def test_shipped_configs_validate_without_a_warning(config):
    proc = _validate(config)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_a_workload_file_given_as_a_run_config_says_so(capsys):
    path = ROOT / "examples" / "workloads" / "real-vllm-8k.yaml"
    assert soak_main(["validate", str(path)]) == 2
    assert "a workload file, not a run config: name it in one (workload: PATH)" in capsys.readouterr().err
