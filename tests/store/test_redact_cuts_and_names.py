"""Cut-then-redact, qualified secret names (soak/redact.py): properties. (A value that
starts with ``-`` is a flag to the shape rule, not a value: the secrets here start otherwise.)"""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.redact import CUT, MIN_SECRET_LEN, Redactor, clip, secret_name

SECRET_CHARS = string.ascii_letters + string.digits + "_-"
secrets = st.text(SECRET_CHARS, min_size=MIN_SECRET_LEN + 4, max_size=40).filter(lambda s: s[0].isalnum()).filter(lambda s: s.lower() not in (
    "true", "false"))


def _pieces(text: str, secret: str) -> list[str]:
    """Every run of MIN_SECRET_LEN or more characters of ``secret`` that shows in ``text``."""
    return [secret[i:i + MIN_SECRET_LEN] for i in range(len(secret) - MIN_SECRET_LEN + 1)
            if secret[i:i + MIN_SECRET_LEN] in text]


def _leaks(text: str, secret: str) -> bool:
    # a head or a tail of the secret at least MIN_SECRET_LEN long (what a cut leaves)
    return any(secret[:k] in text or secret[-k:] in text for k in range(MIN_SECRET_LEN, len(secret) + 1))


@settings(max_examples=300, deadline=None)
@given(secrets, st.integers(min_value=0, max_value=140),
       st.sampled_from([
           "vllm serve m --db-url postgres://soak:{s}@db.internal:5432/x --port 8000",
           "python -m app --api-key {s} --max-num-batched-tokens 256",
           "env HF_TOKEN={s} vllm serve m",
           "curl https://h/v1/x?token={s}&a=b",
           "worker DB_PASS={s} MYSQL_PWD={s} run",
       ]))
def test_a_cut_anywhere_never_leaves_part_of_a_secret(secret: str, n: int, shape: str) -> None:
    text = shape.format(s=secret)
    out = clip(text, n)
    assert len(out) <= max(n, len(CUT))
    assert not _leaks(out, secret), (text, n, out)
    # the run's redactor, which knows the value, passes it on untouched by a later writer
    known = Redactor([secret])
    assert not _leaks(known.text(out), secret)
    assert not _leaks(clip(text, n, known), secret)


@settings(max_examples=300, deadline=None)
@given(secrets, st.text(string.ascii_letters + " :/=@", max_size=30), st.integers(min_value=MIN_SECRET_LEN),
       st.sampled_from(["", CUT, "...", CUT + " more text after"]))
def test_a_known_secret_cut_short_is_hidden_before_a_cut_mark_or_the_end(
        secret: str, lead: str, k: int, tail: str) -> None:
    k = min(k, len(secret) - 1)
    text = lead + secret[:k] + tail  # a writer cut the value, wherever, with or without a mark
    out = Redactor([secret]).text(text)
    assert secret[:k] not in out, (text, out)


def test_clip_redacts_the_whole_line_before_the_cut() -> None:
    line = "--db-url postgres://soak:hunter2LONGPASSWORD@db.internal:5432/x"
    for n in range(len(line) + 2):
        out = clip(line, n)
        assert "hunt" not in out and "LONGPAS" not in out, (n, out)
    assert clip(line, 200) == "--db-url postgres://***@db.internal:5432/x"
    assert clip("short line", 100) == "short line"
    assert clip("a" * 50, 10) == "a" * 9 + CUT


def test_a_head_of_a_url_is_not_a_head_of_its_scheme() -> None:
    r = Redactor(["https://u:pw1234@host/x"])
    assert r.text("served via https") == "served via https"


QUALIFIERS = ["2", "1", "02", "v2", "prod", "dev", "staging", "test", "old", "new", "primary", "secondary",
              "backup"]
SECRET_WORDS = ["token", "key", "api_key", "password", "secret", "passwd", "pass", "pwd", "pw", "credential",
                "access_token", "auth"]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["HF", "DB", "MYSQL", "OPENAI", "my", "app"]), st.sampled_from(SECRET_WORDS),
       st.lists(st.sampled_from(QUALIFIERS), max_size=2), st.sampled_from(["_", "-", "."]),
       st.sampled_from([str.upper, str.lower]), st.booleans())
def test_a_secret_word_with_qualifiers_after_it_is_still_secret(lead, word, qualifiers, sep, case, flag) -> None:
    name = case(sep.join([lead, word, *qualifiers]))
    if flag:
        name = "--" + name
    assert secret_name(name), name


@pytest.mark.parametrize("name", ["HF_TOKEN_2", "API_KEY_1", "DB_PASSWORD2", "API_KEY_PROD", "MYSQL_PWD", "DB_PASS",
                                  "--db-pass", "SECRET_VALUE", "secret-value", "PASSWORD_OLD", "HFToken2"])
def test_names_the_reviewer_found(name: str) -> None:
    assert secret_name(name)


@pytest.mark.parametrize("name", ["--max-num-batched-tokens", "max_tokens", "TOKENIZERS_PARALLELISM", "--tokenizer",
                                  "chars_per_token", "first_token", "KEY_PATH", "KEY_PATH_2", "API_KEY_FILE",
                                  "secret_file", "SECRET_DIR", "--pass-through", "PWD", "OLDPWD", "PASS",
                                  "max_tokens_2", "prompt_tokens_v2", "api_key_env", "AWS_ACCESS_KEY_ID", "bypass",
                                  "--max-model-len", "compass", "password_min_length"])
def test_ordinary_names_stay_ordinary(name: str) -> None:
    assert not secret_name(name)


@pytest.mark.parametrize("text", ["--db-pass {s} --port 1", "MYSQL_PWD={s} x", "HF_TOKEN_2={s}", "API_KEY_PROD: {s}",
                                  '{{"SECRET_VALUE": "{s}"}}', "DB_PASSWORD2={s}", "--api-key-v2 {s}"])
def test_the_shape_rule_finds_values_after_the_new_names(text: str) -> None:
    r = Redactor()
    out = r.text(text.format(s="hunter2VALUE"))
    assert "hunter2" not in out, out
    assert r.text("echo hunter2VALUE") == "echo ***"  # learned


def test_the_shells_pwd_is_not_learned() -> None:
    r = Redactor.for_run(environ={"PWD": "/home/someone/work", "OLDPWD": "/tmp/x"})
    assert r.text("cd /home/someone/work") == "cd /home/someone/work"
