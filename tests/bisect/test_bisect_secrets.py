"""A bisect's segment config holds no secret, wherever in the config it stood, and
the segment gets every one back from its environment (soak.bisect.local.seal,
soak.bisect.unseal)."""

from __future__ import annotations

import copy
import string
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soak.bisect.executor import Build
from soak.bisect.local import LocalExecutor, seal, seeded, segment_seed
from soak.bisect.unseal import RUN, resolve, unseal, variable
from soak.redact import Redactor, secret_name

values = st.text(string.ascii_letters + string.digits, min_size=6, max_size=16).map(lambda s: "hunter2" + s)

# Where a secret can stand in a segment config: (how it is put there, by the redactor's rules).
PLACES = {
    "pushgateway_userinfo": lambda c, v: c.setdefault("pushgateway", {}).update(url=f"http://pusher:{v}@127.0.0.1:9"),
    "dashboard_query": lambda c, v: c.setdefault("links", {}).update(dash=f"https://grafana/d/x?api_key={v}&o=1"),
    "command_env_arg": lambda c, v: c["target"]["command"].insert(0, f"HF_TOKEN={v}"),
    "command_qualified_env_arg": lambda c, v: c["target"]["command"].insert(0, f"HF_TOKEN_2={v}"),
    "command_flag": lambda c, v: c["target"]["command"].extend(["--api-key", v]),
    "command_flag_eq": lambda c, v: c["target"]["command"].append(f"--db-pass={v}"),
    "command_url": lambda c, v: c["target"]["command"].extend(["--db-url", f"postgres://u:{v}@db/x"]),
    "target_env": lambda c, v: c["target"].setdefault("env", {}).update(MYSQL_PWD=v),
    "secret_key": lambda c, v: c.setdefault("notify", {}).update(password=v),
    "base_url": lambda c, v: c["target"].update(base_url=f"http://user:{v}@127.0.0.1:18765"),
}


def _config(placed: list[tuple[str, str]], echo: list[tuple[str, str]]) -> dict:
    config = {"name": "s", "duration": "5s", "build": "b0",
              "target": {"kind": "launched", "command": ["vllm", "serve", "m", "--port", "8000"],
                         "startup_timeout": "20s"}}
    for place, value in placed:
        PLACES[place](config, value)
    for field, value in echo:  # a value seen in a secret's place is hidden wherever else it stands
        config.setdefault("labels", {})[field] = f"copy of {value} here"
    return config


placements = st.lists(st.tuples(st.sampled_from(sorted(PLACES)), values), min_size=1, max_size=4,
                      unique_by=lambda placed: placed[0])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(placements, st.data())
def test_no_secret_reaches_the_segment_config_and_the_segment_gets_them_back(tmp_path: Path, placed, data) -> None:
    echo = data.draw(st.lists(st.tuples(st.sampled_from(["note", "owner"]), st.sampled_from([v for _, v in placed])),
                              max_size=2))
    config = _config(placed, echo)
    original = copy.deepcopy(config)
    root = tmp_path / f"b{abs(hash(repr(config)))}"
    executor = LocalExecutor(root=root, segment_configs=[config], envs=[{"A": "1"}], python="py", environ={})
    run_dir = root / "segment-000-build-0"
    argv, path, _ = executor.command(Build(0, "b0"), segment_s=5, run_dir=run_dir)
    written = path.read_text()
    secrets = {v for _, v in placed}
    for value in secrets:
        assert value not in written and value not in " ".join(argv), (value, written)
    assert config == original  # the caller's config is not touched
    env = executor.envs[0]
    assert env["A"] == "1" and secrets <= {v for v in env.values() if any(s in v for s in secrets)} | secrets
    # the segment's start: the run reads the config resolved (the command by its own unseal at exec)
    assert argv[:5] == ["py", "-m", "soak.bisect.unseal", RUN, str(path)]
    got = resolve(yaml.safe_load(written), env, skip=("target", "command"))
    command = got["target"]["command"]
    if command[:3] == ["py", "-m", "soak.bisect.unseal"]:
        got["target"]["command"] = unseal(command[3:], env)
    assert got == seeded(original, segment_seed(0, run_dir))
    # every variable is secret by its name: the segment's run hides its value wherever the server prints it
    redactor = Redactor.for_run(environ=env)
    for name, value in env.items():
        if name != "A":
            assert secret_name(name) and value not in redactor.text(f"server said {value}")


@given(st.integers(min_value=0, max_value=10**6))
def test_the_variables_are_secret_by_construction(index: int) -> None:
    name = variable(index)
    assert secret_name(name), name
    assert Redactor.for_run(environ={name: "hunter2-sealed"}).text("x hunter2-sealed y") == "x *** y"


def test_seal_keeps_the_name_of_name_value_and_flag_value_args() -> None:
    sealed, env = seal({"target": {"kind": "launched",
                                   "command": ["env", "HF_TOKEN=hunter2ENV", "vllm", "--hf-token=hunter2HF",
                                               "--api-key", "abc"]},
                        "pushgateway": {"url": "http://pusher:hunter2PUSH@127.0.0.1:9"}}, python="py")
    command = sealed["target"]["command"]
    assert command[:3] == ["py", "-m", "soak.bisect.unseal"]
    assert command[4].startswith("HF_TOKEN={SOAK_BISECT_") and command[6].startswith("--hf-token={SOAK_BISECT_")
    assert command[8].startswith("{SOAK_BISECT_")  # a short value hidden by its position
    assert "hunter2" not in yaml.safe_dump(sealed)
    assert sorted(env.values()) == sorted(["hunter2ENV", "hunter2HF", "abc", "http://pusher:hunter2PUSH@127.0.0.1:9"])


def test_the_segment_run_reads_its_config_resolved(tmp_path: Path, monkeypatch) -> None:
    import soak.cli
    import soak.config
    from soak.bisect import unseal as unseal_module

    monkeypatch.setattr(soak.config, "read_yaml", soak.config.read_yaml)  # restored after the test
    sealed, env = seal({"name": "s", "pushgateway": {"url": "http://pusher:hunter2PUSH@127.0.0.1:9"},
                        "target": {"kind": "launched", "command": ["vllm", "--api-key", "hunter2KEY"]}}, python="py")
    path = tmp_path / "segment.yaml"
    path.write_text(yaml.safe_dump(sealed))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    seen = {}

    def fake_main(argv):
        seen["argv"] = argv
        seen["data"] = soak.config.read_yaml(argv[1])
        return 0

    monkeypatch.setattr(soak.cli, "main", fake_main)
    assert unseal_module.main([RUN, str(path), "--out", "x"]) == 0
    assert seen["argv"] == ["run", str(path), "--out", "x"]
    assert seen["data"]["pushgateway"]["url"] == "http://pusher:hunter2PUSH@127.0.0.1:9"
    # the command stays sealed until its own unseal execs it (the server's environment loses the variables)
    assert "hunter2KEY" not in repr(seen["data"]["target"]["command"])
    assert unseal(seen["data"]["target"]["command"][3:], env) == ["vllm", "--api-key", "hunter2KEY"]


def test_a_missing_variable_is_one_line_and_exit_2(tmp_path: Path, capsys, monkeypatch) -> None:
    from soak.bisect import unseal as unseal_module

    sealed, env = seal({"pushgateway": {"url": "http://pusher:hunter2PUSH@127.0.0.1:9"}}, python="py")
    path = tmp_path / "segment.yaml"
    path.write_text(yaml.safe_dump(sealed))
    for name in env:
        monkeypatch.delenv(name, raising=False)
    assert unseal_module.main([RUN, str(path)]) == 2
    assert "is not set" in capsys.readouterr().err
