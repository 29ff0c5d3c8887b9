"""The bisect file (soak/bisect/spec.py): every build's segment config made
and validated before anything runs, env kept out of it, a build given as a run
config, and the prior taken from history's nights of these builds."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from soak.bisect.spec import load_bisect
from soak.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "runs"


def test_the_demo_makes_one_segment_config_per_build() -> None:
    spec = load_bisect(ROOT / "workloads" / "bisect-demo" / "bisect.yaml")
    assert spec.labels == ["b1", "b2", "b3", "b4"] and spec.model.prior == (0.25,) * 4
    for label, config in zip(spec.labels, spec.segment_configs):
        assert config["build"] == label and config["duration"] == "40s"
        assert config["response"]["on_hang"] == "stop" and config["response"]["evidence"] == {"py_spy": False}
        assert config["workload"]["kind"] == "synthetic_agentic"  # the base's, shared
    walls = [c["target"]["sim"]["faults"][0]["wall_mtbf"] for c in spec.segment_configs]
    assert walls == ["5m", "5m", "15s", "15s"]


def test_a_build_from_a_run_config_with_env_kept_out(tmp_path: Path) -> None:
    (tmp_path / "b0.yaml").write_text(yaml.safe_dump({"name": "x", "workload": "w.yaml", "target": {
        "kind": "launched", "command": "vllm serve m", "cwd": "srv", "env": {"HF_TOKEN": "hf_s3cret"}}}))
    (tmp_path / "bisect.yaml").write_text(yaml.safe_dump({
        "segment": "10m", "base": {"duration": "1h", "warmup": "1m", "load": {"concurrency": 3},
                                   "prove": {"broken_mtbf": "20m", "target_mtbf": "200m"}},
        "builds": [{"label": "b0", "config": "b0.yaml"},
                   {"label": "b1", "target": {"kind": "launched", "command": "vllm serve m2"}, "env": {"A": "1"}}]}))
    spec = load_bisect(tmp_path / "bisect.yaml")
    first, second = spec.segment_configs
    assert "env" not in first["target"] and "hf_s3cret" not in yaml.safe_dump(spec.segment_configs)
    assert spec.envs == ({"HF_TOKEN": "hf_s3cret"}, {"A": "1"})
    assert first["target"]["cwd"] == str((tmp_path / "srv").resolve())  # the build's file's folder
    assert first["duration"] == "660s" and "prove" not in first  # the segment plus the warm-up; the bisect stops
    assert first["load"] == {"concurrency": 3} and second["target"]["command"] == "vllm serve m2"


@pytest.mark.parametrize("build, field", [
    ({"label": "b1", "config": "missing.yaml"}, "missing.yaml"),
    ({"label": "b1", "target": {"kind": "simulator", "sim": {"faults": [{"kind": "pp_deadlock", "wall_mtbf": 0}]}}},
     "wall_mtbf"),
    ({"label": "b1", "target": {"kind": "simulator"}, "env": {"A": "1"}}, "builds[1].env"),
    ({"label": "b 1", "target": {"kind": "simulator"}}, "label"),
])
def test_a_bad_build_is_one_line_naming_it(tmp_path: Path, build: dict, field: str) -> None:
    (tmp_path / "bisect.yaml").write_text(yaml.safe_dump({
        "segment": "1m", "builds": [{"label": "b0", "target": {"kind": "simulator"}}, build]}))
    with pytest.raises(ConfigError) as caught:
        load_bisect(tmp_path / "bisect.yaml")
    assert field in str(caught.value) and "\n" not in str(caught.value)


def test_the_prior_from_history(tmp_path: Path) -> None:
    # b1's night ran clean, b2's hung: history leans on b2 as the first bad build
    for name, fixture, label in (("n1", "pass", "b1"), ("n2", "fail", "b2"), ("n3", "pass", "other")):
        shutil.copytree(FIXTURES / fixture, tmp_path / "runs" / name)
        config = yaml.safe_load((tmp_path / "runs" / name / "config.yaml").read_text())
        (tmp_path / "runs" / name / "config.yaml").write_text(yaml.safe_dump({**config, "build": label}))
    (tmp_path / "bisect.yaml").write_text(yaml.safe_dump({
        "segment": "1m", "prior": {"history": ["runs"]}, "rates": {"mtbf_min": "10s"},
        "builds": [{"label": f"b{i}", "target": {"kind": "simulator"}} for i in range(4)]}))
    prior = load_bisect(tmp_path / "bisect.yaml").model.prior
    assert max(range(4), key=lambda k: prior[k]) == 2 and abs(sum(prior) - 1) < 1e-9
    assert prior[0] < prior[2] and prior[3] < prior[2]


from hypothesis import given, settings
from hypothesis import strategies as st

_SIM = {"kind": "simulator"}


@settings(max_examples=100, deadline=None)
@given(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._+:@/-]{0,20}", fullmatch=True),
       st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True),
       st.sampled_from(["\n", "\r\n", "\t", " ", "\x1b[31m", "\x00"]))
def test_a_name_with_a_trailing_control_character_is_refused(label: str, env: str, tail: str) -> None:
    from pydantic import ValidationError

    from soak.bisect.spec import BuildSpec, SlurmExecutorSpec

    launched = {"kind": "launched", "command": "vllm serve m"}
    BuildSpec.model_validate({"label": label, "target": launched, "env": {env: "1"}})  # as given: accepted
    SlurmExecutorSpec.model_validate({"kind": "slurm", "partition": label[:64].replace("+", "").replace(":", "")
                                      .replace("@", "").replace("/", "") or "p"})
    for bad in ({"label": label + tail, "target": launched}, {"label": label, "target": launched, "env": {env + tail: "1"}}):
        with pytest.raises(ValidationError):
            BuildSpec.model_validate(bad)
    with pytest.raises(ValidationError):
        SlurmExecutorSpec.model_validate({"kind": "slurm", "partition": "gpu" + tail})


def test_an_all_zero_prior_is_named_at_prior(tmp_path: Path) -> None:
    sim = {"kind": "simulator"}
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({"segment": "5s", "prior": [0, 0, 0],
                                                      "builds": [{"label": f"b{i}", "target": sim} for i in range(3)]}))
    with pytest.raises(ConfigError, match=r"b\.yaml: prior: the prior needs 3 weights"):
        load_bisect(tmp_path / "b.yaml")
