"""soak.store.rundir: one answer to "is this a run directory?" for every reader,
and config.yaml read and parsed once per run directory."""

from __future__ import annotations

import dataclasses
import gzip
import shutil
from pathlib import Path

import pytest

import soak.store.rundir as rundir
from soak.errors import ConfigError
from soak.history.collect import find_runs as history_runs
from soak.report.retention import find_runs as retention_runs
from soak.report.rundir import load_run
from soak.store.rundir import RunDir, is_run_dir

RUNS = Path(__file__).parents[1] / "fixtures" / "runs"


# (what the folder holds, whether it is a run): files by name; a name ending in "/" is a folder.
FOLDERS = [
    ("events.jsonl only", {"events.jsonl": '{"ts": 1.0, "type": "run_started"}\n'}, True),
    ("an empty events.jsonl (cut off before the first event)", {"events.jsonl": ""}, True),
    ("requests.jsonl only", {"requests.jsonl": ""}, True),
    ("samples.jsonl only", {"samples.jsonl": ""}, True),
    ("a rolled sample segment only", {"samples-001.jsonl.gz": gzip.compress(b"")}, True),
    ("summary.json only (a run re-rendered elsewhere)", {"summary.json": "{}"}, True),
    ("nothing", {}, False),
    ("config.yaml only (a folder of configs)", {"config.yaml": "name: x\n"}, False),
    ("config.yaml and plan.json", {"config.yaml": "name: x\n", "plan.json": "{}"}, False),
    ("incidents only", {"incidents/": None}, False),
    ("events.jsonl that is a folder", {"events.jsonl/": None}, False),
    ("a file named like a segment but not one", {"samples-x.jsonl.gz": b""}, False),
]


def _make(root: Path, contents: dict) -> Path:
    root.mkdir(parents=True)
    for name, body in contents.items():
        if name.endswith("/"):
            (root / name.rstrip("/")).mkdir()
        elif isinstance(body, bytes):
            (root / name).write_bytes(body)
        else:
            (root / name).write_text(body)
    return root


@pytest.mark.parametrize("what, contents, is_run", FOLDERS, ids=[f[0] for f in FOLDERS])
def test_every_reader_gives_one_answer(tmp_path, what, contents, is_run) -> None:
    folder = _make(tmp_path / "runs" / "night", contents)
    assert is_run_dir(folder) is is_run and RunDir(folder).is_run is is_run
    # history and retention look for runs in a folder of them: they count this one exactly when it is a run
    assert [r.path.name for r in retention_runs(tmp_path / "runs")] == (["night"] if is_run else [])
    if is_run:
        assert history_runs([tmp_path / "runs"]) == [folder]
    else:
        with pytest.raises(ConfigError, match="neither a run directory"):
            history_runs([tmp_path / "runs"])
        with pytest.raises(ConfigError, match="not a run directory"):
            load_run(folder)


@pytest.mark.parametrize("path", ["missing", "a_file"])
def test_what_is_not_a_folder_is_no_run(tmp_path, path) -> None:
    (tmp_path / "a_file").write_text("events.jsonl")
    assert not is_run_dir(tmp_path / path)


def test_every_recorded_fixture_is_a_run() -> None:
    for run in sorted(p for p in RUNS.iterdir() if p.is_dir()):
        assert is_run_dir(run), run


def _count_parses(monkeypatch) -> list[bytes]:
    parsed: list[bytes] = []
    real = rundir.parse_recorded_yaml

    def counting(data: bytes, **kw):
        parsed.append(data)
        return real(data, **kw)

    monkeypatch.setattr(rundir, "parse_recorded_yaml", counting)
    return parsed


def test_config_yaml_is_parsed_once_however_often_it_is_read(tmp_path, monkeypatch) -> None:
    parsed = _count_parses(monkeypatch)
    run = RunDir(_make(tmp_path / "run", {"events.jsonl": "", "config.yaml": "name: night\nload:\n  streams: 4\n"}))
    assert run.config["name"] == "night"
    assert run.section("load") == {"streams": 4} and run.section("name") is None and run.section("nope") is None
    assert run.config_text.startswith("name: night")
    assert len(parsed) == 1


def test_the_report_reads_config_yaml_once(tmp_path, monkeypatch) -> None:
    run = tmp_path / "pass"
    shutil.copytree(RUNS / "pass", run)
    parsed = _count_parses(monkeypatch)
    data = load_run(run)
    assert len(parsed) == 1 and data.config["name"] == RunDir(run).config["name"]
    assert data.config_text == (run / "config.yaml").read_text()


@pytest.mark.parametrize("body, text", [
    (b"name: [unclosed\n", "name: [unclosed\n"),  # not YAML: shown, not parsed
    (b"- a list\n", "- a list\n"),  # YAML, but not a mapping
    (b"name: \xff\n", "name: \ufffd\n"),  # not UTF-8: shown with the byte replaced
])
def test_an_unreadable_config_reads_empty_and_is_still_shown(tmp_path, body, text) -> None:
    folder = _make(tmp_path / "run", {"events.jsonl": ""})
    (folder / "config.yaml").write_bytes(body)
    run = RunDir(folder)
    assert run.config == {} and run.section("name") is None and run.config_unreadable
    assert run.config_text == text


def test_a_config_past_its_bound_is_unreadable_not_missing(tmp_path, monkeypatch) -> None:
    folder = _make(tmp_path / "run", {"events.jsonl": "", "config.yaml": "name: " + "x" * 100 + "\n"})
    monkeypatch.setattr(rundir, "LIMITS", dataclasses.replace(rundir.LIMITS, yaml_bytes=10))
    run = RunDir(folder)
    assert run.config == {} and run.config_bytes is None and run.config_unreadable


def test_a_bare_redacted_secret_still_parses(tmp_path) -> None:
    folder = _make(tmp_path / "run", {"config.yaml": "target:\n  api_key: ***\n"})
    assert RunDir(folder).section("target") == {"api_key": "***"}


def test_no_config_reads_empty(tmp_path) -> None:
    run = RunDir(_make(tmp_path / "run", {"events.jsonl": ""}))
    assert run.config == {} and run.config_text == "" and run.config_bytes is None and not run.config_unreadable


def test_incident_dirs_by_number(tmp_path) -> None:
    folder = _make(tmp_path / "run", {"events.jsonl": ""})
    for name in ("10", "2", "notes", "1"):
        (folder / "incidents" / name).mkdir(parents=True)
    (folder / "incidents" / "3").write_text("a file, not an incident")
    assert [p.name for p in RunDir(folder).incident_dirs()] == ["1", "2", "10"]


@pytest.mark.parametrize("body, verdict", [('{"verdict": "fail"}', "fail"), ("[1, 2]", None), ("{torn", None)])
def test_summary_reads_typed_or_none(tmp_path, body, verdict) -> None:
    run = RunDir(_make(tmp_path / "run", {"summary.json": body}))
    summary = run.summary()
    assert (summary.verdict.value if summary is not None else None) == verdict
    assert RunDir(tmp_path).summary() is None  # no summary.json at all
