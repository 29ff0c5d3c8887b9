"""An unknown key in a run config: one line (exit 2, no traceback) that names the
file, the key's line and the field, and the known key it likely misspells
(``bad.yaml:3: load.concurency: unknown key; did you mean 'concurrency'?``),
for every section of the config."""

from __future__ import annotations

import difflib
import io
import subprocess
import sys
import types
import typing
from contextlib import redirect_stderr

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from soak.cli import main as soak_main
from soak.config import RunConfig
from soak.redact import secret_name
from soak.thresholds.config import ThresholdRule


def _unwrap(annotation):
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _members(annotation):
    annotation = _unwrap(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [_unwrap(a) for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def _tag(model):
    kind = model.model_fields.get("kind")
    return typing.get_args(_unwrap(kind.annotation))[0] if kind is not None else None


def sections():
    """(steps, model) for every section a config can hold: steps are (key, kind or None)."""
    out = []

    def walk(model, steps):
        out.append((steps, model))
        for name, field in model.model_fields.items():
            members = _members(field.annotation)
            models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
            if len(models) > 1 and any(_tag(m) is None for m in models):
                continue  # a union told apart by shape (the distributions), not by a kind
            for member in models:
                walk(member, (*steps, (name, _tag(member) if len(models) > 1 or name in ("target", "gpu") else None)))

    walk(RunConfig, ())
    out.append(((("thresholds", None), ("ttft_p99", None)), ThresholdRule))
    return out


SECTIONS = sections()


def config_text(steps, bad_key):
    """The config as a person writes it, and the line the bad key is on."""
    lines = ["duration: 10s"]
    for depth, (key, kind) in enumerate(steps):
        lines.append("  " * depth + f"{key}:")
        if kind is not None:
            lines.append("  " * (depth + 1) + f"kind: {kind}")
    if steps and steps[0] == ("target", "launched") and len(steps) == 1:
        lines.append("  command: vllm serve m")
    lines.append("  " * len(steps) + f"{bad_key}: 1")
    return "\n".join(lines) + "\n", len(lines)


def misspellings(key):
    out = {key[:i] + key[i + 1:] for i in range(len(key))}  # a letter dropped
    out |= {key[:i] + key[i + 1] + key[i] + key[i + 2:] for i in range(len(key) - 1)}  # two swapped
    out |= {key[:i] + key[i] + key[i:] for i in range(len(key))}  # one doubled
    return sorted(k for k in out if k and k != key)


CASES = [(steps, model, key) for steps, model in SECTIONS for key in model.model_fields if key != "kind"]


def check(tmp_path, capsys, steps, model, key, bad):
    known = list(model.model_fields)
    path = tmp_path / "bad.yaml"
    text, line = config_text(steps, bad)
    path.write_text(text)
    assert soak_main(["validate", str(path)]) == 2, text
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    field = ".".join([k for k, _ in steps] + [bad])
    assert err.startswith(f"soak validate: {path}:{line}: {field}: unknown key"), (text, err)
    near = difflib.get_close_matches(bad, known, n=1, cutoff=0.6)
    if near:
        said = err.split("did you mean '")[1].split("'")[0]
        assert said in known
        ratio = difflib.SequenceMatcher(None, bad, said).ratio()
        assert ratio >= difflib.SequenceMatcher(None, bad, key).ratio()
        if len(key) >= 5 and len([k for k in known if difflib.SequenceMatcher(None, bad, k).ratio() >= ratio]) == 1:
            assert said == key
    else:
        assert "known: " in err and key in err  # nothing close: the keys it knows


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(CASES), st.data())
def test_a_misspelt_key_of_any_section_names_its_line_and_the_key_it_misspells(tmp_path_factory, case, data):
    steps, model, key = case
    # A key named like a credential ("pat", "token") has what follows it masked on stderr, by design.
    options = [m for m in misspellings(key) if m not in model.model_fields and not secret_name(m)]
    if not options:
        return
    bad = data.draw(st.sampled_from(options))
    tmp = tmp_path_factory.mktemp("k")
    buf = io.StringIO()
    with redirect_stderr(buf):  # capsys is per test, hypothesis runs many examples in one
        check(tmp, types.SimpleNamespace(readouterr=lambda: types.SimpleNamespace(err=buf.getvalue())),
              steps, model, key, bad)


def test_every_section_is_reached():
    names = {model.__name__ for _, model in SECTIONS}
    assert {"RunConfig", "LoadConfig", "TimeoutsConfig", "SimConfig", "LaunchedTarget", "AttachedTarget",
            "SyntheticAgenticConfig", "NvmlGpu", "PpTailStallConfig", "CriteriaConfig", "EvidenceConfig",
            "ExporterConfig", "PushgatewayConfig", "ThresholdRule"} <= names


@pytest.mark.parametrize("text, line, field, message", [
    ("duration: 10s\nload:\n  concurency: 3\n", 3, "load.concurency", "unknown key; did you mean 'concurrency'?"),
    ("duraton: 10s\n", 1, "duraton", "unknown key; did you mean 'duration'?"),
    # a misspelt required key is reported as the misspelling, not as the key it left missing
    ("target:\n  kind: attached\n  base_ur: http://127.0.0.1:8000\n", 3, "target.base_ur",
     "unknown key; did you mean 'base_url'?"),
    ("detector:\n  generation_frozen:\n    safty_factor: 2\n", 3, "detector.generation_frozen.safty_factor",
     "unknown key; did you mean 'safety_factor'?"),
    # of two unknown keys, the first in the file
    ("duration: 10s\nload:\n  concurency: 3\nprobes:\n  gpu_intervl: 1s\n", 3, "load.concurency", "unknown key; did you mean"),
    ("duration: 10s\nload:\n  zzz: 3\n", 3, "load.zzz", "unknown key (known: mode, concurrency, "),
])
def test_table(tmp_path, capsys, text, line, field, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert soak_main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"soak validate: {path}:{line}: {field}: {message}"), err


def test_from_a_real_process(tmp_path):
    path = tmp_path / "night.yaml"
    path.write_text("duration: 10s\nload:\n  concurency: 3\n")
    proc = subprocess.run([sys.executable, "-m", "soak", "run", str(path), "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr == f"soak run: {path}:3: load.concurency: unknown key; did you mean 'concurrency'?\n"
    assert not (tmp_path / "run").exists()
