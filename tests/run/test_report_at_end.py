"""The report at a run's end renders in a child process: a report that raises or
hangs never changes the run's exit status or its record, and the run still
renders report.html by default."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from soakrun_helpers import read_lines, small_config, soak_cmd, write_config

from soak.config import load_run_config
from soak.report.child import ReportChild
from soak.run.wiring import build_soak_run

RAISES = [sys.executable, "-c", "import sys; sys.stdin.readline(); raise RuntimeError('renderer exploded')"]
HANGS = [sys.executable, "-c", "import sys, time; sys.stdin.readline(); time.sleep(120)"]


def _run(tmp_path: Path, **report) -> tuple[int, Path]:
    config_path = write_config(tmp_path / "run.yaml", small_config(duration="2s"))
    run_dir = tmp_path / "run"
    soak_run = build_soak_run(load_run_config(config_path), config_path=config_path, out=run_dir,
                              view_mode="off", **report)
    outcome = asyncio.run(soak_run.run())
    return outcome.exit_code, run_dir


def _event(run_dir: Path, type: str) -> dict | None:
    return next((e for e in read_lines(run_dir / "events.jsonl") if e["type"] == type), None)


def test_a_report_that_raises_does_not_change_the_exit_status(tmp_path) -> None:
    code, run_dir = _run(tmp_path, report_command=RAISES)
    assert code == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "pass" and summary["exit_code"] == 0
    failed = _event(run_dir, "report_failed")
    assert failed is not None and "RuntimeError: renderer exploded" in failed["error"]
    assert failed["returncode"] == 1
    assert not (run_dir / "report.html").exists()


def test_a_report_that_hangs_is_stopped_and_the_run_ends(tmp_path) -> None:
    started = time.monotonic()
    code, run_dir = _run(tmp_path, report_command=HANGS, report_timeout_s=1.0)
    assert code == 0
    assert time.monotonic() - started < 60
    failed = _event(run_dir, "report_failed")
    assert failed is not None and "longer than 1 s" in failed["error"]


def test_the_default_child_renders_the_report(tmp_path) -> None:
    code, run_dir = _run(tmp_path)
    assert code == 0
    assert _event(run_dir, "report_written") is not None
    assert (run_dir / "report.html").exists() and (run_dir / "junit.xml").exists()
    assert "PASS" in (run_dir / "report.html").read_text().upper()


def test_no_html_ends_with_the_summary_and_junit_and_soak_report_draws_the_page_later(tmp_path, harness) -> None:
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "run.yaml", small_config(duration="2s")), run_dir)  # --no-html
    assert h.wait() == 0, h.stderr
    assert json.loads((run_dir / "summary.json").read_text())["verdict"] == "pass"
    suite = (run_dir / "junit.xml").read_text()
    assert "<testsuite" in suite and "verdict pass" in suite
    assert not (run_dir / "report.html").exists()
    assert _event(run_dir, "report_written")["files"] == ["junit.xml"]

    later = subprocess.run(soak_cmd("report", str(run_dir)), capture_output=True, text=True, timeout=120)
    assert later.returncode == 0, later.stderr
    assert "PASS" in (run_dir / "report.html").read_text().upper()


def test_the_child_writes_nothing_when_the_harness_goes_away(tmp_path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text('{"ts": 1.0, "type": "run_started"}\n')

    async def go() -> int | None:
        child = ReportChild(run_dir)
        await child.start()
        proc = child._proc
        assert proc is not None and proc.stdin is not None
        proc.stdin.close()  # as when the harness dies: EOF, no "render"
        return await asyncio.wait_for(proc.wait(), 120)

    assert asyncio.run(go()) == 0
    assert not (run_dir / "report.html").exists()
