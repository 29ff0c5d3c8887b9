"""Rolled sample files (samples-NNN.jsonl.gz + the open samples.jsonl) read back
whole and once through every reader: summarize (soak report's summary), the
report's run reader, `soak history`, detector replay, and zcat/jq; also after SIGKILL mid-roll."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from soak.clock import ManualClock
from soak.store.rundir import read_samples
from soak.samples import ClientSample, GpuReading, GpuSample, GpuSource, HealthSample, RequestRecord, ServerSample
from soak.store.segments import RollingJsonlWriter, read_sample_records, sample_files
from soak.store.store import RunStore
from soak.judge import summarize

T0 = 1_764_000_000.0


def _samples(n: int):
    """n seconds of a healthy run: GPUs, metrics and health every second."""
    for i in range(n):
        ts = T0 + i
        yield GpuSample(ts=ts, source=GpuSource.SIM,
                        gpus=tuple(GpuReading(index=g, util_pct=80.0 + g, mem_used_mib=20000.0) for g in range(8)))
        yield ServerSample(ts=ts + 0.1, ok=True, values={
            "generation_tokens": 100.0 * i, "prompt_tokens": 1000.0 * i,
            "prefix_cache_queries": 1000.0 * i, "prefix_cache_hits": 900.0 * i,
            "num_requests_running": 12.0, "num_requests_waiting": 0.0, "kv_cache_usage_perc": 0.5})
        yield HealthSample(ts=ts + 0.2, ok=True, status=200)
        yield ClientSample(ts=ts + 0.3, in_flight=12, bytes_total=3000 * i, tokens_total=100 * i, requests_done=i)


@pytest.fixture
def rolled_run(tmp_path) -> Path:
    run_dir = tmp_path / "run"
    store = RunStore(run_dir, clock=ManualClock(T0), samples_segment_bytes=20_000)
    store.event("run_started", ts=T0, run_id="rolled", duration_s=600.0, warmup_s=0.0)
    store.event("load_started", ts=T0)
    for sample in _samples(600):
        store.on_sample(sample)
        if isinstance(sample, ClientSample) and sample.requests_done % 10 == 1:
            # The run did work: a pass needs finished requests with generated tokens.
            t = sample.ts
            store.on_request(RequestRecord(request_id=f"r{t}", session=None, turn=None, started_at=t - 1.0,
                                           ended_at=t, outcome="ok", output_tokens=100, ttft_s=0.2))
    store.event("load_stopped", ts=T0 + 600)
    store.event("run_ended", ts=T0 + 601, verdict="pass", reason="duration", exit_code=0)
    store.close()
    return run_dir


def test_the_sample_file_rolls_into_gzip_segments_and_keeps_an_open_plain_tail(rolled_run):
    files = sample_files(rolled_run)
    assert len(files) > 10
    assert all(f.name.endswith(".jsonl.gz") for f in files[:-1])
    assert files[-1].name == "samples.jsonl"
    assert not list(rolled_run.glob("samples-*.jsonl"))  # every closed segment compressed
    total = sum(f.stat().st_size for f in files)
    plain = sum(len(json.dumps(s).encode()) for s in read_sample_records(rolled_run))
    assert total < plain / 4  # the point: a long run's directory stays small


def test_every_sample_reads_back_once_in_order(rolled_run):
    records = list(read_sample_records(rolled_run))
    assert len(records) == 4 * 600
    stamps = [r["ts"] for r in records]
    assert stamps == sorted(stamps)
    assert [r["ts"] for r in read_sample_records(rolled_run, kinds={"gpu"})] == [T0 + i for i in range(600)]


def test_summarize_reads_the_server_counters_across_segments(rolled_run):
    summary = summarize(rolled_run)
    assert summary["records"]["samples"] == 4 * 600
    assert summary["server_tokens"]["generated"] == pytest.approx(100.0 * 599)
    assert summary["prefix_cache_hit_ratio"] == pytest.approx(0.9)


def test_detector_replay_reads_a_rolled_run_directory(rolled_run):
    samples = list(read_samples(rolled_run))
    assert len(samples) == 4 * 600
    assert isinstance(samples[0], GpuSample) and samples[0].gpus[7].util_pct == 87.0
    assert samples[-1].ts == T0 + 599.3


def test_soak_report_renders_a_rolled_run(rolled_run):
    pytest.importorskip("matplotlib")
    from soak.report.rundir import load_run

    run = load_run(rolled_run)
    assert run.gpu_util.shape == (600, 8)
    assert run.server_ts.size == 600 and run.client_ts.size == 600
    assert run.bad_lines == {}
    done = subprocess.run([sys.executable, "-m", "soak", "report", str(rolled_run)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "pass" in done.stdout
    page = (rolled_run / "report.html").read_text()
    assert "GPU utilization" in page and "unreadable" not in page


def test_soak_history_reads_a_rolled_run_cut_off_before_its_summary(rolled_run, tmp_path):
    """A night whose harness died (no summary.json) is summarized from its
    segments: history counts its whole exposure and its server-side hit ratio."""
    pytest.importorskip("matplotlib")
    assert not (rolled_run / "summary.json").exists()
    runs = tmp_path / "nights"
    shutil.copytree(rolled_run, runs / "night-1")
    done = subprocess.run([sys.executable, "-m", "soak", "history", str(runs)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (night,) = json.loads((runs / "history.json").read_text())["runs"]
    assert night["figures"]["prefix_hit_ratio"] == pytest.approx(0.9)
    assert sum(i["length_s"] for i in night["intervals"]) == pytest.approx(600.0)


@pytest.mark.skipif(not (shutil.which("zcat") and shutil.which("jq")), reason="zcat and jq not installed")
def test_zcat_and_jq_read_the_segments(rolled_run):
    files = [str(f) for f in sample_files(rolled_run)]
    out = subprocess.run(f"zcat -f {' '.join(files)} | jq -c 'select(.kind==\"gpu\") | .ts' | wc -l",
                         shell=True, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "600"


def test_a_harness_killed_mid_roll_loses_or_repeats_nothing(tmp_path):
    """The states a SIGKILL can leave between the roll's steps each read every line once."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines = [json.dumps({"kind": "health", "ts": T0 + i, "ok": True}) + "\n" for i in range(30)]
    # segment 0 done; segment 1 compressed but its plain copy not yet removed;
    # segment 2 renamed but not compressed (a .tmp half-written); then the open tail, torn.
    with gzip.open(run_dir / "samples-000.jsonl.gz", "wt") as fh:
        fh.writelines(lines[0:10])
    with gzip.open(run_dir / "samples-001.jsonl.gz", "wt") as fh:
        fh.writelines(lines[10:20])
    (run_dir / "samples-001.jsonl").write_text("".join(lines[10:20]))
    (run_dir / "samples-002.jsonl").write_text("".join(lines[20:25]))
    (run_dir / "samples-002.jsonl.gz.tmp").write_bytes(b"\x1f\x8b half")
    (run_dir / "samples.jsonl").write_text("".join(lines[25:30]) + '{"kind": "health", "ts"')
    stats: dict[str, int] = {}
    assert [r["ts"] for r in read_sample_records(run_dir, stats=stats)] == [T0 + i for i in range(30)]
    assert stats == {"torn_lines": 1}
    assert [s.ts for s in read_samples(run_dir)] == [T0 + i for i in range(30)]
    # a new writer in the same directory continues the numbering
    writer = RollingJsonlWriter(run_dir, segment_bytes=1)
    writer.write({"kind": "health", "ts": T0 + 99, "ok": True})
    writer.close()
    assert (run_dir / "samples-003.jsonl.gz").exists()


WRITER = """
import sys, time
from pathlib import Path
from soak.store.segments import RollingJsonlWriter
w = RollingJsonlWriter(Path(sys.argv[1]), segment_bytes=3000)
i = 0
while True:
    w.write({"kind": "health", "ts": float(i), "ok": True, "status": 200, "error": "x" * 40})
    i += 1
    if i % 200 == 0:
        time.sleep(0.001)
"""


def test_sigkill_while_writing_and_rolling_leaves_a_contiguous_record(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(run_dir)])
    deadline = time.monotonic() + 60
    while len(list(run_dir.glob("samples-*.jsonl.gz"))) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    stamps = [r["ts"] for r in read_sample_records(run_dir)]
    # five closed segments of at least 3000 bytes each, a record being 80-100 bytes
    assert len(stamps) >= 5 * 3000 // 100
    assert stamps == [float(i) for i in range(len(stamps))]


def test_a_long_run_is_read_for_the_report_at_a_bounded_number_of_points(rolled_run, monkeypatch):
    """The timelines are binned anyway: a day of samples is read at a bounded
    number of points per series, still spanning the whole run; the summary's
    counters still come from every server sample."""
    pytest.importorskip("numpy")
    from soak.report import rundir

    monkeypatch.setattr(rundir, "MAX_TIMELINE_POINTS", 100)
    run = rundir.load_run(rolled_run)
    for ts in (run.gpu_ts, run.server_ts, run.client_ts):
        assert 60 <= ts.size <= 101
        assert ts[0] < T0 + 1 and ts[-1] > T0 + 590
    assert run.summary.server_tokens.generated == pytest.approx(100.0 * 599)
    assert run.summary.records["samples"] == 4 * 600


def test_the_last_redaction_pass_reaches_inside_rolled_segments(tmp_path):
    """A secret learned after its segment was gzipped is still scrubbed at the end."""
    from soak.redact import Redactor

    run_dir = tmp_path / "run"
    writer = RollingJsonlWriter(run_dir.mkdir() or run_dir, segment_bytes=200)
    for i in range(20):
        writer.write({"kind": "log", "ts": T0 + i, "signature": "x", "line": f"token sk-live-0123456789 line {i}"})
    writer.close()
    redactor = Redactor()
    redactor.learn("sk-live-0123456789")
    redactor.scrub_tree(run_dir)
    assert list(run_dir.glob("samples-*.jsonl.gz"))
    lines = [r["line"] for r in read_sample_records(run_dir)]
    assert len(lines) == 20 and not any("sk-live" in line for line in lines)
