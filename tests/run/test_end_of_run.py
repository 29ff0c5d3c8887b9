"""`soak run` against the simulator prints the end-of-run block: a run that
breaches a threshold (exit 99) says the breach with its observed value and the
report path; a clean run lists every threshold that held. The block is on
stderr in every view mode; stdout (not a terminal) carries no colour."""

from __future__ import annotations

import json
import re

from soakrun_helpers import small_config, write_config


def test_a_breached_threshold_ends_with_exit_99_its_observed_value_and_the_report(tmp_path, harness) -> None:
    config = small_config(duration="4s", build="nightly-abc",
                          thresholds={"ttft_p99": {"threshold": ["< 1us"]}, "error_rate": {"threshold": ["< 50%"]}})
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "breach.yaml", config), run_dir, html=True)
    assert h.wait() == 99, h.stderr
    assert "Traceback" not in h.stderr and "\x1b" not in h.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    observed = summary["thresholds"]["results"][0]["observed"]
    assert observed > 1e-6
    # summary.json says why: the breach with its observed value (it was [] on an exit-99 run)
    (reason,) = summary["verdict_reasons"]
    assert re.fullmatch(r"ttft_p99 [0-9.]+ (ms|us|s) > (0\.001 ms|1 us)", reason), reason
    block = h.stderr
    assert "verdict     FAIL, exit 99 (a threshold breached)" in block
    assert f"why         {reason}" in block
    assert re.search(r"✗ ttft_p99 < 1us +observed [0-9.]+ (ms|us|s)", block)
    assert re.search(r"✓ error_rate < 50% +observed 0%", block)
    assert "stopped     duration" in block  # why the load stopped, not why the run failed
    assert f"report      {run_dir}/report.html" in block and (run_dir / "report.html").exists()
    assert "build nightly-abc" in block and "MTBF        no hang in" in block
    assert re.search(r"  TTFT +[0-9.]+ (ms|us|s)", block)
    assert block.rstrip().splitlines()[-1] == f"soak run: fail ({reason}); {run_dir}/report.html"
    stdout = h.stdout_path.read_text()
    assert stdout.splitlines()[0].startswith("soak: run ") and "(build nightly-abc)" in stdout.splitlines()[0]
    assert "left" not in stdout.splitlines()[-1]  # the last status line, after the load stopped


def test_a_clean_run_lists_every_threshold_that_held(tmp_path, harness) -> None:
    config = small_config(duration="3s", view={"mode": "off"},
                          thresholds={"ttft_p99": {"threshold": ["< 90s"]}, "error_rate": {"threshold": ["< 50%"]}})
    run_dir = tmp_path / "run"
    h = harness(write_config(tmp_path / "clean.yaml", config), run_dir)
    assert h.wait() == 0, h.stderr
    block = h.stderr
    assert "verdict     PASS, exit 0" in block and "why " not in block
    assert "thresholds  2 of 2 held" in block
    assert re.search(r"✓ ttft_p99 < 90s +observed [0-9.]+ (ms|us|s)", block)
    assert re.search(r"✓ error_rate < 50% +observed 0%", block)
    assert block.rstrip().splitlines()[-1] == f"soak run: pass; {run_dir}/summary.json"  # --no-html: no page
