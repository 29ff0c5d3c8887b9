"""Readers are total for samples.jsonl and incident.json (docs/invariants.md 6, 7).

A field of a sample line or of incident.json of the wrong type (a string, a
bool, NaN or infinity, a negative or huge number, a list, an object) reads as
absent and is counted: the run still loads, the report's data still builds, and
no value sizes an allocation (a GPU index is a column only under MAX_GPUS).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soak.report.html import render_html
from soak.report.render import build, junit_for
from soak.report.rundir import MAX_GPUS, load_run

ROOT = Path(__file__).resolve().parents[2]
CLEAN = ROOT / "tests" / "fixtures" / "history" / "n06-fixed-clean"
TS = 1765071100.0

json_values = st.recursive(
    st.none() | st.booleans()
    | st.sampled_from([-3, -1, 0, 1, 7, 255, 256, 300_000_000, 2**63, -(2**70), 10**30])
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=8)

# A well-formed line of each kind the report reads, and the fields it reads of each.
BASE = {
    "gpu": {"kind": "gpu", "ts": TS, "source": "nvml", "gpus": [{"index": 0, "util_pct": 50.0}]},
    "gpu_reading": {"kind": "gpu", "ts": TS, "source": "nvml", "gpus": [{"index": 0, "util_pct": 50.0}]},
    "stage_cpu": {"kind": "gpu", "ts": TS, "source": "stage_cpu", "gpus": [{"util_pct": 50.0}]},
    "server": {"kind": "server", "ts": TS, "ok": True, "values": {"generation_tokens": 10.0,
                                                               "kv_cache_usage_perc": 0.5}},
    "server_value": {"kind": "server", "ts": TS, "ok": True, "values": {"generation_tokens": 10.0}},
    "client": {"kind": "client", "ts": TS, "tokens_total": 100, "in_flight": 3},
    "log": {"kind": "log", "ts": TS, "line": "watchdog: no progress"},
}
FIELDS = {
    "gpu": ("ts", "source", "gpus"),
    "gpu_reading": ("index", "util_pct"),
    "stage_cpu": ("util_pct",),
    "server": ("ts", "ok", "values"),
    "server_value": ("generation_tokens", "kv_cache_usage_perc", "num_requests_running"),
    "client": ("ts", "tokens_total", "in_flight"),
    "log": ("ts", "line"),
}


def _number(v) -> bool:
    return (type(v) is float and math.isfinite(v)) or (type(v) is int and -2**63 <= v < 2**63)


def _valid(field: str, v) -> bool:
    """Whether the reader must take ``v`` for ``field`` (None reads as absent, uncounted)."""
    return {
        "ts": lambda: _number(v) and 0 <= v < 1e11,
        "source": lambda: type(v) is str,
        "gpus": lambda: type(v) is list,
        "index": lambda: type(v) is int and 0 <= v < MAX_GPUS,
        "ok": lambda: type(v) is bool,
        "values": lambda: type(v) is dict,
        "line": lambda: type(v) is str,
    }.get(field, lambda: _number(v))()


def _line(shape: str, field: str, value) -> dict:
    line = json.loads(json.dumps(BASE[shape]))
    if shape in ("gpu_reading", "stage_cpu"):
        line["gpus"][0][field] = value
    elif shape == "server_value":
        line["values"][field] = value
    else:
        line[field] = value
    return line


shapes = st.sampled_from(sorted(FIELDS)).flatmap(
    lambda shape: st.tuples(st.just(shape), st.sampled_from(FIELDS[shape]), json_values))


@pytest.fixture(scope="module")
def judged(tmp_path_factory) -> dict:
    """The clean night's own summary (so a property run need not judge it again)."""
    run = tmp_path_factory.mktemp("judged") / "run"
    shutil.copytree(CLEAN, run)
    return load_run(run).summary.to_json()


def _copy(tmp: Path) -> Path:
    run = tmp / "run"
    if run.exists():
        shutil.rmtree(run)
    shutil.copytree(CLEAN, run)
    return run


def _check_loaded(run, field: str, value) -> None:
    util = run.gpu_util
    assert util.ndim == 2 and util.shape[1] <= MAX_GPUS and util.size <= max(1, len(run.gpu_ts)) * MAX_GPUS
    for column in (run.client_tokens, run.client_in_flight, *run.server.values()):
        assert column.dtype.kind == "f"
    if value is not None and not _valid(field, value):
        # counted: as a field of the wrong type, or (NaN, Infinity: not JSON to a strict parser) the line as bad
        counted = run.wrong_type_fields.get("samples.jsonl", 0) + run.bad_lines.get("samples.jsonl", 0)
        assert counted >= 1, (field, value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(how=shapes)
def test_a_sample_field_of_any_type_reads_as_absent_and_is_counted(tmp_path, judged, how):
    """The report child's read (the summary as the run's end wrote it): any value
    of any field the report reads leaves the run readable, bounded, the field counted."""
    shape, field, value = how
    run_dir = _copy(tmp_path)
    (run_dir / "samples.jsonl").write_text(json.dumps(_line(shape, field, value)) + "\n")
    _check_loaded(load_run(run_dir, summary=judged), field, value)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(how=shapes.filter(lambda h: h[0] not in ("server", "server_value")))
def test_a_sample_field_of_any_type_survives_the_judged_read(tmp_path, how):
    """``soak report``'s read (judged again from the files), for the sample kinds
    only the report reads (the judge's own server-sample read: see the xfail below)."""
    shape, field, value = how
    run_dir = _copy(tmp_path)
    (run_dir / "samples.jsonl").write_text(json.dumps(_line(shape, field, value)) + "\n")
    run = load_run(run_dir)
    _check_loaded(run, field, value)
    model = build(run, with_plots=False)
    render_html(model)
    junit_for(model)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ok=json_values, values=json_values)
def test_server_values_of_any_type_survive_the_judge(tmp_path, ok, values):
    """The judge's own read of server samples (soak.store.summary.server_values)."""
    run_dir = _copy(tmp_path)
    (run_dir / "samples.jsonl").write_text(json.dumps({"kind": "server", "ts": TS, "ok": ok,
                                                       "values": values}) + "\n")
    load_run(run_dir)


def test_a_huge_gpu_index_sizes_nothing(tmp_path, judged):
    run_dir = _copy(tmp_path)
    lines = [{"kind": "gpu", "ts": TS + i, "source": "nvml",
              "gpus": [{"index": 300_000_000, "util_pct": 1}, {"index": 1, "util_pct": 2.0}]} for i in range(50)]
    lines.append({"kind": "gpu", "ts": TS + 60, "source": "stage_cpu", "gpus": [{"util_pct": 1.0}] * 5000})
    (run_dir / "samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    run = load_run(run_dir, summary=judged)
    assert run.gpu_util.shape == (51, MAX_GPUS)
    assert run.gpu_util[0, 1] == 2.0
    assert run.wrong_type_fields["samples.jsonl"] >= 50 + 5000 - MAX_GPUS


INCIDENT_KEYS = ("number", "status", "kind", "rule", "summary", "evidence", "diagnosis", "onset_at", "detected_at",
                 "onset_earliest_at", "onset_latest_at", "killed_pids", "gpus_released", "gpu_free_s", "reasons",
                 "notes", "steps", "decision_evidence", "evidence_signals", "detection_latency_s")
DECISION_KEYS = ("kind", "rule", "onset_at", "decided_at", "reasons", "evidence")

incident_docs = st.one_of(
    st.dictionaries(st.sampled_from(INCIDENT_KEYS), json_values, max_size=6),
    st.fixed_dictionaries({
        "number": json_values,
        "status": json_values,
        "record": st.dictionaries(st.sampled_from(INCIDENT_KEYS), json_values, max_size=6) | json_values,
        "decision": st.dictionaries(st.sampled_from(DECISION_KEYS), json_values, max_size=4)
        | st.fixed_dictionaries({"evidence": st.fixed_dictionaries(
            {"signals": st.dictionaries(st.sampled_from(("stalled_at", "last_token_at", "x")), json_values)})}),
        "steps": json_values,
    }),
)


def _with_incident(run_dir: Path, doc) -> None:
    folder = run_dir / "incidents" / "1"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "incident.json").write_text(json.dumps(doc))
    (run_dir / "samples.jsonl").write_text(
        json.dumps({"kind": "log", "ts": TS, "line": "[rank0]: Watchdog caught collective operation timeout"}) + "\n")


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=incident_docs)
def test_an_incident_field_of_any_type_still_renders(tmp_path, doc):
    """Any value of any field of incident.json: the run loads (judged again, as
    ``soak report`` does), and the report's model, page and junit.xml build."""
    run_dir = _copy(tmp_path)
    _with_incident(run_dir, doc)
    run = load_run(run_dir)
    model = build(run, with_plots=False)
    render_html(model)
    junit_for(model)


def test_a_wrong_typed_onset_is_counted(tmp_path):
    run_dir = _copy(tmp_path)
    _with_incident(run_dir, {"number": 1, "onset_at": "yesterday"})
    run = load_run(run_dir)
    assert run.wrong_type_fields == {"incidents/1/incident.json": 1}
    model = build(run, with_plots=False)
    assert "incidents/1/incident.json: 1 field of the wrong type read as absent" in model.notes
    assert all(v.record.get("onset_at") is None for v in model.incidents)


def test_soak_report_on_hostile_lines(tmp_path):
    """The real process: hostile sample lines and a hostile incident.json are a
    readable run (exit 0), the damage named as notes, never a traceback."""
    run_dir = _copy(tmp_path)
    _with_incident(run_dir, {"number": 1, "onset_at": "yesterday", "decision": {"reasons": 3},
                             "record": {"killed_pids": "all", "steps": [1], "notes": 5}})
    hostile = ({"kind": "gpu", "ts": TS, "gpus": [{"index": 300000000, "util_pct": 1}]},
               {"kind": "gpu", "ts": TS + 1, "gpus": [{"index": -3, "util_pct": True}]},
               {"kind": "client", "ts": TS + 2, "tokens_total": "abc", "in_flight": [1]},
               {"kind": "log", "ts": "yesterday", "line": 5})
    with open(run_dir / "samples.jsonl", "a") as fh:
        fh.writelines(json.dumps(line) + "\n" for line in hostile)
    done = subprocess.run([sys.executable, "-m", "soak", "report", str(run_dir)], cwd=ROOT, capture_output=True,
                          check=False, text=True, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    page = (run_dir / "report.html").read_text()
    assert "samples.jsonl: " in page and "of the wrong type read as absent" in page
    assert "incidents/1/incident.json: " in page
