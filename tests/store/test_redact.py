"""The redactor every file of the run directory passes (soak/redact.py)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from soak.redact import LineRedactor, Redactor, redact_argv, secret_name


@pytest.mark.parametrize("name", ["--api-key", "--hf-token", "--db-password", "--x-auth", "HF_TOKEN",
                                  "OPENAI_API_KEY", "PGPASSWORD", "AWS_SECRET_ACCESS_KEY", "client_secret",
                                  "--my_weird_client_secret", "Authorization"])
def test_secret_looking_names(name):
    assert secret_name(name)


@pytest.mark.parametrize("name", ["--max-num-batched-tokens", "--tokenizer", "TOKENIZERS_PARALLELISM",
                                  "api_key_env", "prompt_tokens", "--key-file", "AWS_ACCESS_KEY_ID", "PWD"])
def test_names_that_only_contain_a_secret_word_are_not_secret(name):
    assert not secret_name(name)


def test_values_are_hidden_in_every_spelling_and_learned_from_shapes():
    r = Redactor.for_run(environ={"SOAK_KEY": "sk-abc123", "TOKENIZERS_PARALLELISM": "false"},
                         api_key_env="SOAK_KEY", command=["vllm", "--hf-token=hf_zzz9", "--max-num-batched-tokens", "256"])
    line = "vllm serve --api-key sk-abc123 --hf-token=hf_zzz9 --max-num-batched-tokens 256 --odd-secret qq77 x"
    out = r.text(line)
    assert "sk-abc123" not in out and "hf_zzz9" not in out and "qq77" not in out
    assert "--max-num-batched-tokens 256" in out and "false" not in r.values
    # learned from its flag: hidden later where no flag shows it
    assert r.text("echo qq77") == "echo ***"
    assert "sk-abc123" not in r.text(json.dumps({"cmdline": ["x", "--api-key", "sk-abc123"]}))
    assert r.text("non-default args: {'api_key': ['NEWKEY9'], 'max_num_batched_tokens': 256}") == \
        "non-default args: {'api_key': ['***'], 'max_num_batched_tokens': 256}"
    assert r.text("Authorization: Bearer tok-9999") == "Authorization: Bearer ***"
    assert redact_argv(["--api-key", "K1234", "--password=pw", "--flag", "v"]) == \
        ["--api-key", "***", "--password=***", "--flag", "v"]


def test_a_key_split_across_chunks_is_hidden_once_its_line_is_whole():
    r = Redactor(["sk-SPLITKEY42"])
    lines = LineRedactor(r)
    out = lines.feed(b"header ok\nINFO key=sk-SPL") + lines.feed(b"ITKEY42 tail\n") + lines.flush()
    assert b"sk-SPLITKEY42" not in out and out == b"header ok\nINFO key=*** tail\n"


def test_a_huge_line_is_cut_at_a_space_and_never_splits_a_secret():
    r = Redactor(["sk-LONGLINE77"])
    lines = LineRedactor(r, max_line=64)
    data = (b"word " * 20) + b"sk-LONGLINE77 " + (b"more " * 20) + b"\n"
    out = b"".join(lines.feed(data[i:i + 7]) for i in range(0, len(data), 7)) + lines.flush()
    assert b"sk-LONGLINE77" not in out and out.count(b"***") == 1


def test_scrub_tree_rewrites_only_files_holding_a_secret(tmp_path):
    r = Redactor(["sk-SCRUB555"])
    (tmp_path / "a.txt").write_text("x sk-SCRUB555 y")
    (tmp_path / "b.txt").write_text("clean")
    assert r.scrub_tree(tmp_path) == [tmp_path / "a.txt"]
    assert (tmp_path / "a.txt").read_text() == "x *** y"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def test_the_guardian_kills_the_watched_tree_when_its_pipe_closes_and_not_after_done():
    from soak.run.guardian import Guardian

    kept = subprocess.Popen(["sleep", "60"])
    doomed = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60; true"])
    try:
        calm = Guardian(interval_s=0.05)
        calm.start()
        calm.watch(kept.pid)
        time.sleep(0.3)
        calm.close()  # the harness stopped its server itself: nothing killed
        assert _alive(kept.pid)

        guard = Guardian(interval_s=0.05)
        guard.start()
        guard.watch(doomed.pid)
        time.sleep(0.5)  # a walk records the children
        children = [int(p) for p in subprocess.run(["pgrep", "-P", str(doomed.pid)], capture_output=True,
                                                   text=True).stdout.split()]
        assert children
        guard._proc.stdin.close()  # what the harness's death does to the pipe
        guard._proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(p) for p in [doomed.pid, *children]):
            time.sleep(0.05)
        assert not any(_alive(p) for p in [doomed.pid, *children])
        assert _alive(kept.pid)
    finally:
        for p in (kept, doomed):
            p.kill()
            p.wait()


def test_a_redacted_config_yaml_still_parses(tmp_path):
    """A secret that is a whole YAML value becomes a quoted '***', never a bare
    alias marker that breaks yaml.safe_load (at write time and in the final scrub)."""
    import yaml

    from soak.redact import Redactor
    from soak.store.store import RunStore

    redactor = Redactor(["hunter2-secret-value"])
    store = RunStore(tmp_path, clock=None, redactor=redactor)
    store.write_config({"target": {"api_key_env": "K", "token": "hunter2-secret-value",
                                   "command": ["vllm", "serve", "--api-key", "hunter2-secret-value"]}})
    text = (tmp_path / "config.yaml").read_text()
    assert "hunter2" not in text
    loaded = yaml.safe_load(text)
    assert loaded["target"]["token"] == "***" and loaded["target"]["command"][-1] == "***"

    late = tmp_path / "late.yaml"
    late.write_text("build: learned-late-value\nother: [a, learned-late-value]\n")
    redactor.learn("learned-late-value")
    assert redactor.scrub_file(late)
    assert yaml.safe_load(late.read_text()) == {"build": "***", "other": ["a", "***"]}


def test_token_counts_and_positions_are_not_secrets():
    from soak.redact import secret_name

    for name in ("chars_per_token", "max_tokens", "first_token", "--max-num-batched-tokens", "prefix_key",
                 "sort_key", "eos_token"):
        assert not secret_name(name), name
    for name in ("--api-key", "hf_token", "HF_TOKEN", "PGPASSWORD", "X-Auth", "access_token", "openai_api_key"):
        assert secret_name(name), name


@pytest.mark.parametrize("text, secret", [
    ("base_url http://user:KeyInUrl9@h:8000/v1", "KeyInUrl9"),
    ("postgres://u:p@ss@word@db/x", "p@ss@word"),  # the last @ before the host ends the userinfo
    ("https://ghp_abcdefghijkl1234@github.com/o/r", "ghp_abcdefghijkl1234"),  # a token as the user
    ("GET https://h/x?a=1&token=QryTok99&b=2", "QryTok99"),
    ("https://b.s3/x?X-Amz-Credential=AKIA%2F1&X-Amz-Signature=deadbeef77", "deadbeef77"),
    ("https://acct.blob/c?sv=2020&sig=AzSig1234%3D", "AzSig1234%3D"),
    ("https://h/p?accessKey=CamelKey55", "CamelKey55"),
    ("https://h/p?b=c?sig=SecondQ77", "SecondQ77"),  # a second '?' starts a parameter too
    ("Authorization: Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
    ('{"authorization": "Token tok-12345"}', "tok-12345"),
    ('{"line": "vllm:x{api_key=\\"LabelKey7\\"} 1"}', "LabelKey7"),
])
def test_url_and_header_shapes_are_hidden_without_being_told(text, secret):
    out = Redactor().text(text)
    assert secret not in out and "***" in out, out


def test_a_url_without_credentials_is_left_alone():
    text = "GET http://127.0.0.1:8000/v1/models?limit=3&sort_key=id and /metrics; signature=nccl_timeout"
    assert Redactor().text(text) == text


def test_a_variable_or_flag_holding_a_credential_url_is_hidden_whole_and_its_password_everywhere():
    from soak.target.config import redact_target

    r = Redactor.for_run(environ={"DB_URL": "postgres://app:EnvPw3k8L1@db:5432/app", "HOME": "/root"},
                         command=["vllm", "--db-url", "mysql://u:FlagPw7x9@h/x", "--up=https://h/?token=QTok8c2V"])
    assert r.text("DB_URL=postgres://app:EnvPw3k8L1@db:5432/app") == "DB_URL=***"
    assert r.text("--db-url mysql://u:FlagPw7x9@h/x --up=https://h/?token=QTok8c2V") == "--db-url *** --up=***"
    assert r.text("password was EnvPw3k8L1 / FlagPw7x9") == "password was *** / ***"
    assert "/root" not in r.values
    target = redact_target({"kind": "launched", "base_url": "http://127.0.0.1:8000",
                            "command": ["vllm", "--db-url", "mysql://u:FlagPw7x9@h/x", "--api-key", "k"],
                            "env": {"DB_URL": "postgres://app:EnvPw3k8L1@db/app", "OTHER": "plain"}})
    assert target["command"] == ["vllm", "--db-url", "***", "--api-key", "***"]
    assert target["env"] == {"DB_URL": "***", "OTHER": "plain"}


def test_the_cli_streams_hide_secrets_in_argparse_and_error_lines(capsys):
    from soak.cli import main

    assert main(["run", "/nonexistent/cfg.yaml", "--duration", "http://u:ArgSecret12@h/"]) in (2, 3)
    err = capsys.readouterr().err
    assert "ArgSecret12" not in err and err.strip()


def test_base_url_credentials_are_refused_with_one_line_naming_the_field():
    from pydantic import TypeAdapter, ValidationError

    from soak.target.config import TargetConfig

    for extra in ({}, {"api_key_env": "KEY_VAR"}):
        for url in ("http://user:UrlPw12345@127.0.0.1:8000", "http://127.0.0.1:8000/?token=Tk12345",
                    "http://tok@127.0.0.1:8000"):
            with pytest.raises(ValidationError) as info:
                TypeAdapter(TargetConfig).validate_python({"kind": "attached", "base_url": url, **extra})
            error = info.value.errors()[0]
            assert error["loc"][-1] == "base_url" and "UrlPw12345" not in error["msg"] and "Tk12345" not in error["msg"]


def test_the_report_scrub_leaves_inline_images_whole(tmp_path):
    import base64

    blob = base64.b64encode(b"\x00" * 30 + b"aKey=" + b"\xff" * 40 + b"xKEY=zz token=1").decode()
    blob = blob[:20] + "aKey=QQQQ" + blob[20:]  # a base64 run that reads like ``Key=`` by chance
    page = tmp_path / "report.html"
    page.write_text(f"<img src='data:image/png;base64,{blob}'><p>--api-key sk-Visible99</p>")
    assert Redactor().scrub_file(page, shapes=True)
    text = page.read_text()
    assert blob in text and "sk-Visible99" not in text
