"""The reference file (soak/oracle/reference.py): written whole, read back as it
was written; a damaged or hostile file is one ConfigError naming the file and
line (exit 2), never a traceback or a wait; an entry is used only for the prompt
it was recorded for."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soak.errors import ConfigError
from soak.oracle.answer import Answer, TokenChoice
from soak.oracle.reference import (MAX_FILE_BYTES, ReferenceEntry, ReferenceFile, matching, mismatches,
                                   read_reference, write_reference)

from tests.oracle.helpers import answer, plain, pos, words
from tests.oracle.strategies import answers

HEADER = {"model": "m", "build": "b1", "recorded_at": 1.7e9, "server_version": "0.11.2", "tie_margin": 0.2}
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                          HealthCheck.function_scoped_fixture])


def entry(cid: str, ans: Answer | None = None, *, digest: str = "d", max_tokens: int = 32) -> ReferenceEntry:
    return ReferenceEntry(cid, digest, max_tokens, False, ans or plain(words(f"answer of {cid}")))


def written(tmp_path: Path, *entries: ReferenceEntry, header=HEADER) -> Path:
    path = tmp_path / "ref.jsonl"
    write_reference(path, header=header, entries=entries or (entry("a"),))
    return path


@SETTINGS
@given(st.lists(answers(min_size=1), min_size=1, max_size=5),
       st.text(min_size=1, max_size=20), st.booleans(), st.integers(1, 4096))
def test_a_written_file_reads_back_as_it_was_written(tmp_path, answers_, digest, long, max_tokens) -> None:
    entries = tuple(ReferenceEntry(f"c{i}", digest, max_tokens, long, a) for i, a in enumerate(answers_))
    path = tmp_path / "ref.jsonl"
    write_reference(path, header=HEADER, entries=entries)
    got = read_reference(path)
    assert got.entries == entries
    assert got.header == {"soak_reference": 1, **HEADER}
    assert (got.model, got.build, got.tie_margin) == ("m", "b1", 0.2)


def test_the_format_as_documented(tmp_path) -> None:
    ans = answer(pos("Hi", -0.01, (" Hello", -4.6)), finish="stop")
    path = written(tmp_path, entry("short-0", ans, digest="sha256:ab"))
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"soak_reference": 1, **HEADER}
    assert json.loads(lines[1]) == {
        "canary_id": "short-0", "digest": "sha256:ab", "max_tokens": 32, "long": False,
        "answer": {"tokens": [{"token": "Hi", "logprob": -0.01, "top": [["Hi", -0.01], [" Hello", -4.6]]}],
                   "text": "Hi", "finish_reason": "stop", "model": "m", "malformed": None}}


def test_a_token_no_utf8_can_carry_survives(tmp_path) -> None:
    odd = answer(TokenChoice("\ud800x", -0.5, (("\ud800x", -0.5),)), "\x00", finish="stop")
    assert read_reference(written(tmp_path, entry("a", odd))).entries[0].answer == odd


def test_the_writer_refuses_what_no_reader_could_use(tmp_path) -> None:
    with pytest.raises(ValueError, match="two reference entries"):
        write_reference(tmp_path / "r", header={}, entries=[entry("a"), entry("a")])
    with pytest.raises(ValueError, match="cannot be a reference"):
        write_reference(tmp_path / "r", header={}, entries=[entry("a", Answer(malformed="x"))])
    assert not (tmp_path / "r").exists()


def test_a_rewrite_replaces_the_file_whole(tmp_path) -> None:
    path = written(tmp_path, entry("a"), entry("b"))
    write_reference(path, header=HEADER, entries=[entry("c")])
    assert [e.canary_id for e in read_reference(path).entries] == ["c"]
    assert [p.name for p in tmp_path.iterdir()] == ["ref.jsonl"]


def _raises(path: Path, *, line: int | None = None, text: str = "", field: str | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        read_reference(path)
    err = info.value
    assert err.path == str(path) and err.exit_code == 2 and "\n" not in str(err)
    if line is not None:
        assert err.line == line, str(err)
    if field is not None:
        assert err.field == field, str(err)
    assert text in str(err)
    return err


def test_a_cut_off_last_line_names_its_line(tmp_path) -> None:
    path = written(tmp_path, entry("a"), entry("b"))
    data = path.read_bytes()
    path.write_bytes(data[:-20])
    _raises(path, line=3, text="cut off")


@pytest.mark.parametrize("line,text,field", [
    ('{"soak_reference": 2}', "version 2", "soak_reference"),
    ('{"soak_reference": true}', "version true", "soak_reference"),
    ('{"model": "m"}', "not a soak reference file", None),
    ('[1, 2]', "not a soak reference file", None),
    ('{"soak_reference": 1, "tie_margin": "0.2"}', "must be a number", "tie_margin"),
    ('{"soak_reference": 1, "model": 7}', "must be a string", "model"),
    ('{"soak_reference": 1, "tie_margin": NaN}', "NaN", None),
])
def test_a_bad_header_is_one_line(tmp_path, line, text, field) -> None:
    path = tmp_path / "ref.jsonl"
    path.write_text(line + "\n")
    _raises(path, line=1, text=text, field=field)


GOOD = {"canary_id": "a", "digest": "d", "max_tokens": 8, "long": False,
        "answer": {"tokens": [{"token": "x", "logprob": -1.0, "top": []}], "finish_reason": "stop"}}


@pytest.mark.parametrize("change,field", [
    ({"canary_id": 3}, "canary_id"), ({"canary_id": ""}, "canary_id"), ({"canary_id": "x" * 201}, "canary_id"),
    ({"digest": None}, "digest"), ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 1.5}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"), ({"long": "no"}, "long"), ({"answer": "x"}, "answer"),
    ({"answer": {"tokens": [{"token": 5}]}}, "answer"), ({"answer": {"tokens": []}}, "answer"),
    ({"answer": {"tokens": [], "malformed": "no logprobs"}}, "answer"),
])
def test_an_entry_of_the_wrong_type_names_its_field(tmp_path, change, field) -> None:
    path = tmp_path / "ref.jsonl"
    path.write_text(json.dumps({"soak_reference": 1}) + "\n" + json.dumps({**GOOD, **change}) + "\n")
    _raises(path, line=2, field=field)


@pytest.mark.parametrize("body,text", [
    ('{"canary_id": "a", "answer": {"tokens": [{"token": "x", "logprob": NaN}]}}', "NaN"),
    ('{"canary_id": "a", "digest": 1e999}', "out of range"),
    ("[" * 5000 + "]" * 5000, "nest"),
    ("not json", "invalid JSON"),
    ("\xff\xfe", "UTF-8"),
    ("7", "must be a JSON object"),
])
def test_a_hostile_line_is_one_line(tmp_path, body, text) -> None:
    path = tmp_path / "ref.jsonl"
    path.write_bytes(b'{"soak_reference": 1}\n' + body.encode("utf-8", "surrogateescape").replace(
        "\xff\xfe".encode(), b"\xff\xfe") + b"\n")
    _raises(path, line=2, text=text)


def test_a_second_entry_for_one_canary_is_refused(tmp_path) -> None:
    path = tmp_path / "ref.jsonl"
    path.write_text(json.dumps({"soak_reference": 1}) + "\n" + (json.dumps(GOOD) + "\n") * 2)
    _raises(path, line=3, text="a second entry", field="canary_id")


def test_missing_empty_directory_and_fifo_are_one_line_without_waiting(tmp_path) -> None:
    _raises(tmp_path / "absent.jsonl", text="cannot read")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    _raises(tmp_path / "empty.jsonl", text="no soak_reference header")
    _raises(tmp_path, text="directory")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = threading.Event()
    err: list[BaseException] = []

    def read() -> None:
        try:
            read_reference(fifo)
        except BaseException as exc:  # noqa: BLE001 (handed to the test)
            err.append(exc)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(10), "reading a FIFO with no writer waited"
    assert isinstance(err[0], ConfigError) and "FIFO" in str(err[0])


def test_a_file_past_its_bound_is_refused_unread(tmp_path) -> None:
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk spent
    _raises(path, text="cannot read")


@SETTINGS
@given(st.data())
def test_any_damage_reads_as_a_result_or_one_config_error(tmp_path, data) -> None:
    path = written(tmp_path, entry("a"), entry("b", answer(pos(" x", -0.3, (" y", -0.31)), finish="stop")))
    raw = bytearray(path.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip":
            raw[at] = data.draw(st.integers(0, 255))
        elif action == "cut":
            del raw[at:at + data.draw(st.integers(1, 40))]
        else:
            raw[at:at] = data.draw(st.sampled_from([b"[", b"{", b"NaN", b"\n", b'"', b"\xff", b"1e999"]))
    path.write_bytes(bytes(raw))
    try:
        got = read_reference(path)
    except ConfigError as exc:
        assert exc.path == str(path) and "\n" not in str(exc)
    else:
        assert isinstance(got, ReferenceFile)
        assert all(e.answer.tokens and not e.answer.malformed for e in got.entries)


# ---- which entries a run may use ----

def test_an_entry_is_used_only_for_the_prompt_it_was_recorded_for(tmp_path) -> None:
    f = read_reference(written(tmp_path, entry("a", digest="d1"), entry("b", digest="d2"),
                               entry("c", digest="d3", max_tokens=16), entry("gone", digest="d4")))
    prompts = {"a": "d1", "b": "CHANGED", "c": "d3", "new": "d5"}
    used = matching(f, prompts, max_tokens={"a": 32, "c": 32})
    assert set(used) == {"a"} and used["a"] == f.by_id()["a"].answer
    why = mismatches(f, prompts, max_tokens={"a": 32, "c": 32})
    assert any(w.startswith("canary b: its prompt changed") for w in why)
    assert "canary c: recorded with max_tokens 16, this run asks 32" in why
    assert "canary new: not in the reference file" in why
    assert "reference entry gone: no canary of this run has that id" in why
    assert len(why) == 4


def test_a_file_recorded_for_another_model_is_not_used(tmp_path) -> None:
    f = read_reference(written(tmp_path, entry("a", digest="d1")))
    assert matching(f, {"a": "d1"}, model="other") == {}
    assert mismatches(f, {"a": "d1"}, model="other") == ("canary a: recorded for model 'm', this run serves 'other'",)
    assert set(matching(f, {"a": "d1"}, model="m")) == {"a"}
