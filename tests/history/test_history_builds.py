"""``soak history`` over recorded nights whose label is one build's name but whose
launch differed (issue 50: "2 runs, 1 hang in 36 s" was two builds): grouped by
what ran, the difference said, the label's builds named wherever a build is
asked for; damaged and hostile records one line each, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from soak.history.build import build_identity

T0 = 1764633600.0
DAY = 86400.0


def _launch(ld: str | None = "/opt/nccl-2.21/lib", pythonpath: str | None = None, script_sha: str = "c" * 64):
    return {"executable": {"path": "/venv/bin/python", "resolved": "/usr/bin/python3.11", "sha256": "a" * 64,
                           "size": 10},
            "script": {"path": "/srv/serve.py", "sha256": script_sha, "size": 4},
            "interpreter": "/venv/bin/python", "python": "3.11.7",
            "packages": {"vllm": "0.6.3", "torch": "2.4.0", "nvidia-nccl-cu12": "2.21.5"},
            "imported_from": {"vllm": "/venv/lib/python3.11/site-packages/vllm", "torch": None}, "nccl": [],
            "env": {"LD_LIBRARY_PATH": ld, "PYTHONPATH": pythonpath},
            "model": {"id": "org/m", "revision": None, "revision_from": None, "config_sha256": None},
            "unknown": []}


CONFIG = {"name": "nightly", "build": "candidate-7",
          "target": {"kind": "launched", "command": ["/venv/bin/python", "/srv/serve.py", "--model", "org/m",
                                                     "--port", "8000"]}}


def night(out: Path, *, n: int, launch: dict | None, hang_at: float | None = None, load_s: float = 600.0,
          config: dict = CONFIG, build: dict | None = None) -> Path:
    """A night as the run store leaves it: config.yaml, events.jsonl (its build event
    as soak.run.loop records it), requests.jsonl."""
    out.mkdir(parents=True)
    start = T0 + n * DAY
    (out / "config.yaml").write_text(yaml.safe_dump(config))
    if build is None:
        build = build_identity(config, vllm_version="0.6.3", served_model="org/m", launch=launch)
    stop = hang_at + 6 if hang_at is not None else load_s
    events = [{"ts": start, "type": "run_started", "run_id": out.name, "target": "launched", "model": "org/m",
               "duration_s": load_s, "warmup_s": 0.0},
              {"ts": start, "type": "build", **build},
              {"ts": start, "type": "load_started"}]
    if hang_at is not None:
        events.append({"ts": start + hang_at + 5, "type": "incident", "number": 1, "kind": "hang",
                       "rule": "pp_tail_stall", "onset_at": start + hang_at, "detected_at": start + hang_at + 4,
                       "killed_pids": [], "gpus_released": True, "evidence": "incidents/1"})
    events += [{"ts": start + stop, "type": "load_stopped", "reason": "duration"},
               {"ts": start + stop + 1, "type": "run_ended", "verdict": "fail" if hang_at else "pass",
                "exit_code": 1 if hang_at else 0}]
    (out / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    requests = [{"ts": start + t, "started_at": start + t - 8, "ended_at": start + t, "outcome": "ok",
                 "prompt_tokens": 1000, "output_tokens": 100, "ttft_s": 2.0, "tpot_s": 0.05, "e2e_s": 8.0,
                 "warmup": False}
                for t in range(10, int(hang_at if hang_at is not None else stop), 10)]
    (out / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in requests))
    return out


def history(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "soak", "history", *args], capture_output=True, text=True,
                          timeout=120)


def test_one_label_two_nccl_builds_are_two_builds_and_the_difference_is_said(tmp_path):
    runs = tmp_path / "runs"
    night(runs / "n1", n=0, launch=_launch("/opt/nccl-2.19/lib"), hang_at=36.0)
    night(runs / "n2", n=1, launch=_launch("/opt/nccl-2.21/lib"))
    done = history(str(runs), "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    lines = document["lines"]
    # before: "candidate-7: 2 runs, 1 hang in 11 min" (two builds pooled as one)
    assert lines[0] == "candidate-7: 2 builds: LD_LIBRARY_PATH /opt/nccl-2.19/lib vs /opt/nccl-2.21/lib"
    builds = document["history"]["builds"]
    assert len(builds) == 2 and all(b["label"] == "candidate-7" and b["runs"] == 1 for b in builds)
    first, second = builds
    assert first["build"] == f"candidate-7@{first['identity']}" and first["hangs"] == 1 and second["hangs"] == 0
    assert lines[1].startswith(f"{first['build']}: 1 runs, 1 hang in 36 s")
    assert lines[2].startswith(f"{second['build']}: 1 runs, no hang in 10 min")
    assert first["facts"]["LD_LIBRARY_PATH"] == "/opt/nccl-2.19/lib"
    split, = document["history"]["splits"]
    assert split["label"] == "candidate-7" and split["builds"] == [first["build"], second["build"]]
    assert split["differences"] == [{"field": "LD_LIBRARY_PATH",
                                     "values": ["/opt/nccl-2.19/lib", "/opt/nccl-2.21/lib"]}]
    runs_json = document["history"]["runs"]
    assert [r["label"] for r in runs_json] == ["candidate-7", "candidate-7"]  # the user's label stays
    page = (runs / "history.html").read_text()
    assert "One label, several builds" in page and "/opt/nccl-2.19/lib" in page
    csv_text = (runs / "history.csv").read_text()
    assert csv_text.splitlines()[0].endswith(",identity") and first["identity"] in csv_text


def test_equal_launches_pool_under_the_label_and_old_nights_keep_theirs(tmp_path):
    runs = tmp_path / "runs"
    night(runs / "n1", n=0, launch=_launch(), hang_at=300.0)
    night(runs / "n2", n=1, launch=_launch())
    # two nights recorded before soak read the launch: their label and digest, as they were
    legacy = {"label": "old-build", "vllm_version": "0.6.2", "launch_digest": "5e1f00d", "model": "org/m",
              "build": "old-build"}
    night(runs / "n3", n=2, launch=None, build=legacy)
    night(runs / "n4", n=3, launch=None, build=legacy)
    done = history(str(runs), "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    builds = {b["build"]: b for b in document["history"]["builds"]}
    assert set(builds) == {"candidate-7", "old-build"} and document["history"]["splits"] == []
    assert builds["candidate-7"]["runs"] == 2 and builds["candidate-7"]["hangs"] == 1
    assert builds["old-build"]["runs"] == 2 and builds["old-build"]["facts"]["launch"].startswith("not recorded")
    assert document["lines"][0].startswith("candidate-7: 2 runs, 1 hang in")


def test_nights_from_before_soak_read_the_launch_join_their_labels_one_build_only(tmp_path):
    runs = tmp_path / "runs"
    legacy = {"label": "candidate-7", "vllm_version": "0.6.3", "launch_digest": "5e1f00d", "model": "org/m",
              "build": "candidate-7"}
    night(runs / "n1", n=0, launch=None, build=legacy, hang_at=100.0)
    night(runs / "n2", n=1, launch=_launch("/opt/nccl-2.19/lib"))
    night(runs / "n3", n=2, launch=None, build={**legacy, "vllm_version": "0.6.2"})
    # what the label meant then: its one recorded build of the same /version
    # (the old night of another /version is a build of its own)
    data = json.loads(history(str(runs), "--json").stdout)["history"]
    by_path = {Path(r["path"]).name: r["build"] for r in data["runs"]}
    assert by_path["n1"] == by_path["n2"] != by_path["n3"]
    pooled = next(b for b in data["builds"] if b["build"] == by_path["n1"])
    assert pooled["runs"] == 2 and pooled["hangs"] == 1
    assert pooled["facts"]["LD_LIBRARY_PATH"] == "/opt/nccl-2.19/lib"  # said by the night that recorded it
    # once the label's recorded nights are two builds, which one an old night ran is not known: its own
    night(runs / "n4", n=3, launch=_launch("/opt/nccl-2.21/lib"))
    data = json.loads(history(str(runs), "--json").stdout)["history"]
    assert sorted(b["runs"] for b in data["builds"]) == [1, 1, 1, 1]
    split, = data["splits"]
    ld = next(d for d in split["differences"] if d["field"] == "LD_LIBRARY_PATH")
    assert len(split["builds"]) == 4 and {"/opt/nccl-2.19/lib", "/opt/nccl-2.21/lib"} <= set(ld["values"])


def test_a_label_of_several_builds_is_named_by_its_builds_never_pooled(tmp_path):
    runs = tmp_path / "runs"
    night(runs / "n1", n=0, launch=_launch(pythonpath="/src/vllm-a"), hang_at=60.0)
    night(runs / "n2", n=1, launch=_launch(pythonpath="/src/vllm-b", script_sha="d" * 64))
    night(runs / "n3", n=2, launch=_launch(pythonpath="/src/vllm-b", script_sha="d" * 64))
    done = history(str(runs), "--baseline", "candidate-7")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "--baseline: candidate-7: 2 builds: script" in done.stderr
    assert "PYTHONPATH /src/vllm-a vs /src/vllm-b" in done.stderr and "name one: candidate-7@" in done.stderr
    keys = json.loads(history(str(runs), "--json").stdout)["history"]["builds"]
    first, second = (b["build"] for b in keys)
    done = history(str(runs), "--baseline", first, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)["history"]
    assert data["baseline"] == first and [t["b"] for t in data["rate_tests"]] == [second]
    # --prove LABEL tests each of its builds on its own nights
    done = history(str(runs), "--prove", "candidate-7", "--broken-mtbf", "1m", "--target-mtbf", "10m", "--json")
    assert done.returncode == 0, done.stderr
    proofs = json.loads(done.stdout)["history"]["proofs"]
    assert [p["build"] for p in proofs] == [first, second]
    assert [p["path"]["hang_exposures_s"] for p in proofs] == [[60.0], []]
    # its hangs are not one build's MTBF
    done = history(str(runs), "--prove", "--broken-build", "candidate-7", "--ratio", "5")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--broken-build: build candidate-7: 2 builds" \
        in done.stderr


def test_hostile_and_damaged_build_records_never_traceback(tmp_path):
    runs = tmp_path / "runs"
    night(runs / "n1", n=0, launch=_launch("\x1b]0;owned\x07/opt/nccl-2.19/lib"))
    night(runs / "n2", n=1, launch=_launch())
    hostile = build_identity(CONFIG, vllm_version="0.6.3", served_model="org/m", launch=_launch())
    hostile["launch"] = {"executable": ["x"], "packages": "all", "nccl": {"via": 1}, "env": [1, 2],
                         "model": None, "script": {"module": {"a": 1}}}
    hostile["flags"] = {"no": "list"}
    night(runs / "n3", n=2, launch=None, build=hostile)
    deep = night(runs / "n4", n=3, launch=_launch())
    # the build event's launch nested 100,000 deep: the events reader's bound drops the line
    lines = (deep / "events.jsonl").read_text().splitlines()
    lines[1] = lines[1].replace('"launch": {', '"launch": ' + "[" * 100_000 + "]" * 100_000 + ', "x": {', 1)
    (deep / "events.jsonl").write_text("\n".join(lines) + "\n")
    typed = night(runs / "n5", n=4, launch=_launch())
    (typed / "summary.json").write_text(json.dumps({"build": {"label": "candidate-7", "launch": {"env": {
        "LD_LIBRARY_PATH": 5}, "packages": {"vllm": {"x": 1}}}, "flags": [None]}}))
    done = history(str(runs), "--json")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    document = json.loads(done.stdout)
    assert all(line.isprintable() for line in document["lines"])  # the escape in a path drives no terminal
    assert document["lines"][0].startswith("candidate-7: ")
    assert len(document["history"]["runs"]) == 5
    text = history(str(runs))
    assert text.returncode == 0 and "\x1b" not in text.stdout and "Traceback" not in text.stderr


def test_a_prove_or_bisect_history_refuses_a_label_of_several_builds(tmp_path):
    """The readers of history outside ``soak history`` (a run's prove.broken_build, a
    bisect's prior) name builds by label too: a label of several builds is one line."""
    from soak.bisect.spec import history_prior
    from soak.errors import ConfigError
    from soak.run.proving import broken_mtbf_from_history

    runs = tmp_path / "runs"
    night(runs / "n1", n=0, launch=_launch("/opt/nccl-2.19/lib"), hang_at=36.0)
    night(runs / "n2", n=1, launch=_launch("/opt/nccl-2.21/lib"), hang_at=120.0)
    section = types.SimpleNamespace(history=str(runs), broken_build="candidate-7")
    with pytest.raises(ConfigError, match="candidate-7: 2 builds: LD_LIBRARY_PATH") as raised:
        broken_mtbf_from_history(section, config_path=tmp_path / "night.yaml")
    assert "\n" not in str(raised.value)
    with pytest.raises(ConfigError, match="name one: candidate-7@"):
        history_prior(["candidate-7", "other"], [runs], path=tmp_path / "bisect.yaml", rates=None)
    # named by its key, a build of the label is its own nights only
    keys = sorted({f"candidate-7@{r}" for r in _identities(runs)})
    mtbfs = {broken_mtbf_from_history(types.SimpleNamespace(history=str(runs), broken_build=key),
                                      config_path=None) for key in keys}
    assert mtbfs == {36.0, 120.0}


def _identities(runs: Path) -> list[str]:
    from soak.history.model import run_record
    from soak.report.rundir import load_run

    out = []
    for path in sorted(runs.iterdir()):
        data = load_run(path)
        out.append(run_record(path=str(path), summary=data.summary, events=data.events, config=data.config).identity)
    return out
