"""An unknown key in a workload file a run config names by path gets what the
run config's own keys get: one line, exit 2, the file and the key's line, and
the known key it likely misspells (``wl.yaml:5: think_tim_s: unknown key; did
you mean 'think_time_s'?``), before any error the misspelling causes (a
required key it left missing). Any one slip of a known key, in any section of
any workload kind, names the key meant."""

from __future__ import annotations

import io
import string
import subprocess
import sys
import types
import typing
from contextlib import redirect_stderr
from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from soak.cli import main as soak_main
from soak.configkeys import one_edit, suggestion
from soak.redact import secret_name
from soak.workload.config import MooncakeTraceConfig, ReplayJsonlConfig, SyntheticAgenticConfig

TAGS = ("kind", "dist")


def _members(annotation) -> list:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def _tag(model) -> tuple[str, str] | None:
    for name in TAGS:
        if name in model.model_fields:
            return name, typing.get_args(model.model_fields[name].annotation)[0]
    return None


def sections() -> list[tuple[str, tuple[tuple[str, tuple[str, str] | None], ...], type[BaseModel]]]:
    """(kind, steps, model): every section a workload file of each kind can hold,
    each step a key and the tag (``kind: x``, ``dist: y``) its value needs."""
    out = []

    def walk(kind, model, steps):
        out.append((kind, steps, model))
        for name, field in model.model_fields.items():
            for member in _members(field.annotation):
                if isinstance(member, type) and issubclass(member, BaseModel):
                    walk(kind, member, (*steps, (name, _tag(member))))

    for model in (SyntheticAgenticConfig, ReplayJsonlConfig, MooncakeTraceConfig):
        walk(model.model_fields["kind"].default, model, ())
    return out


CASES = [(kind, steps, model, key) for kind, steps, model in sections() for key in model.model_fields
         if key not in TAGS]


def workload_text(kind: str, steps, bad: str, *, nested: bool) -> tuple[str, int]:
    """A workload file as a person writes it, and the line the bad key is on."""
    indent = "  " if nested else ""
    lines = ["# tonight's workload", "workload:"] if nested else ["# tonight's workload"]
    lines.append(f"{indent}kind: {kind}")
    for depth, (key, tag) in enumerate(steps, start=1):
        lines.append(indent + "  " * (depth - 1) + f"{key}:")
        if tag is not None:
            lines.append(indent + "  " * depth + f"{tag[0]}: {tag[1]}")
    lines.append(indent + "  " * len(steps) + f"{bad}: 1")
    return "\n".join(lines) + "\n", len(lines)


def slips(key: str) -> set[str]:
    """Every key one slip away: a letter dropped, added, changed, two neighbours swapped."""
    letters = string.ascii_lowercase + "_"
    out = {key[:i] + key[i + 1:] for i in range(len(key))}
    out |= {key[:i] + key[i + 1] + key[i] + key[i + 2:] for i in range(len(key) - 1)}
    out |= {key[:i] + c + key[i:] for i in range(len(key) + 1) for c in letters}
    out |= {key[:i] + c + key[i + 1:] for i in range(len(key)) for c in letters}
    return out


def _plain_key(bad: str) -> bool:
    """YAML reads ``bad: 1`` as that key (not a boolean, a null or a number)."""
    try:
        return yaml.safe_load(f"{bad}: 1") == {bad: 1}
    except yaml.YAMLError:
        return False


def _validate(config: Path) -> tuple[int, str]:
    buf = io.StringIO()
    with redirect_stderr(buf):  # capsys is per test; hypothesis runs many examples in one
        code = soak_main(["validate", str(config)])
    return code, buf.getvalue()


def _meant(known: list[str], key: str) -> list[str]:
    """The slips of ``key`` that mean it: not a known key, not one slip from another."""
    return sorted(b for b in slips(key) if b and b not in known and not [k for k in known if k != key and one_edit(b, k)])


def test_every_one_slip_of_every_workload_key_suggests_the_key_meant() -> None:
    # all of them (about 50,000): a sample would miss the few difflib alone got wrong
    wrong = [(key, bad, suggestion(bad, list(model.model_fields))) for _, _, model, key in CASES
             for bad in _meant(list(model.model_fields), key) if suggestion(bad, list(model.model_fields)) != key]
    assert not wrong, wrong[:10]


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(CASES), st.booleans(), st.data())
def test_any_one_slip_of_a_known_workload_key_names_the_key_meant_and_its_line(
        tmp_path_factory, case, nested: bool, data) -> None:
    kind, steps, model, key = case
    known = list(model.model_fields)
    # a slip one edit from two known keys could mean either: no reader can name "the" key
    options = [b for b in _meant(known, key) if _plain_key(b) and not secret_name(b)]
    bad = data.draw(st.sampled_from(options))
    tmp = tmp_path_factory.mktemp("w")
    text, line = workload_text(kind, steps, bad, nested=nested)
    (tmp / "wl.yaml").write_text(text)
    (tmp / "run.yaml").write_text("duration: 10s\nworkload: wl.yaml\n")
    code, err = _validate(tmp / "run.yaml")
    assert code == 2, (text, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    field = ".".join((["workload"] if nested else []) + [k for k, _ in steps] + [bad])
    assert err.strip() == f"soak validate: {tmp / 'wl.yaml'}:{line}: {field}: unknown key; did you mean {key!r}?", text


def test_every_kind_and_its_nested_sections_are_reached() -> None:
    names = {model.__name__ for _, _, model in sections()}
    assert {"SyntheticAgenticConfig", "ReplayJsonlConfig", "MooncakeTraceConfig", "UniformDist", "LognormalDist",
            "ConstantDist", "EstimateTokenizer", "DirectoryCorpus", "ServiceAssumptions"} <= names


def test_a_misspelt_key_beside_a_broken_one_is_named_first(tmp_path) -> None:
    # the misspelling is the cause: the error it leaves behind (a distribution without
    # its "high") and a later validator's complaint both come second
    (tmp_path / "wl.yaml").write_text(
        "kind: synthetic_agentic\nmin_context_tokens: 2000\nmax_context_tokens: 8000\n"
        "start_context_tokens: {dist: uniform, low: 2000, hihg: 3000}\nmai_context_tokens: 9000\n")
    (tmp_path / "run.yaml").write_text("duration: 10s\nworkload: wl.yaml\n")
    code, err = _validate(tmp_path / "run.yaml")
    assert code == 2
    assert err.strip() == (f"soak validate: {tmp_path / 'wl.yaml'}:4: start_context_tokens.hihg: "
                           "unknown key; did you mean 'high'?")
    (tmp_path / "wl.yaml").write_text("kind: synthetic_agentic\nmai_context_tokens: 9000\n")
    code, err = _validate(tmp_path / "run.yaml")
    assert err.strip().endswith(":2: mai_context_tokens: unknown key; did you mean 'max_context_tokens'?"), err


def test_from_a_real_process(tmp_path) -> None:
    (tmp_path / "wl.yaml").write_text("kind: synthetic_agentic\nthink_tim_s: 0.2\n")
    (tmp_path / "night.yaml").write_text("duration: 10s\nworkload: wl.yaml\n")
    proc = subprocess.run([sys.executable, "-m", "soak", "run", str(tmp_path / "night.yaml"), "--out",
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == f"soak run: {tmp_path / 'wl.yaml'}:2: think_tim_s: unknown key; did you mean 'think_time_s'?\n"
    assert not (tmp_path / "run").exists()
