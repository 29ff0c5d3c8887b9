"""Bad workload files: one line naming the file and the field or line, exit 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from soak.cli import main as soak_main
from soak.config import load_run_config
from soak.errors import ConfigError
from soak.workload import build_workload

GOOD_ROW = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}'

# name -> (run config text, {extra file: text}, what the line must name)
CASES = {
    "unknown_kind": ("workload: {kind: agentic_sessions}\n", {}, ["unknown kind agentic_sessions, known: synthetic_agentic, replay_jsonl, mooncake_trace"]),
    "negative_size": ("workload:\n  tool_result_tokens: {dist: constant, value: -5}\n", {}, ["tool_result_tokens", "value"]),
    "min_above_max": ("workload:\n  min_context_tokens: 230000\n  max_context_tokens: 190000\n", {}, ["max_context_tokens"]),
    "uniform_low_above_high": ("workload:\n  tool_call_tokens: {dist: uniform, low: 90, high: 10}\n", {}, ["tool_call_tokens", "high"]),
    "unknown_dist": ("workload:\n  think_time_s: {dist: normal, mean: 2}\n", {}, ["think_time_s", "unknown dist normal, known: constant, uniform, lognormal"]),
    "start_outside_context": ("workload:\n  start_context_tokens: {dist: uniform, low: 100000, high: 200000}\n", {}, ["start_context_tokens"]),
    "unknown_key": ("workload:\n  sessionz: 4\n", {}, ["sessionz", "unknown key"]),
    "missing_corpus_dir": ("workload:\n  corpus: {kind: directory, path: no-such-dir}\n", {}, ["workload.corpus.path", "no-such-dir"]),
    "missing_corpus_file": ("workload:\n  corpus: {kind: files, paths: [gone.py]}\n", {}, ["workload.corpus.paths[0]", "gone.py"]),
    "malformed_jsonl_line_3": (
        "workload: {kind: replay_jsonl, path: requests.jsonl}\n",
        {"requests.jsonl": '{"messages": [{"role": "user", "content": "hi"}]}\n{"prompt": "ok"}\n{"messages": [\n'},
        ["requests.jsonl:3:", "invalid JSON"],
    ),
    "request_without_messages_line_2": (
        "workload: {kind: replay_jsonl, path: requests.jsonl}\n",
        {"requests.jsonl": '{"prompt": "fine"}\n{"model": "x", "temperature": 0}\n'},
        ["requests.jsonl:2:", "messages"],
    ),
    "row_without_hash_ids_line_2": (
        "workload: {kind: mooncake_trace, path: trace.jsonl}\n",
        {"trace.jsonl": GOOD_ROW + '\n{"timestamp": 5, "input_length": 600, "output_length": 5}\n'},
        ["trace.jsonl:2:", "hash_ids"],
    ),
    "hash_ids_do_not_cover_length": (
        "workload: {kind: mooncake_trace, path: trace.jsonl}\n",
        {"trace.jsonl": '{"timestamp": 0, "input_length": 2000, "output_length": 5, "hash_ids": [1]}\n'},
        ["trace.jsonl:1:", "hash_ids"],
    ),
    "workload_file_missing": ("workload: elsewhere/agentic.yaml\n", {}, ["run.yaml: workload: ", "no such workload or trace file", "agentic.yaml"]),
    "workload_file_bad_kind": ("workload: w.yaml\n", {"w.yaml": "kind: mooncake\npath: t.jsonl\n"}, ["w.yaml", "unknown kind mooncake"]),
}


def _write_case(tmp_path: Path, name: str) -> tuple[Path, list[str]]:
    text, extra, expected = CASES[name]
    directory = tmp_path / name
    directory.mkdir()
    for filename, content in extra.items():
        (directory / filename).write_text(content)
    config = directory / "run.yaml"
    config.write_text(text)
    return config, expected


def _load_and_build(config_path: Path) -> None:
    config = load_run_config(config_path)
    build_workload(config.workload, base_dir=config_path.parent, seed=0, model="m", config_path=config_path)


def test_there_are_at_least_ten_cases():
    assert len(CASES) >= 10


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_workload_is_one_line_naming_file_and_field_or_line(tmp_path, name):
    config_path, expected = _write_case(tmp_path, name)
    with pytest.raises(ConfigError) as info:
        _load_and_build(config_path)
    line = str(info.value)
    assert "\n" not in line
    assert info.value.path and Path(info.value.path).name in line
    assert info.value.field or info.value.line
    for fragment in expected:
        assert fragment in line, line


def test_soak_validate_exits_2_with_one_line(tmp_path, capsys):
    # The CLI's own entry point in this process for every case (a new interpreter
    # per case cost a second of CPU each), and one case as a real process.
    first = sorted(CASES)[0]
    for name in sorted(CASES):
        config_path, expected = _write_case(tmp_path, name)
        if name == first:
            done = subprocess.run(
                [sys.executable, "-m", "soak", "validate", str(config_path)], capture_output=True, text=True, timeout=120
            )
            code, stderr = done.returncode, done.stderr
        else:
            code = soak_main(["validate", str(config_path)])
            stderr = capsys.readouterr().err
        assert code == 2, (name, stderr)
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in stderr, (name, stderr)
        for fragment in expected:
            assert fragment in lines[0], (name, lines[0])


@pytest.mark.parametrize("name", ["agentic-pp8.yaml", "demo.yaml", "demo-deadlock.yaml", "mooncake-sample.yaml"])
def test_shipped_workloads_validate_and_print_their_plan(name):
    workloads = Path(__file__).resolve().parents[2] / "workloads"
    done = subprocess.run(
        [sys.executable, "-m", "soak", "validate", str(workloads / name)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "expected prefix-cache hit ratio" in done.stdout and "exact (simulator tokenizer)" in done.stdout
