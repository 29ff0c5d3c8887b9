"""Time is monotonic, with a real process: ``soak run`` under libfaketime, whose
wall clock the test steps by +1 h or -1 h in the middle of the load while the
monotonic clock runs on (FAKETIME_DONT_FAKE_MONOTONIC). Before the fix a 25 s
run read duration_s 3625 and an MTBF exposure of an hour, and a -1 h step gave
ended_at < started_at. The run's figures must equal the seconds that really
passed, the step must be an event the report shows, and ``soak history`` must
pool the real exposure.

The target is a ``soak sim --no-processes`` attached by URL and started without
libfaketime: with FAKETIME_DONT_FAKE_MONOTONIC, libfaketime 0.9.10 makes
``time.sleep`` (clock_nanosleep on CLOCK_MONOTONIC) fail with EINVAL, which the
simulator's worker processes would hit; the harness itself sleeps only in its
event loop."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from soakrun_helpers import events, small_config, soak_cmd, write_config

pytestmark = pytest.mark.timeout(240)

LIBS = ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1", "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1")
LIBFAKETIME = next((p for p in LIBS if os.path.exists(p)), None)
STEP_S = 3600.0


def faketime_env(stamp_file: Path) -> dict[str, str]:
    return dict(os.environ, LD_PRELOAD=str(LIBFAKETIME), FAKETIME_TIMESTAMP_FILE=str(stamp_file),
                FAKETIME_NO_CACHE="1", FAKETIME_DONT_FAKE_MONOTONIC="1", PYTHONUNBUFFERED="1")


@pytest.fixture(scope="module")
def faketime_steps(tmp_path_factory) -> None:
    """Skip, saying why, unless libfaketime steps a Python process's wall clock
    here while leaving its monotonic clock alone."""
    if LIBFAKETIME is None:
        pytest.skip("libfaketime is not installed (Debian package faketime; scripts/test installs it)")
    stamp = tmp_path_factory.mktemp("ft") / "stamp"
    stamp.write_text("+0\n")
    probe = ("import sys, time\n"
             "w0, m0 = time.time(), time.monotonic()\n"
             "print('ready', flush=True); sys.stdin.readline()\n"
             "print(time.time() - w0 - (time.monotonic() - m0))\n")
    proc = subprocess.Popen([sys.executable, "-c", probe], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=faketime_env(stamp))
    assert proc.stdout is not None and proc.stdin is not None
    proc.stdout.readline()
    stamp.write_text("+3600\n")
    out, _ = proc.communicate("\n", timeout=30)
    if proc.returncode != 0 or abs(float(out.strip().splitlines()[-1]) - 3600.0) > 5:
        pytest.skip(f"libfaketime does not step the wall clock apart from the monotonic one here ({out!r})")


@pytest.fixture
def sim_url(tmp_path):
    port_file = tmp_path / "sim.port"
    proc = subprocess.Popen(soak_cmd("sim", "--port", "0", "--port-file", str(port_file), "--no-processes",
                                     "--time-scale", "20"),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not port_file.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the simulator did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port_file.read_text().strip()}"
    proc.kill()
    proc.wait(timeout=10)


def run_with_a_step(tmp_path: Path, url: str, step: float, name: str) -> tuple[Path, subprocess.CompletedProcess, float]:
    config = small_config(duration="6s")
    config["target"] = {"kind": "attached", "base_url": url, "startup_timeout": "20s"}
    config["workload"] = {**config["workload"], "tokenizer": {"kind": "estimate"}}
    config["probes"] = {"gpu": {"kind": "none"}}
    stamp = tmp_path / f"{name}.stamp"
    stamp.write_text("+0\n")
    run_dir = tmp_path / "runs" / name
    proc = subprocess.Popen(soak_cmd("run", str(write_config(tmp_path / f"{name}.yaml", config)), "--out", str(run_dir),
                                     "--no-html"),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=faketime_env(stamp))
    began = time.monotonic()
    deadline = began + 120
    loaded_at = None
    while loaded_at is None:
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its load started"
        try:
            if any(e["type"] == "load_started" for e in events(run_dir)):
                loaded_at = time.monotonic()
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    time.sleep(2.0)
    stamp.write_text(f"{step:+.0f}\n")  # the wall clock jumps; CLOCK_MONOTONIC does not
    out, err = proc.communicate(timeout=120)
    real_s = time.monotonic() - began
    return run_dir, subprocess.CompletedProcess(proc.args, proc.returncode, out, err), real_s


@pytest.mark.parametrize("step", [STEP_S, -STEP_S], ids=["plus_1h", "minus_1h"])
def test_a_stepped_wall_clock_changes_no_figure(faketime_steps, sim_url, tmp_path, step) -> None:
    run_dir, done, real_s = run_with_a_step(tmp_path, sim_url, step, "stepped")
    assert done.returncode == 0, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    # 6 s of load and a drain: the seconds that passed, not an hour more or less
    assert 4.0 <= summary["duration_s"] <= min(real_s, 30.0)
    assert summary["started_at"] <= summary["ended_at"] <= summary["started_at"] + real_s
    tps = summary["throughput"]["generated_tokens_per_s"]
    assert tps is not None and tps > summary["tokens"]["generated"] / 30.0
    steps = [e for e in events(run_dir) if e["type"] == "wall_clock_step"]
    assert len(steps) == 1 and steps[0]["step_s"] == pytest.approx(step, abs=5.0)
    assert [s["step_s"] for s in summary["clock"]["wall_steps"]] == [steps[0]["step_s"]]
    # every label stays on the monotonic line: ts order is mono order, and no gap of an hour
    marks = [(e["mono"], e["ts"]) for e in events(run_dir)]
    assert all(abs((t1 - t0) - (m1 - m0)) < 1e-3 for (m0, t0), (m1, t1) in zip(marks, marks[1:]))
    requests = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert requests and all(r["ended_mono"] >= r["started_mono"] and r["ended_at"] >= r["started_at"] for r in requests)
    assert all(abs((r["ended_at"] - r["started_at"]) - (r["ended_mono"] - r["started_mono"])) < 1e-3 for r in requests)

    # the history of the night pools the loaded seconds, not the wall difference
    history_out = tmp_path / "history"
    done = subprocess.run(soak_cmd("history", str(tmp_path / "runs"), "--out", str(history_out)),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    runs = json.loads((history_out / "history.json").read_text())["runs"]
    assert len(runs) == 1 and runs[0]["exposure_s"] == pytest.approx(summary["duration_s"], abs=0.5)

    if step > 0:  # the report shows the step (rendering costs seconds: once)
        done = subprocess.run(soak_cmd("report", str(run_dir)), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        page = (run_dir / "report.html").read_text()
        assert re.search(r"wall clock stepped \+3[56]\d\d\.\d s", page), "the step is not in report.html"
