"""docs/config-reference.md is generated from the config models (soak.configref): the
page is current, every key has words, every example is a config that validates, and
every key an error line names is one the reference explains."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from soak.config import RunConfig, check_run_config
from soak.configbase import validation_error_to_config_error
from soak.configref import REGENERATE, entries, find, markdown

PAGE = Path(__file__).resolve().parents[2] / "docs" / "config-reference.md"
ENTRIES = entries()


def test_the_page_is_current():
    current = markdown(ENTRIES)
    on_disk = PAGE.read_text(encoding="utf-8") if PAGE.is_file() else ""
    assert on_disk == current, f"docs/config-reference.md is stale: regenerate with `{REGENERATE}`"


def test_every_key_has_a_type_a_default_and_words():
    keys = [e.key for e in ENTRIES]
    assert len(keys) == len(set(keys)), "a key listed twice"
    missing = [e.key for e in ENTRIES if not e.description.strip()]
    assert not missing, (f"keys with no description: {missing}: add a comment above the field "
                         f"(or a line in soak/configref/text.py), then `{REGENERATE}`")
    assert all(e.type and e.default for e in ENTRIES)
    assert not [e.key for e in ENTRIES if re.search(r"\bissue \d+", e.description)]  # users have no tracker


def test_every_field_of_every_section_is_listed():
    """An independent walk of the models' fields (the tag fields aside): none is left out."""
    names = {e.key.rsplit(".", 1)[-1].removesuffix("[]") for e in ENTRIES}
    from pydantic import BaseModel

    seen, todo, fields = set(), [RunConfig], set()
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            fields.add(name)
            for arg in _types(field.annotation):
                # a distribution is one type, said once in the page's head, not a section
                if isinstance(arg, type) and issubclass(arg, BaseModel) and "dist" not in arg.model_fields:
                    todo.append(arg)
    nested_only = {f for f in fields if f not in names}
    # sections (models) are walked into, not listed; their names are path parts
    parts = {part.removesuffix("[]") for e in ENTRIES for part in e.key.split(".")}
    assert nested_only <= parts, nested_only - parts


def _types(annotation):
    import typing

    yield annotation
    for arg in typing.get_args(annotation):
        yield from _types(arg)


def _valid(data):
    config = RunConfig.model_validate(data, context={"base_dir": Path(".")})
    check_run_config(config, "example.yaml")
    return config


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.key for e in ENTRIES])
def test_each_example_is_a_config_that_validates_and_sets_its_key(entry):
    data = yaml.safe_load(entry.example)
    _valid(data)
    node = data
    for part in entry.yaml_key.split("."):
        part = part.removesuffix("[]")
        node = node[0] if isinstance(node, list) else node
        node = node.get("ttft_p99" if part == "<metric>" else part)
        assert node is not None, f"{entry.example} does not set {entry.yaml_key}"


def _set(data, yaml_key, value):
    node = data
    parts = [p.removesuffix("[]") for p in yaml_key.replace("<metric>", "ttft_p99").split(".")]
    for part in parts[:-1]:
        node = node[part]
        node = node[0] if isinstance(node, list) else node
    node[parts[-1]] = value


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entry=st.sampled_from([e for e in ENTRIES if not e.key.endswith(".kind")]),
       bad=st.sampled_from([[[[]]], {"nested": {"junk": [1]}}, "not-a-valid-value-%%"]))
def test_the_key_an_error_line_names_is_one_the_reference_explains(entry, bad):
    data = yaml.safe_load(entry.example)
    broken = copy.deepcopy(data)
    _set(broken, entry.yaml_key, bad)
    try:
        _valid(broken)
    except ValidationError as exc:
        error = validation_error_to_config_error(exc, "example.yaml", data=broken, model=RunConfig)
    else:
        return  # a value this key takes (a string key, a mapping of names)
    field = error.field or ""
    # the line names the key itself, or a key below it (a mapping's entry): --explain finds it
    while field and not find(field, ENTRIES):
        field = field.rsplit(".", 1)[0] if "." in field else ""
    assert field, f"{error}: no reference entry for the field it names"
    assert any(e.key == entry.key for e in find(field, ENTRIES)) or field != entry.yaml_key


@given(entry=st.sampled_from(ENTRIES), index=st.integers(min_value=0, max_value=9))
def test_find_takes_the_canonical_key_and_the_yaml_key_with_any_list_index(entry, index):
    assert find(entry.key, ENTRIES) == [entry]
    as_written = entry.yaml_key.replace("[]", f"[{index}]").replace("<metric>", "ttft_p99")
    assert entry in find(as_written, ENTRIES)
