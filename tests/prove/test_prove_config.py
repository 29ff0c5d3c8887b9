"""The ``prove:`` section (soak/prove/config.py): one way to say each quantity,
durations as the rest of the config writes them, and the plan it makes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from soak.prove.config import ProveConfig, plan_of
from soak.prove.sprt import plan, truncation

MIN = 60.0


def test_the_issue_plan_from_yaml_values() -> None:
    section = ProveConfig.model_validate({"broken_mtbf": "20m", "target_mtbf": "200m", "alpha": 0.05,
                                         "beta": 0.05, "stop_at_decision": True})
    assert plan_of(section) == plan(broken_mtbf_s=20 * MIN, target_mtbf_s=200 * MIN)
    assert section.stop_at_decision


def test_a_ratio_and_a_broken_build_from_history() -> None:
    section = ProveConfig.model_validate({"broken_build": "nightly-1203", "history": "runs", "ratio": 10})
    with pytest.raises(ValueError, match="nightly-1203"):
        plan_of(section)  # history had no MTBF for it
    got = plan_of(section, broken_mtbf_s=20 * MIN)
    assert got.target_mtbf_s == pytest.approx(200 * MIN) and got.alpha == 0.05


@pytest.mark.parametrize("values, message", [
    ({"ratio": 10}, "one of broken_mtbf"),
    ({"broken_mtbf": "20m", "broken_build": "b", "history": "runs", "ratio": 10}, "one of broken_mtbf"),
    ({"broken_build": "b", "ratio": 10}, "broken_build and history go together"),
    ({"broken_mtbf": "20m", "history": "runs", "ratio": 10}, "broken_build and history go together"),
    ({"broken_mtbf": "20m"}, "one of target_mtbf"),
    ({"broken_mtbf": "20m", "target_mtbf": "10m"}, "must be above broken_mtbf"),
    ({"broken_mtbf": "20m", "ratio": 1.05}, "greater than or equal to 1.1"),
    ({"broken_mtbf": "20m", "ratio": 1e7}, "less than or equal to 1000000"),
    ({"broken_mtbf": "20m", "ratio": 10, "alpha": 0.5}, "less than 0.5"),
    ({"broken_mtbf": "20m", "ratio": 10, "max_hangs": 0}, "greater than or equal to 1"),
    ({"broken_mtbf": "20m", "ratio": 10, "truncate": "soon"}, "truncate takes 'auto'"),
    ({"broken_mtbf": "20m", "ratio": 10, "truncate": "auto", "max_hangs": 3}, "one or the other"),
    ({"broken_mtbf": "20m", "ratio": 10, "stop": True}, "Extra inputs"),
])
def test_bad_sections(values, message) -> None:
    with pytest.raises(ValidationError, match=message):
        ProveConfig.model_validate(values)


def test_truncate_auto_is_the_handbooks() -> None:
    # Epstein's fixed-length test for θ1 20 min, θ0 200 min, α = β = 5%: the
    # lower 5% and upper 95% χ² quantiles, by degrees of freedom 2r:
    #   r = 2 (4 df): 0.710723 / 9.487729 = 0.0749 < θ1/θ0 = 0.1
    #   r = 3 (6 df): 1.635383 / 12.591587 = 0.1299 >= 0.1, so r0 = 3
    #   T0 = 200 min x 1.635383 / 2 = 163.54 min
    exposure, hangs = truncation(broken_mtbf_s=20 * MIN, target_mtbf_s=200 * MIN, alpha=0.05, beta=0.05)
    assert hangs == 3 and exposure / MIN == pytest.approx(163.5383, abs=1e-3)
    section = ProveConfig.model_validate({"broken_mtbf": "20m", "ratio": 10, "truncate": "auto"})
    got = plan_of(section)
    assert got.max_hangs == 3 and got.max_exposure_s == pytest.approx(exposure)


def write(tmp_path, text: str):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_the_run_config_takes_a_prove_section(tmp_path) -> None:
    from soak.config import load_run_config

    config = load_run_config(write(tmp_path, "duration: 10s\nprove:\n  broken_build: nightly-1\n"
                                             "  history: runs\n  ratio: 10\n  stop_at_decision: true\n"))
    assert config.prove is not None and config.prove.stop_at_decision
    assert config.prove.history == str(tmp_path / "runs")  # beside the config, as a workload path is
    assert load_run_config(write(tmp_path, "duration: 10s\n")).prove is None  # no section: no test


@pytest.mark.parametrize("text, said", [
    ("prove:\n  broken_mtbf: 20m\n  target_mtbf: 200m\n  stop_at_decison: true\n",
     "run.yaml:5: prove.stop_at_decison: unknown key; did you mean 'stop_at_decision'?"),
    ("prove:\n  broken_mtbf: 20m\n  target_mtbf: 10m\n", "run.yaml: prove: target_mtbf (600 s) must be above"),
    ("prove:\n  broken_mtbf: 20m\n  ratio: 10\n  alpha: 0.7\n", "run.yaml: prove.alpha: "),
])
def test_a_bad_prove_section_is_one_line_and_exit_2(tmp_path, text, said) -> None:
    import subprocess
    import sys

    path = write(tmp_path, "duration: 10s\n" + text)
    done = subprocess.run([sys.executable, "-m", "soak", "validate", str(path)], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert said in done.stderr
