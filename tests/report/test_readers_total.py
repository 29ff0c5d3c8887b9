"""Readers are total: every reader of a run directory returns a result or one
ConfigError naming the run; one damaged night never blocks the others.

The property damages copies of recorded runs in generated ways (random-byte
lines, fields of any wrong type in events, requests, samples, summary and
incident records, deep nesting in any JSON or YAML file, cut gzip segments,
missing files) and asserts on the report's, compare's and history's cores; the
real-process tests run ``soak report`` and ``soak history`` on such folders."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from report_paths import RUNS
from soak.errors import ConfigError

HISTORY = RUNS.parent / "history"
ROOT = Path(__file__).resolve().parents[2]
FILES = ("events.jsonl", "requests.jsonl", "samples.jsonl", "summary.json", "config.yaml", "plan.json",
         "incidents/1/incident.json")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda children: st.lists(children, max_size=2) | st.dictionaries(st.text(max_size=3), children, max_size=2),
    max_leaves=6)

damages = st.one_of(
    st.tuples(st.just("bytes"), st.sampled_from(FILES[:3]), st.binary(min_size=1, max_size=200)),
    st.tuples(st.just("wrong_type"), st.sampled_from(FILES[:4] + FILES[6:]), st.integers(0, 400),
              st.integers(0, 30), json_values),
    st.tuples(st.just("deep"), st.sampled_from(FILES), st.integers(200, 100_000)),
    st.tuples(st.just("cut_gz"), st.floats(0.0, 0.95)),
    st.tuples(st.just("missing"), st.sampled_from(FILES)),
)


def _deep_json(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def damage(run: Path, how: tuple) -> None:
    kind = how[0]
    if kind == "bytes":
        _, name, data = how
        with open(run / name, "ab") as fh:
            fh.write(data.replace(b"\n", b" ") + b"\n")
    elif kind == "wrong_type":
        _, name, line_index, key_index, value = how
        path = run / name
        if not path.is_file():
            return
        if name.endswith(".jsonl"):
            lines = path.read_bytes().splitlines()
            i = line_index % max(1, len(lines))
            try:  # an earlier damage may have left that line unreadable: leave it so
                record = json.loads(lines[i]) if lines else {}
            except (ValueError, RecursionError):
                return
            if not isinstance(record, dict):
                return
            keys = sorted(record) or ["ts"]
            record[keys[key_index % len(keys)]] = value
            lines[i:i + 1] = [json.dumps(record).encode()]
            path.write_bytes(b"\n".join(lines) + b"\n")
        else:
            try:
                record = json.loads(path.read_bytes())
            except (ValueError, RecursionError):
                return
            if not isinstance(record, dict):
                return
            keys = sorted(record) or ["verdict"]
            record[keys[key_index % len(keys)]] = value
            if "record" in record and isinstance(record["record"], dict):
                inner = sorted(record["record"]) or ["kind"]
                record["record"][inner[key_index % len(inner)]] = value
            path.write_text(json.dumps(record))
    elif kind == "deep":
        _, name, depth = how
        path = run / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".jsonl"):
            with open(path, "ab") as fh:
                fh.write(_deep_json(depth) + b"\n")
        elif name.endswith(".yaml"):
            path.write_text("name: x\nthresholds: " + "[" * depth + "]" * depth + "\n")
        else:
            path.write_bytes(b'{"a":' * depth + b"1" + b"}" * depth)
    elif kind == "cut_gz":
        _, keep = how
        plain = run / "samples.jsonl"
        data = gzip.compress(plain.read_bytes()) if plain.is_file() else gzip.compress(b'{"kind":"x"}\n')
        (run / "samples-000.jsonl.gz").write_bytes(data[: int(len(data) * keep)])
    elif kind == "missing":
        path = run / how[1]
        if path.is_file():
            path.unlink()


def _fresh(tmp: Path, name: str, source: Path = RUNS) -> Path:
    dest = tmp / name
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(source / name, dest)
    for produced in ("report.html", "junit.xml"):
        (dest / produced).unlink(missing_ok=True)
    return dest


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(base=st.sampled_from(["fail", "pass", "cutoff"]), how=st.lists(damages, min_size=1, max_size=3))
def test_a_damaged_run_reads_or_is_one_line_and_compare_still_answers(tmp_path, base, how) -> None:
    from soak.report.compare import compare_runs
    from soak.report.html import render_html
    from soak.report.identity import identify
    from soak.report.render import build, junit_for
    from soak.report.rundir import load_run

    run = _fresh(tmp_path, base)
    for one in how:
        damage(run, one)
    try:
        data = load_run(run)
    except ConfigError as exc:
        assert str(run) in str(exc) and "\n" not in str(exc)
        return
    model = build(data, with_plots=False)
    render_html(model)
    junit_for(model)
    json.dumps(data.summary.to_json())  # summary.json is written from this: it must serialise
    reference = load_run(RUNS / "pass")
    compare_runs(reference, data, a_name="a", b_name="b", resamples=20)
    compare_runs(data, reference, a_name="a", b_name="b", resamples=20)
    # What compare reads to tell the runs apart: the facts, or one line naming the run's file and field.
    try:
        identify(data)
    except ConfigError as exc:
        assert str(run) in str(exc) and "\n" not in str(exc)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(victim=st.integers(0, 2), how=st.lists(damages, min_size=1, max_size=3))
def test_history_over_n_runs_with_one_damaged_still_pools_the_others(tmp_path, victim, how) -> None:
    from soak.history.collect import build_history

    names = sorted(p.name for p in HISTORY.iterdir() if p.is_dir())[:3]
    runs = [_fresh(tmp_path, name, HISTORY) for name in names]
    for one in how:
        damage(runs[victim], one)
    skipped: list[ConfigError] = []
    history = build_history(runs, resamples=20, on_skip=skipped.append)
    kept = {r.path for r in history.runs}
    assert {str(p) for i, p in enumerate(runs) if i != victim} <= kept
    assert len(kept) + len(skipped) == len(runs)
    for exc in skipped:
        assert str(runs[victim]) in str(exc) and "\n" not in str(exc)


def _soak(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "soak", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_soak_report_on_a_damaged_run_notes_the_damage_and_never_tracebacks(tmp_path) -> None:
    run = _fresh(tmp_path, "fail")
    damage(run, ("deep", "events.jsonl", 100_000))  # the issue's line nested 100,000 deep
    damage(run, ("wrong_type", "events.jsonl", 0, 0, "yesterday"))  # run_started's duration_s: a string
    lines = (run / "events.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["warmup_s"] = "x"
    lines[0] = json.dumps(first)
    (run / "events.jsonl").write_text("\n".join(lines) + "\n")
    (run / "config.yaml").write_text("name: x\nthresholds: " + "[" * 5000 + "]" * 5000 + "\n")
    done = _soak("report", str(run), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["records"]["bad_lines"] >= 1 and summary["records"]["wrong_type_fields"] >= 1
    assert summary["verdict"] == "fail"  # the hang on disk still decides


def test_soak_history_reads_every_night_when_one_is_poisoned_by_the_issues_damage(tmp_path) -> None:
    """The issue's poison (a line nested 100,000 deep, a wrong-typed field, a
    deep config.yaml) made history traceback for the whole folder, every later
    night: now that night is read with its damage counted, and the rest pooled."""
    folder = tmp_path / "nights"
    folder.mkdir()
    names = sorted(p.name for p in HISTORY.iterdir() if p.is_dir())
    for name in names:
        shutil.copytree(HISTORY / name, folder / name)
    poisoned = folder / names[1]
    damage(poisoned, ("deep", "events.jsonl", 100_000))
    damage(poisoned, ("wrong_type", "events.jsonl", 0, 0, {"not": "a number"}))
    damage(poisoned, ("deep", "config.yaml", 100_000))
    done = _soak("history", str(folder), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    pooled = json.loads((tmp_path / "out" / "history.json").read_text())
    assert len(pooled["runs"]) == len(names)


def test_history_skips_a_night_that_cannot_be_read_with_one_line(tmp_path, monkeypatch) -> None:
    """The last resort: whatever a night raises (here a reader bug, simulated) is
    one line naming it, and the others are pooled."""
    import soak.report.rundir as rundir
    from soak.history.collect import build_history

    runs = [_fresh(tmp_path, name, HISTORY) for name in sorted(p.name for p in HISTORY.iterdir() if p.is_dir())[:3]]
    real = rundir._load_run

    def broken(path):
        if path == runs[1]:
            raise KeyError("a shape no reader foresaw")
        return real(path)

    monkeypatch.setattr(rundir, "_load_run", broken)
    skipped: list[ConfigError] = []
    history = build_history(runs, resamples=20, on_skip=skipped.append)
    assert {r.path for r in history.runs} == {str(runs[0]), str(runs[2])}
    assert len(skipped) == 1 and str(runs[1]) in str(skipped[0]) and "KeyError" in str(skipped[0])
    with pytest.raises(ConfigError, match="no readable run"):
        build_history([runs[1]], resamples=20)


def test_soak_compare_on_a_run_it_cannot_read_is_one_line_exit_2(tmp_path) -> None:
    run = _fresh(tmp_path, "pass")
    for name in ("events.jsonl", "requests.jsonl", "samples.jsonl", "summary.json"):
        (run / name).unlink(missing_ok=True)
    done = _soak("compare", str(RUNS / "pass"), str(run), cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and str(run) in done.stderr


@pytest.mark.parametrize("form", ["json", "pickle"])
def test_soak_diagnose_on_a_deeply_nested_dump_is_exit_2_with_one_line(tmp_path, form) -> None:
    folder = tmp_path / "nccl"
    folder.mkdir()
    depth = 100_000
    if form == "json":
        data = b'{"entries": ' + b"[" * depth + b"]" * depth + b"}"
    else:  # built from opcodes: the unpickler nests it without recursing, the readers after it would
        data = b"\x80\x02}q\x00X\x07\x00\x00\x00entries" + b"]" * depth + b"a" * (depth - 1) + b"s."
    (folder / "nccl_trace_rank_0").write_bytes(data)
    done = _soak("diagnose", str(folder), cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and "nccl_trace_rank_0" in line and "nesting_depth" in line


SUMMARY_KEYS = ("verdict", "cut_off", "started_at", "duration_s", "requests", "tokens", "incidents", "criteria",
                "thresholds", "build", "error_rate", "latency", "throughput", "restarts", "exit_code", "hostname")


@settings(max_examples=60, deadline=None)
@given(base=st.sampled_from(["fail", "pass"]),
       changes=st.dictionaries(st.sampled_from(SUMMARY_KEYS), json_values | st.lists(json_values, max_size=3),
                               min_size=1, max_size=4))
def test_every_reader_of_summary_json_takes_any_value_in_any_field(base, changes) -> None:
    """summary.json written by an older soak, by hand or damaged: junit, the push,
    history's record and the figures by name still come out (the typed record)."""
    import xml.etree.ElementTree as ET

    from soak.report.push import night_families
    from soak.history.model import run_record
    from soak.report.junit import build_junit
    from soak.summary_file import RunSummary
    from soak.thresholds.metrics import RUN_METRICS, run_value

    summary = RunSummary.from_json({**json.loads((RUNS / base / "summary.json").read_text()), **changes})
    ET.fromstring(build_junit(summary, name="night"))
    night_families(summary, exit_code=None, confidence=0.95)
    run_record(path="night", summary=summary, events=[], config={})
    assert all(run_value(name, summary) is None or isinstance(run_value(name, summary), float) for name in RUN_METRICS)
