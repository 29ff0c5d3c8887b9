"""``soak compare`` on runs that are not the same experiment: it names what
differs (target, workload, model, layout, build), gives no verdict across a
target, workload, model or layout unless ``--force``, and ``--fail-on worse``
makes its finding an exit status (1 worse, 3 not compared).

The runs are the report generator's synthetic run directories (a baseline, and a
candidate 30% slower, so a verdict is there to withhold), with config.yaml and
the ``run_started``/``build`` events rewritten to record the setup each test needs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soak.report.compare import compare_pair
from soak.report.identity import Aspect, launch_program
from soak.report.rundir import load_run
from soak.report.stats import Change

VERDICTS = {Change.WORSE, Change.BETTER}


@dataclass(frozen=True)
class Setup:
    """What a run records about itself; each field one fact a test can change."""

    target: dict[str, Any] = field(default_factory=lambda: {"kind": "attached", "base_url": "http://10.0.0.1:8000"})
    model: str = "DeepSeek-V4-Flash-0731"
    pp: int = 8
    tp: int = 1
    concurrency: int = 12
    output_median: int = 64
    label: str = "nightly"
    vllm_version: str = "0.11.2"


def record(run: Path, setup: Setup) -> Path:
    """config.yaml, and the run_started and build events, as a run of ``setup`` writes them."""
    target = {**setup.target, "model": setup.model, "pp_size": setup.pp, "tp_size": setup.tp}
    if target["kind"] == "simulator":
        target = {"kind": "simulator", "sim": {"model": setup.model, "pp_size": setup.pp, "time_scale": 1.0},
                  "tp_size": setup.tp}
    config = {"name": run.name, "duration": 600.0, "seed": 7, "build": setup.label, "target": target,
              "workload": {"kind": "synthetic_agentic", "min_context_tokens": 190000, "max_context_tokens": 230000,
                           "output_tokens": {"dist": "lognormal", "median": setup.output_median, "sigma": 0.5}},
              "load": {"mode": "closed", "concurrency": setup.concurrency, "rate": None, "drain": 30.0}}
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    events = [json.loads(line) for line in (run / "events.jsonl").read_text(encoding="utf-8").splitlines()]
    events = [e for e in events if e["type"] != "build"]
    for e in events:
        if e["type"] == "run_started":
            e.update(model=setup.model, target=setup.target["kind"])
    ready = next(i for i, e in enumerate(events) if e["type"] == "target_ready")
    events.insert(ready + 1, {"ts": events[ready]["ts"], "type": "build", "label": setup.label,
                              "vllm_version": setup.vllm_version, "launch_digest": "43de5c1f55c1",
                              "model": setup.model, "build": setup.label})
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory, generator):
    """The baseline, the candidate (30% slower) and a rerun of the baseline, as written: record() sets them up."""
    root = tmp_path_factory.mktemp("comparable")
    common = dict(duration_s=600.0, gpu_period=5.0, metrics_period=2.0, client_period=2.0, request_period=3.0)
    return (generator.write_run(root / "baseline", kind="pass", seed=11, gen_rate=100.0, **common),
            generator.write_run(root / "capped", kind="pass", seed=12, gen_rate=70.0, **common),
            generator.write_run(root / "rerun", kind="pass", seed=13, gen_rate=100.0, **common))


@pytest.fixture
def pair(runs, tmp_path):
    """pair(setup_b, setup_a=Setup(), candidate="capped") -> (A, B): private copies, recorded."""

    def make(setup_b: Setup, setup_a: Setup = Setup(), candidate: str = "capped") -> tuple[Path, Path]:
        source = {"capped": runs[1], "rerun": runs[2]}[candidate]
        a = record(_copy(runs[0], tmp_path / "baseline"), setup_a)
        b = record(_copy(source, tmp_path / candidate), setup_b)
        return a, b

    return make


def _copy(src: Path, dest: Path) -> Path:
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src, dest)
    return dest


def _soak(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "soak", *args], capture_output=True, text=True, timeout=120)


def _no_verdict_words(text: str) -> None:
    for word in ("worse", "better", "no significant difference", "p-value"):
        assert word not in text.replace("--fail-on worse", "")


def test_runs_of_another_model_and_layout_are_named_and_not_judged(pair):
    a, b = pair(Setup(model="Qwen3-235B", pp=4))
    done = _soak("compare", str(a), str(b))
    assert done.returncode == 0, done.stderr  # without --fail-on compare only reports, as before
    lines = done.stdout.splitlines()
    assert "differs: model DeepSeek-V4-Flash-0731 vs Qwen3-235B" in lines
    assert "differs: layout pipeline parallel 8 vs 4" in lines
    assert lines[-1] == "not compared: the runs differ in model, layout; --force compares them anyway"
    _no_verdict_words(done.stdout)
    assert "throughput" not in done.stdout and "intervals" not in done.stdout


def test_fail_on_worse_exits_3_when_the_runs_were_not_compared(pair):
    a, b = pair(Setup(model="Qwen3-235B"))
    done = _soak("compare", str(a), str(b), "--fail-on", "worse")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "not compared: the runs differ in model;" in done.stdout and done.stderr == ""


def test_force_judges_them_anyway_and_says_so(pair):
    a, b = pair(Setup(model="Qwen3-235B", pp=4))
    done = _soak("compare", str(a), str(b), "--force", "--fail-on", "worse")
    assert done.returncode == 1, done.stdout + done.stderr  # the candidate is 30% slower
    assert "differs: model DeepSeek-V4-Flash-0731 vs Qwen3-235B" in done.stdout
    assert "compared anyway (--force): the runs differ in model, layout;" in done.stdout
    tput = next(line for line in done.stdout.splitlines() if line.startswith("throughput"))
    assert tput.endswith("worse")


def test_another_build_is_named_and_judged_and_fail_on_worse_exits_1(pair):
    # Two builds on one setup are what an A/B is for.
    a, b = pair(Setup(label="fix-cap-inflight", vllm_version="0.11.3"))
    done = _soak("compare", str(a), str(b), "--fail-on", "worse")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["differs: build label nightly vs fix-cap-inflight",
                         "differs: build vllm_version 0.11.2 vs 0.11.3"]
    assert "not compared" not in done.stdout and "--force" not in done.stdout
    assert next(line for line in lines if line.startswith("throughput")).endswith("worse")


def test_fail_on_worse_exits_0_when_nothing_is_worse(pair):
    a, b = pair(Setup(), candidate="rerun")
    done = _soak("compare", str(a), str(b), "--fail-on", "worse")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not done.stdout.startswith(("differs", "unknown"))  # the same setup: the table alone
    assert " worse" not in done.stdout


def test_json_output_carries_the_differences_and_no_rows(pair):
    a, b = pair(Setup(concurrency=4, target={"kind": "attached", "base_url": "http://user:pw@10.0.0.2:8000/?k=v"}))
    done = _soak("compare", str(a), str(b), "--json", "--fail-on", "worse")
    assert done.returncode == 3, done.stderr
    doc = json.loads(done.stdout)
    assert doc["compared"] is False and doc["rows"] == [] and doc["worse"] is False
    assert doc["incomparable"] == ["target", "workload"]
    assert doc["not_compared"] == "not compared: the runs differ in target, workload; --force compares them anyway"
    lines = [d["line"] for d in doc["differences"]]
    assert lines == ["differs: target base_url http://10.0.0.1:8000 vs http://10.0.0.2:8000",
                     "differs: workload load.concurrency 12 vs 4"]
    assert "pw" not in done.stdout  # an address is named without its userinfo or query
    assert doc["identity"]["b"]["layout"] == {"pipeline parallel": "8", "tensor parallel": "1", "GPUs": "8"}
    assert doc["identity"]["a"]["workload"]["digest"] != doc["identity"]["b"]["workload"]["digest"]


def test_another_kind_of_target_and_launch_program_are_named(pair):
    launched = {"kind": "launched", "base_url": "http://10.0.0.1:8000",
                "command": ["/opt/venvs/fix/bin/python3.12", "-m", "sglang.launch_server", "--model-path", "m"]}
    a, b = pair(Setup(target=launched), setup_a=Setup(target={**launched, "command": [
        "/opt/venvs/base/bin/vllm", "serve", "m", "--max-num-seqs", "12"]}))
    done = _soak("compare", str(a), str(b))
    assert "differs: target command vllm serve vs python -m sglang.launch_server" in done.stdout.splitlines()
    b2 = record(b, Setup(target={"kind": "simulator"}))
    done = _soak("compare", str(a), str(b2))
    assert "differs: target kind launched vs simulator" in done.stdout.splitlines()
    assert "not compared: the runs differ in target;" in done.stdout


def test_the_same_server_program_from_another_install_is_one_target():
    # Which venv's vllm, the model and the flags are the build's, model's and layout's facts.
    assert launch_program(["/opt/a/bin/vllm", "serve", "Qwen/Qwen3", "-pp", "8"]) == "vllm serve"
    assert launch_program(["vllm", "serve", "--model", "x"]) == "vllm serve"
    assert launch_program(["env", "A=1", "python3.11", "-u", "-m", "vllm.entrypoints.openai.api_server",
                           "--model", "x"]) == "env python -m vllm.entrypoints.openai.api_server"
    assert launch_program(["python", "-X", "dev", "-m", "sglang.launch_server"]) == "python -m sglang.launch_server"


def test_a_workload_of_another_shape_is_named_by_its_fields(pair):
    a, b = pair(Setup(output_median=256))
    done = _soak("compare", str(a), str(b))
    assert "differs: workload output_tokens.median 64 vs 256" in done.stdout.splitlines()
    assert "not compared: the runs differ in workload;" in done.stdout


def test_a_fact_only_one_run_records_is_unknown_not_a_difference(pair):
    a, b = pair(Setup())
    (b / "config.yaml").unlink()  # an old or partial run: plan.json and the events remain
    done = _soak("compare", str(a), str(b), "--fail-on", "worse")
    assert done.returncode == 1, done.stdout + done.stderr  # judged: the candidate is slower
    assert "unknown: layout pipeline parallel 8 vs not recorded" in done.stdout.splitlines()
    assert "differs:" not in done.stdout.replace("differs: build", "")


@pytest.mark.parametrize("file, damage, line", [
    ("config.yaml", lambda t: t.replace("pp_size: 8", "pp_size: eight"),
     "config.yaml: target.pp_size: must be a whole number of at least 1, got 'eight'"),
    ("config.yaml", lambda t: t.replace("workload:", "workload: [1, 2]\nx:"),
     "config.yaml: workload: must be a mapping, got a list"),
    ("config.yaml", lambda t: "\x00\xff: [" + t, "config.yaml: cannot be read"),
    ("events.jsonl", lambda t: t.replace('"label": "nightly"', '"label": ["nightly"]'),
     "events.jsonl: build.label: must be a single value, got a list"),
])
def test_a_recorded_fact_of_the_wrong_type_is_one_line_naming_file_and_field_exit_2(pair, file, damage, line):
    a, b = pair(Setup())
    path = b / file
    path.write_text(damage(path.read_text(encoding="utf-8")), encoding="utf-8")
    done = _soak("compare", str(a), str(b))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert str(b / line) in done.stderr, done.stderr


def test_fail_on_takes_worse_only_and_help_gives_the_exit_status(runs):
    done = _soak("compare", str(runs[0]), str(runs[0]), "--fail-on", "regression")
    assert done.returncode == 2 and "--fail-on" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    text = _soak("compare", "--help").stdout
    assert "exit status:" in text and "--fail-on" in text and "--force" in text
    for code in ("0  compared", "1  --fail-on worse", "2  bad arguments", "3  --fail-on given"):
        assert code in text


# -- the invariant ------------------------------------------------------------------------

# For each aspect, setups that differ from Setup() in it alone.
CHANGES: dict[Aspect, list[dict[str, Any]]] = {
    Aspect.TARGET: [{"target": {"kind": "attached", "base_url": "http://10.0.0.9:8000"}},
                    {"target": {"kind": "simulator"}},
                    {"target": {"kind": "launched", "base_url": "http://10.0.0.1:8000",
                                "command": ["python", "-m", "sglang.launch_server"]}}],
    Aspect.WORKLOAD: [{"concurrency": 4}, {"output_median": 512}],
    Aspect.MODEL: [{"model": "Qwen3-235B"}, {"model": "deepseek-v4-flash"}],
    Aspect.LAYOUT: [{"pp": 4}, {"tp": 2}, {"pp": 2, "tp": 4}],
    Aspect.BUILD: [{"label": "fix"}, {"vllm_version": "0.12.0"}],
}


@pytest.fixture(scope="module")
def baseline(runs, tmp_path_factory):
    return load_run(record(_copy(runs[0], tmp_path_factory.mktemp("prop") / "baseline"), Setup()))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(changed=st.sets(st.sampled_from(list(Aspect))), pick=st.randoms(use_true_random=False), force=st.booleans())
def test_no_verdict_across_target_workload_model_or_layout_unless_forced(runs, baseline, changed, pick, force):
    setup = Setup()
    for aspect in sorted(changed, key=list(Aspect).index):
        setup = replace(setup, **pick.choice(CHANGES[aspect]))
    with tempfile.TemporaryDirectory() as tmp:
        b = load_run(record(_copy(runs[1], Path(tmp) / "capped"), setup))
        result = compare_pair(baseline, b, a_name="a", b_name="b", force=force, resamples=20)
    blocking = changed - {Aspect.BUILD}
    # Each aspect changed is named, and only those.
    assert {m.aspect for m in result.differences if m.known} == changed
    assert set(result.incomparable) == blocking
    verdicts = [row.verdict for row in result.rows if row.verdict in VERDICTS]
    if blocking and not force:
        assert not result.compared and result.rows == () and not result.worse()
        assert result.not_compared().startswith("not compared: the runs differ in ")
    else:
        # Judged: the 30% slower candidate is worse, so the property above is not empty.
        assert result.compared and Change.WORSE in verdicts and result.worse()
