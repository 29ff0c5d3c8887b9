"""A build is what ran (issue 50): what the harness reads of a launch
(soak.target.launch, with real interpreters and files), the identity it makes
(soak.history.build), and the invariant history keeps: runs whose recorded
launch differs in any identity field are never pooled as one build; runs equal
in all of them are."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.history.build import (
    build_identity, group_keys, identity_fields, identity_of, label_splits,
)
from soak.history.model import run_record
from soak.summary_file import RunSummary
from soak.target.launch import LaunchSpec, hf_cache, python_target, read_launch


def _sha(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


# -- what the harness reads of a launch ---------------------------------------------------

def test_a_python_module_launch_names_its_interpreter_module_and_packages(tmp_path):
    lib = tmp_path / "nccl-2.19" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnccl.so.2").write_bytes(b"not really nccl 2.19")
    env = {**os.environ, "LD_LIBRARY_PATH": f"{lib}:/nowhere", "PYTHONPATH": str(tmp_path / "site"),
           "HF_TOKEN": "hf-very-secret-value"}
    launch = read_launch(LaunchSpec((sys.executable, "-m", "soak", "sim", "--port", "0"), env, None), model="m")
    exe = launch["executable"]
    assert exe["path"] == os.path.abspath(sys.executable)
    assert exe["sha256"] == _sha(os.path.realpath(sys.executable))
    import soak

    main = Path(soak.__file__).with_name("__main__.py")
    assert launch["script"]["module"] == "soak" and launch["script"]["path"] == str(main)
    assert launch["script"]["sha256"] == _sha(main)
    assert launch["interpreter"] == os.path.abspath(sys.executable)
    assert launch["python"] == sys.version.split()[0]
    from importlib import metadata

    # the server interpreter's own dist-info: what it has installed, and what it has not
    assert launch["packages"]["soak"] == metadata.version("soak")
    assert set(launch["packages"]) >= {"vllm", "torch", "nvidia-nccl-cu12"}
    # the NCCL the dynamic loader finds first on LD_LIBRARY_PATH, by path and content
    assert launch["nccl"] == [{"via": "LD_LIBRARY_PATH", "path": str(lib / "libnccl.so.2"),
                               "sha256": _sha(lib / "libnccl.so.2"), "size": 20}]
    # the only environment recorded: the two paths, nothing else (no secret)
    assert launch["env"] == {"LD_LIBRARY_PATH": f"{lib}:/nowhere", "PYTHONPATH": str(tmp_path / "site")}
    assert "hf-very-secret-value" not in json.dumps(launch)
    assert launch["unknown"] == []


def test_a_console_script_is_read_through_its_shebang_and_the_paths_are_redacted(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "vllm", f"#!{sys.executable}\nimport sys\nsys.exit(0)\n")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "LD_LIBRARY_PATH": "/opt/s3cr3t-path/lib"}
    launch = read_launch(LaunchSpec(("vllm", "serve", "org/model"), env, None), model="org/model",
                         redact=lambda text: text.replace("s3cr3t-path", "***"))
    assert launch["executable"]["path"] == str(bin_dir / "vllm")
    assert launch["executable"]["sha256"] == _sha(bin_dir / "vllm")
    assert launch["interpreter"] == sys.executable  # the #! line's Python: its packages are the server's
    assert launch["packages"] is not None and launch["script"] is None
    assert launch["env"]["LD_LIBRARY_PATH"] == "/opt/***/lib"


def test_the_interpreter_gets_only_path_variables_and_a_hung_one_is_unknown_within_the_bound(tmp_path):
    seen = tmp_path / "seen.json"
    fake = _script(tmp_path / "python3", f"#!/bin/sh\nenv > {seen}\nsleep 30\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": "/x", "API_TOKEN": "tok-very-secret", "HOME": str(tmp_path)}
    started = time.monotonic()
    launch = read_launch(LaunchSpec((str(fake), "-m", "vllm.entrypoints.openai.api_server"), env, str(tmp_path)),
                         timeout_s=1.0)
    assert time.monotonic() - started < 8
    assert launch["packages"] is None and launch["python"] is None
    assert any("no answer within 1 s" in note for note in launch["unknown"])
    assert launch["script"] == {"module": "vllm.entrypoints.openai.api_server", "path": None, "sha256": None}
    given = seen.read_text()
    assert "PYTHONPATH=/x" in given and "tok-very-secret" not in given and "API_TOKEN" not in given


def test_what_cannot_be_read_is_null_and_said(tmp_path):
    fifo = tmp_path / "serve.py"
    os.mkfifo(fifo)
    launch = read_launch(LaunchSpec(("bash", str(fifo)), {"PATH": "/usr/bin:/bin"}, None))
    assert launch["script"]["sha256"] is None  # a FIFO is never opened for reading (no hang)
    assert any("not a regular file" in note for note in launch["unknown"])
    assert any("shell script" in note for note in launch["unknown"])
    missing = read_launch(LaunchSpec(("no-such-server-binary",), {"PATH": str(tmp_path)}, None))
    assert missing["executable"] is None and missing["packages"] is None
    assert any("not found" in note for note in missing["unknown"])
    assert read_launch(LaunchSpec((), {}, None))["unknown"] == ["the launch command is empty"]


@pytest.mark.parametrize(("args", "expected"), [
    (["-m", "vllm.entrypoints.openai.api_server", "--model", "m"], ("module", "vllm.entrypoints.openai.api_server")),
    (["-u", "-X", "dev", "-W", "ignore", "serve.py", "--port", "1"], ("script", "serve.py")),
    (["-Wignore", "-mvllm"], ("module", "vllm")),
    (["-c", "print(1)"], ("code", None)),
    (["-B", "--", "-odd.py"], ("script", "-odd.py")),
    ([], ("stdin", None)),
])
def test_python_arguments_name_what_runs(args, expected):
    assert python_target(args) == expected


def test_the_model_revision_from_the_hf_cache_and_from_a_snapshot_folder(tmp_path):
    commit = "0123456789abcdef0123456789abcdef01234567"
    folder = tmp_path / "hub" / "models--org--model"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"architectures": ["X"]}')
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "PATH": "/usr/bin:/bin"}
    assert hf_cache(env, None) == str(tmp_path / "hub")
    assert hf_cache({"HOME": "/h"}, None) == "/h/.cache/huggingface/hub"
    hub = read_launch(LaunchSpec(("vllm", "serve", "org/model"), env, None), model="org/model")["model"]
    assert hub == {"id": "org/model", "revision": commit, "revision_from": "the HF cache's refs/main",
                   "config_sha256": _sha(snapshot / "config.json")}
    local = read_launch(LaunchSpec(("vllm", "serve", str(snapshot)), env, None), model=str(snapshot))["model"]
    assert local["revision"] == commit and local["revision_from"] == "the snapshot folder"
    pinned = read_launch(LaunchSpec(("vllm", "serve", "org/model", "--revision", "v2"), env, None),
                         model="org/model")["model"]
    assert pinned["revision"] == "v2" and pinned["revision_from"] == "--revision"


# -- the identity -------------------------------------------------------------------------

LAUNCHED = {"build": "candidate-7", "target": {"kind": "launched", "command": ["vllm", "serve", "m", "--port", "8000",
                                                                              "--max-num-seqs", "64"],
                                               "env": {"NCCL_ALGO": "Ring"}}}


def _launch(**changes):
    launch = {"executable": {"path": "/v/bin/vllm", "sha256": "a" * 64, "size": 1},
              "script": None, "interpreter": "/v/bin/python", "python": "3.11.7",
              "packages": {"vllm": "0.6.3", "torch": "2.4.0", "nvidia-nccl-cu12": "2.21.5"},
              "imported_from": {"vllm": "/v/lib/python3.11/site-packages/vllm", "torch": None},
              "nccl": [], "env": {"LD_LIBRARY_PATH": "/opt/nccl-2.21/lib", "PYTHONPATH": None},
              "model": {"id": "m", "revision": None, "revision_from": None, "config_sha256": None}, "unknown": []}
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(launch.get(key), dict):
            launch[key] = {**launch[key], **value}
        else:
            launch[key] = value
    return launch


def test_the_build_event_records_what_ran_and_its_digest_covers_it():
    a = build_identity(LAUNCHED, vllm_version="0.6.3", served_model="m", launch=_launch())
    assert a["label"] == "candidate-7" and a["build"] == "candidate-7"  # the user's label, kept
    assert a["launch_digest"] == identity_of(a) and len(a["launch_digest"]) == 12
    assert a["flags"] == ["--max-num-seqs 64"] and a["launch"]["env"]["LD_LIBRARY_PATH"] == "/opt/nccl-2.21/lib"
    b = build_identity(LAUNCHED, vllm_version="0.6.3", served_model="m",
                       launch=_launch(env={"LD_LIBRARY_PATH": "/opt/nccl-2.19/lib"}))
    assert a["launch_digest"] != b["launch_digest"]
    # a note of why a part is unknown is not the build
    c = build_identity(LAUNCHED, vllm_version="0.6.3", served_model="m", launch=_launch(unknown=["x: timed out"]))
    assert c["launch_digest"] == a["launch_digest"]
    # the port changes per night: no build of its own
    other_port = {**LAUNCHED, "target": {**LAUNCHED["target"], "command": ["vllm", "serve", "m", "--port", "9",
                                                                           "--max-num-seqs", "64"]}}
    assert build_identity(other_port, vllm_version="0.6.3", served_model="m", launch=_launch())["launch_digest"] \
        == a["launch_digest"]


def test_an_attached_target_records_what_it_can_and_says_the_rest_is_unknown():
    record = build_identity({"target": {"kind": "attached", "base_url": "http://h:1"}}, vllm_version="0.6.3",
                            served_model="served")
    assert record["model"] == "served" and record["vllm_version"] == "0.6.3"
    assert "attached" in record["launch"]["unknown"][0] and "unknown" in record["launch"]["unknown"][0]
    facts = identity_fields(record)
    assert facts["executable"] == "unknown" and facts["packages"] == "unknown" and facts["model"] == "served"


def test_identity_fields_and_identity_of_are_total():
    hostile = [None, [], "x", 7, {"launch": []}, {"launch": {"executable": "x", "packages": [1], "nccl": {"a": 1},
                                                                "env": "LD", "model": 3, "script": {"module": []}}},
               {"launch": {"nccl": [1, {"via": ["x"], "path": {"a": 1}}], "env": {"PYTHONPATH": {"x": 1}}},
                "flags": [1, None, "--x"], "vllm_version": {"a": 1}, "label": ["l"]},
               {"launch": {"packages": {"vllm": "\x1b[31mred" + "x" * 1000}}}]
    for build in hostile:
        facts = identity_fields(build)
        assert all(isinstance(k, str) and isinstance(v, str) and len(v) <= 161 for k, v in facts.items())
        assert len(identity_of(build)) == 12


# -- the invariant: never pooled unless equal in every identity field -----------------------

_FIELDS = {
    "executable": st.sampled_from(["/v1/bin/python", "/v2/bin/python"]),
    "executable_sha": st.sampled_from(["a" * 64, "b" * 64, None]),
    "script_sha": st.sampled_from(["c" * 64, "d" * 64]),
    "vllm": st.sampled_from(["0.6.3", "0.6.4", None]),
    "torch": st.sampled_from(["2.4.0", "2.5.1"]),
    "nccl_wheel": st.sampled_from(["2.19.3", "2.21.5", None]),
    "LD_LIBRARY_PATH": st.sampled_from(["/opt/nccl-2.19/lib", "/opt/nccl-2.21/lib", None]),
    "PYTHONPATH": st.sampled_from(["/src/vllm", None]),
    "model": st.sampled_from(["org/a", "org/b"]),
    "revision": st.sampled_from(["0" * 40, "1" * 40, None]),
}
_runs = st.lists(st.tuples(st.sampled_from(["candidate-7", "baseline", None]), st.fixed_dictionaries(_FIELDS)),
                 min_size=2, max_size=8)


def _recorded(label, f, night):
    launch = {"executable": {"path": f["executable"], "sha256": f["executable_sha"], "size": 10},
              "script": {"path": "/v/serve.py", "sha256": f["script_sha"], "size": 5},
              "interpreter": f["executable"], "python": "3.11.7",
              "packages": {"vllm": f["vllm"], "torch": f["torch"], "nvidia-nccl-cu12": f["nccl_wheel"]},
              "imported_from": {"vllm": None, "torch": None}, "nccl": [],
              "env": {"LD_LIBRARY_PATH": f["LD_LIBRARY_PATH"], "PYTHONPATH": f["PYTHONPATH"]},
              "model": {"id": f["model"], "revision": f["revision"], "revision_from": None, "config_sha256": None},
              # the why of an unknown varies per night; it is no part of the build
              "unknown": [f"night {night}"]}
    config = {"build": label, "target": {"kind": "launched",
                                         "command": [f["executable"], "/v/serve.py", "--model", f["model"],
                                                     "--port", str(8000 + night)]}}
    event = build_identity(config, vllm_version="0.6.3", served_model=f["model"], launch=launch)
    # recorded, then read back as history reads summary.json
    summary = RunSummary.from_json(json.loads(json.dumps({"build": event, "started_at": 1.8e9 + night})))
    return run_record(path=f"/runs/n{night}", summary=summary, events=[], config=config)


@settings(max_examples=200, deadline=None)
@given(_runs)
def test_runs_differing_in_any_identity_field_are_never_pooled_and_equal_ones_are(runs):
    records = [_recorded(label, f, night) for night, (label, f) in enumerate(runs)]
    keys = group_keys(records)
    for i, (label_i, f_i) in enumerate(runs):
        for j, (label_j, f_j) in enumerate(runs):
            same = label_i == label_j and f_i == f_j
            assert (keys[i] == keys[j]) == same, (runs[i], runs[j], keys[i], keys[j])
    # where one label holds several builds, what differs is named, and only what differs
    splits = label_splits([(r.label, k, r.facts) for r, k in zip(records, keys)])
    for split in splits:
        assert len(split.builds) >= 2 and split.differences
        for difference in split.differences:
            assert len(set(difference.values)) > 1


def test_an_env_prefix_is_read_as_the_program_it_runs_with_the_paths_it_sets(tmp_path):
    spec = LaunchSpec(("env", "-u", "PYTHONPATH", "LD_LIBRARY_PATH=/opt/nccl-2.19/lib", sys.executable, "-m", "soak"),
                      {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": "/gone", "LD_LIBRARY_PATH": "/old"}, None)
    launch = read_launch(spec)
    assert launch["executable"]["path"] == os.path.abspath(sys.executable)
    assert launch["script"]["module"] == "soak"
    assert launch["env"] == {"LD_LIBRARY_PATH": "/opt/nccl-2.19/lib", "PYTHONPATH": None}
