"""``soak validate --explain KEY``: one key's reference entry, no config needed; an
unknown key is one line naming close matches, exit 2 (real subprocesses, and the
dispatcher in-process for the properties)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soak.cli import main as soak_main
from soak.configref import entries

ENTRIES = entries()


def _soak(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "soak", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("key, needles", [
    ("target.model", ["target.attached.model", "target.launched.model", "the first one /v1/models lists"]),
    ("oracle.tie_margin", ["nats", "default:  0.2", "example:  {oracle: {tie_margin:"]),
    ("workload.synthetic_agentic.max_context_tokens", ["integer", "230000", "tokens"]),
    ("workload.max_context_tokens", ["workload.synthetic_agentic.max_context_tokens"]),  # as the YAML says it
    ("target.sim.faults[0].at", ["target.simulator.sim.faults[].pp_deadlock.at", "duration"]),
    ("thresholds.ttft_p99.window", ["thresholds.<metric>.window", "duration"]),
    ("load.timeouts.stall", ["duration > 0", "3m"]),
])
def test_explain_prints_the_entry(key, needles):
    done = _soak("validate", "--explain", key)
    assert done.returncode == 0, done.stderr
    for needle in needles:
        assert needle in done.stdout, done.stdout


def test_an_unknown_key_is_one_line_with_close_matches_and_exit_2():
    done = _soak("validate", "--explain", "load.concurency")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().count("\n") == 0 and "did you mean load.concurrency" in done.stderr


def test_without_config_or_explain_is_one_line_and_exit_2():
    done = _soak("validate")
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "--explain" in done.stderr


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entry=st.sampled_from(ENTRIES))
def test_every_key_explains_with_its_type_default_and_an_example(entry, capsys):
    capsys.readouterr()  # each example reads only its own output
    assert soak_main(["validate", "--explain", entry.yaml_key]) == 0
    out = capsys.readouterr().out
    assert entry.key in out and f"type:     {entry.type}" in out and f"example:  {entry.example}" in out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entry=st.sampled_from(ENTRIES), where=st.integers(min_value=0, max_value=200),
       letter=st.sampled_from("qxzj"))
def test_a_misspelt_key_names_close_matches(entry, where, letter, capsys):
    last = entry.yaml_key.rsplit(".", 1)
    head, leaf = (last[0] + ".", last[1]) if len(last) == 2 else ("", last[0])
    i = where % len(leaf)
    wrong = head + leaf[:i] + letter + leaf[i + 1:]
    known = {e.key for e in ENTRIES} | {e.yaml_key for e in ENTRIES}
    if wrong in known or leaf[i] == letter:
        return
    capsys.readouterr()
    code = soak_main(["validate", "--explain", wrong])
    captured = capsys.readouterr()
    if code == 0:  # a section's path (the key's parent) or a metric's name: explained, not refused
        return
    assert code == 2 and captured.out == ""
    line = captured.err.strip()
    assert "\n" not in line and "did you mean" in line, line
