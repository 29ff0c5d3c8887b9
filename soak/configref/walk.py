"""The config reference, generated from the config models themselves, so it cannot drift.

``entries()`` walks ``soak.config.RunConfig``: every key with its dotted path, its
type in words, default, unit, description and one example. Descriptions come from
the source: the comment above a field (or beside it), else a ``key: value  # ...``
line of the section module's docstring, else ``soak.configref.text``'s table.
Tagged unions (target, workload, corpus, tokenizer, GPU source, simulated faults)
put the variant's tag in the key: ``target.launched.command``; the key as the YAML
(and every error line) names it, ``target.command``, finds it too.

``python -m soak.configref > docs/config-reference.md`` writes the page;
``soak validate --explain KEY`` prints one entry (``soak.configref.lookup``).
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from soak.configref.text import COMPANIONS, DESCRIPTIONS, EXAMPLES, UNITS

TAGS = ("kind", "dist")


@dataclass(frozen=True)
class Entry:
    key: str  # canonical: the variant's tag included (target.launched.command)
    yaml_key: str  # as the YAML file and error lines name it (target.command)
    section: str
    variant: str  # "" or where the tag sits: "target kind launched"
    type: str
    default: str
    unit: str
    description: str
    example: str  # a YAML one-liner that validates

    @property
    def summary(self) -> str:
        """The description's first sentence: one line for the page's table."""
        return _first_sentence(self.description)


@dataclass(frozen=True)
class _Where:
    key: tuple[str, ...]
    yaml: tuple[str, ...]
    # (yaml path, tag field, tag, the variant's required keys with sample values)
    variants: tuple[tuple[tuple[str, ...], str, str, dict[str, Any]], ...]


def _first_sentence(text: str) -> str:
    match = re.search(r"(?<!e\.g)(?<!i\.e)[.]\s", text)
    return text[: match.start() + 1] if match else text


# -- types -------------------------------------------------------------------


def _peel(annotation: Any) -> tuple[Any, list[Any]]:
    """(the annotation without Annotated, every metadata item, nested FieldInfo flattened)."""
    found: list[Any] = []
    while typing.get_origin(annotation) is typing.Annotated:
        args = typing.get_args(annotation)
        annotation, found = args[0], [*found, *args[1:]]
    flat: list[Any] = []
    for item in found:
        flat.extend(item.metadata if isinstance(item, FieldInfo) else [item])
    return annotation, flat


def _union(annotation: Any) -> list[Any] | None:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return list(typing.get_args(annotation))
    return None


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _tag_of(model: type[BaseModel]) -> tuple[str, str] | None:
    for name in TAGS:
        field = model.model_fields.get(name)
        if field is not None and isinstance(field.default, str):
            return name, field.default
    return None


def _is_duration(metadata: Sequence[Any]) -> bool:
    from soak.durations import parse_duration

    return any(getattr(m, "func", None) is parse_duration for m in metadata)


def _bounds(metadata: Sequence[Any]) -> str:
    low = next(((">=", m.ge) for m in metadata if getattr(m, "ge", None) is not None), None) \
        or next(((">", m.gt) for m in metadata if getattr(m, "gt", None) is not None), None)
    high = next(((("<=", m.le)) for m in metadata if getattr(m, "le", None) is not None), None) \
        or next((("<", m.lt) for m in metadata if getattr(m, "lt", None) is not None), None)
    if low and high and low[0] == ">=" and high[0] == "<=":
        return f" {low[1]:g}..{high[1]:g}"
    return "".join(f" {pair[0]} {pair[1]:g}" for pair in (low, high) if pair)


def type_words(annotation: Any, metadata: Sequence[Any] = ()) -> str:
    """A type as a person reads it: "duration > 0", "integer 1..64", "one of stop | restart"."""
    annotation, inner = _peel(annotation)
    metadata = [*metadata, *inner]
    members = _union(annotation)
    if members is not None:
        real = [m for m in members if m is not type(None)]
        words = " or ".join(type_words(m) for m in real) if len(real) > 1 else type_words(real[0], metadata)
        return f"{words}, or null" if type(None) in members else words
    if any(getattr(m, "func", None).__name__ == "_fraction" for m in metadata if hasattr(m, "func")):
        return "fraction 0..1 (0.05, or 5%)"
    if _is_duration(metadata):
        return "duration" + _bounds(metadata)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return "one of " + " | ".join(str(a) for a in args) if len(args) > 1 else f"{args[0]}"
    if origin in (list, tuple, typing.Sequence):
        return f"list of {type_words(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping of {type_words(args[0])} to {type_words(args[1])}"
    simple = {bool: "true | false", int: "integer", float: "number", str: "string"}
    if annotation in simple:
        return simple[annotation] + ("" if annotation in (bool, str) else _bounds(metadata))
    name = getattr(annotation, "__name__", str(annotation))
    return {"Path": "path (relative: beside the config)"}.get(name, name)


def _is_distribution(members: Sequence[Any]) -> bool:
    return all(_is_model(m) and "dist" in m.model_fields for m in members)


# -- descriptions from the source -------------------------------------------


def _clean(text: str) -> str:
    """Comment text for users: one paragraph, no issue numbers of this project."""
    text = re.sub(r"\s+", " ", text).strip().replace("``", "`")
    text = re.sub(r"\s*\([\w-]*#\d+\)", "", text)  # an upstream tracker's number: not the user's page
    text = re.sub(r"\(issue \d+(, )?", "(", text).replace("()", "").replace("( ", "(")
    return re.sub(r"\s+\(\)", "", text)


def _class_comments(cls: type, modules: dict[str, Any]) -> dict[str, str]:
    """field -> the comment above it (contiguous comment lines) or on its line.
    ``modules``: each module's (lines, tree), parsed once per walk."""
    if cls.__module__ not in modules:
        try:
            source = inspect.getsource(sys.modules[cls.__module__])
            modules[cls.__module__] = (source.splitlines(), ast.parse(source))
        except (OSError, TypeError, KeyError):
            modules[cls.__module__] = ([], ast.Module(body=[], type_ignores=[]))
    lines, tree = modules[cls.__module__]
    out: dict[str, str] = {}
    body = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__), None)
    for node in getattr(body, "body", []):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        index = node.lineno - 2
        while index >= 0 and lines[index].strip().startswith("#"):
            above.insert(0, lines[index].strip().lstrip("#").strip())
            index -= 1
        beside = [m.group(1) for line in lines[node.lineno - 1:node.end_lineno]
                  for m in [re.search(r"\)?\s#\s?(.*)$", line)] if m and "#" not in line.split("#")[0]]
        text = " ".join(above) or " ".join(beside)
        if text and not re.match(r"^(noqa|type:)", text):
            out[node.target.id] = _clean(text)
    return out


def _docstring_keys(cls: type) -> dict[str, str]:
    """key -> comment from the ``key: value  # comment`` lines of cls's module docstring."""
    doc = inspect.getdoc(sys.modules.get(cls.__module__)) or ""
    out: dict[str, str] = {}
    last = None
    for line in doc.splitlines():
        match = re.match(r"^\s*(\w+):\s.*?\s#\s+(.*)$", line)
        more = re.match(r"^\s+#\s+(.*)$", line)
        if match:
            last = match.group(1)
            out[last] = match.group(2)
        elif more and last is not None:
            out[last] += " " + more.group(1)
        else:
            last = None
    return {k: _clean(v) for k, v in out.items()}


class _Sources:
    """Comments read once per class during one walk (no module-level cache)."""

    def __init__(self) -> None:
        self._comments: dict[type, dict[str, str]] = {}
        self._modules: dict[str, Any] = {}
        self._docstrings: dict[type, dict[str, str]] = {}

    def describe(self, model: type[BaseModel], name: str, field: FieldInfo, key: str) -> str:
        if key in DESCRIPTIONS:
            return DESCRIPTIONS[key]
        classes = [c for c in model.__mro__ if isinstance(c, type) and issubclass(c, BaseModel)]
        for cls in classes:
            if f"{cls.__name__}.{name}" in DESCRIPTIONS:
                return DESCRIPTIONS[f"{cls.__name__}.{name}"]
        if field.description:
            return _clean(field.description)
        for cls in classes:
            if cls not in self._comments:
                self._comments[cls] = _class_comments(cls, self._modules)
            if name in self._comments[cls]:
                return self._comments[cls][name]
        for cls in classes:
            if cls not in self._docstrings:
                self._docstrings[cls] = _docstring_keys(cls)
            found = self._docstrings[cls].get(name)
            if found:
                return found
        for cls in classes:  # the class's docstring, or a sibling's comment, that names the field
            for text in (_clean(inspect.getdoc(cls) or ""), *self._comments.get(cls, {}).values()):
                if f"``{name}``" in text or f"`{name}`" in text:
                    return text.replace("``", "`")
        if name in TAGS:  # a section's tag outside a union: it has the one value
            return f"The {name} of this section (the one value it takes)."
        return DESCRIPTIONS["enabled"] if name == "enabled" else ""


# -- defaults, units, examples ------------------------------------------------


def _value(value: Any, duration: bool) -> Any:
    from soak.durations import format_duration

    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_defaults=True) or {}
    if duration and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format_duration(float(value))
    if isinstance(value, tuple):
        return list(value)
    return value


_PLAIN = re.compile(r"^[A-Za-z0-9_/<][A-Za-z0-9_./<>=+ -]*$")
_SPECIAL = re.compile(r"^(true|false|yes|no|on|off|null|~|y|n)$", re.IGNORECASE)


def _reads_as_text(text: str) -> bool:
    """Does YAML read this plain scalar back as the same string (not 8000, 1e3 or 1:30)?"""
    import yaml

    return yaml.safe_load(text) == text


def _yaml(value: Any) -> str:
    """A value as YAML flow style, on one line (PyYAML's emitter is ~100x slower)."""
    import json

    if isinstance(value, dict):
        return "{" + ", ".join(f"{_yaml(k)}: {_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (int, float)):
        return json.dumps(value)
    text = str(value)
    if _PLAIN.match(text) and not _SPECIAL.match(text) and not text.endswith(" ") and " -" not in text:
        if not text[0].isdigit() or _reads_as_text(text):
            return text
    return json.dumps(text)  # a JSON string is a YAML double-quoted scalar


def _default(field: FieldInfo, duration: bool) -> tuple[str, Any]:
    if field.is_required():
        return "required", None
    value = field.get_default(call_default_factory=True)
    return ("null" if value is None else _yaml(_value(value, duration))), value


def _unit(name: str, key: str, duration: bool) -> str:
    if key in UNITS:
        return UNITS[key]
    if duration:
        return "seconds (write 30s, 5m, 2h)"
    for suffix, unit in (("_mib", "MiB"), ("_pct", "%"), ("_w", "W"), ("_hours", "hours"), ("_bytes", "bytes"),
                         ("max_bytes", "bytes"), ("_per_s", "per second"), ("_tokens", "tokens"), ("_s", "seconds")):
        if name.endswith(suffix):
            return unit
    return ""


def _sample(annotation: Any, metadata: Sequence[Any], default: Any, duration: bool) -> Any:
    """A valid value unlike the default, from the type alone."""
    annotation, inner = _peel(annotation)
    metadata = [*metadata, *inner]
    members = _union(annotation)
    if members is not None:
        real = [m for m in members if m is not type(None)]
        return _sample(real[0], metadata, None, duration) if _is_distribution(real) is False or len(real) == 1 \
            else {"dist": "uniform", "low": 1, "high": 2}
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if duration or _is_duration(metadata):
        high = next((m.le for m in metadata if getattr(m, "le", None) is not None), None)
        seconds = (default * 2 if isinstance(default, (int, float)) and default else 30.0)
        return _value(min(seconds, high) if high is not None else seconds, True)
    if origin is typing.Literal:
        return next((a for a in args if a != default), args[0])
    if annotation is bool:
        return not default if isinstance(default, bool) else True
    if annotation in (int, float):
        low = next((m.ge for m in metadata if getattr(m, "ge", None) is not None), None)
        low = low if low is not None else next((m.gt for m in metadata if getattr(m, "gt", None) is not None), 0)
        high = next((m.le for m in metadata if getattr(m, "le", None) is not None), None)
        high = high if high is not None else next((m.lt for m in metadata if getattr(m, "lt", None) is not None), None)
        value: Any = (default * 2 if isinstance(default, (int, float)) and default else low + 1)
        if high is not None and value >= high:
            value = (low + high) / 2 if annotation is float else max(int(low), int(high) - 1)
        return int(value) if annotation is int else round(float(value), 6)
    if origin in (list, tuple):
        return [_sample(args[0], (), None, False)] if args else []
    if origin is dict:
        return {"NAME": "value"}
    if getattr(annotation, "__name__", "") == "Path":
        return "path/to/file"
    return "text"


def _nest(path: Sequence[str], leaf: dict[str, Any]) -> dict[str, Any]:
    out: Any = leaf
    for part in reversed(path):
        out = {part: out}
    return out


def _example(where: _Where, name: str, value: Any, required: dict[str, Any]) -> str:
    """``{section: {kind: X, key: value}}`` as one YAML line: the variant's tags and
    required siblings (and COMPANIONS' cross-field needs) included, so it validates."""
    data: dict[str, Any] = {}
    yaml_key = ".".join(where.yaml)
    leaf: dict[str, Any] = {}
    for path, tag_field, tag, _ in where.variants:
        if path == where.yaml:
            leaf[tag_field] = tag
    leaf.update({k: v for k, v in required.items() if k != name})
    leaf[name] = value
    data = _nest([_plain(p) for p in where.yaml], leaf)
    lists = [i for i, p in enumerate(where.yaml) if p.endswith("[]")]
    for index in lists:  # a list of sections: the example has one
        node = data
        for part in where.yaml[:index]:
            node = node[_plain(part)]
        node[_plain(where.yaml[index])] = [node[_plain(where.yaml[index])]]
    for path, tag_field, tag, outer in where.variants:  # outer variants' tags and required keys
        if path != where.yaml:
            node = data
            for part in path:
                node = node[_plain(part)]
                node = node[0] if isinstance(node, list) else node
            node.setdefault(tag_field, tag)
            for key, value in outer.items():
                node.setdefault(key, value)
    for extra_key, extra in COMPANIONS.items():
        if f"{yaml_key}.{name}".startswith(extra_key):
            data = _merge(data, extra(name) if callable(extra) else extra)
    return _yaml(data)


def _plain(part: str) -> str:
    """A key path's part as the YAML holds it: a list's marker dropped, a metric named."""
    return "ttft_p99" if part == "<metric>" else part.removesuffix("[]")


def _merge(a: Any, b: Any) -> Any:
    """``a`` with what ``b`` adds; ``a``'s own values win (the example's key stays itself)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {**a, **{k: _merge(a[k], v) if k in a else v for k, v in b.items()}}
    return a


# -- the walk -----------------------------------------------------------------


def entries(model: type[BaseModel] | None = None) -> tuple[Entry, ...]:
    """Every key of the run config, in the order the models declare them."""
    if model is None:
        from soak.config import RunConfig

        model = RunConfig
    sources = _Sources()
    return tuple(_walk(model, _Where((), (), ()), sources))


def _required(model: type[BaseModel], where: _Where) -> dict[str, Any]:
    out = {}
    for name, field in model.model_fields.items():
        if field.is_required():
            key = ".".join([*where.key, name])
            out[name] = EXAMPLES.get(key, _sample(field.annotation, field.metadata, None, _is_duration(field.metadata)))
    return out


def _walk(model: type[BaseModel], where: _Where, sources: _Sources) -> Iterator[Entry]:
    required = _required(model, where)
    for name, field in model.model_fields.items():
        annotation, inner = _peel(field.annotation)
        metadata = [*field.metadata, *inner]
        members = _union(annotation)
        real = [_peel(m)[0] for m in (members or [annotation]) if m is not type(None)]
        models = [m for m in real if _is_model(m)]
        key, yaml_key = (*where.key, name), (*where.yaml, name)
        child = _Where(key, yaml_key, where.variants)
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if name in TAGS and _tag_of(model) and where.variants and where.variants[-1][0] == where.yaml:
            continue  # the tag is its union's own entry
        if models and len(models) == len(real) and not _is_distribution(models):
            if len(models) == 1:
                yield from _walk(models[0], child, sources)
                continue
            yield from _union_entries(model, name, field, models, child, where, sources, required)
            continue
        inner_members = [_peel(m)[0] for m in (_union(_peel(args[-1])[0]) or [args[-1]])] \
            if origin in (list, dict) and args else []
        if inner_members and all(_is_model(m) for m in inner_members):
            part = "[]" if origin is list else "<metric>"
            if origin is list:
                child = _Where((*where.key, name + "[]"), (*where.yaml, name + "[]"), where.variants)
            else:
                child = _Where((*key, part), (*yaml_key, part), where.variants)
            if len(inner_members) == 1:
                yield from _walk(inner_members[0], child, sources)
            else:
                yield from _union_entries(model, name, field, inner_members, child, where, sources, required,
                                          list_of=True)
            continue
        yield _leaf(model, name, field, where, sources, required)


def _union_entries(model: type[BaseModel], name: str, field: FieldInfo, models: list[type[BaseModel]],
                   child: _Where, where: _Where, sources: _Sources, required: dict[str, Any], *,
                   list_of: bool = False) -> Iterator[Entry]:
    tags = [t for t in (_tag_of(m) for m in models) if t is not None]
    tag_field = tags[0][0]
    default = None if field.is_required() or list_of else field.get_default(call_default_factory=True)
    default_tag = getattr(default, tag_field, None)
    tag_key = ".".join([*child.key, tag_field])
    words = "one of " + " | ".join(t for _, t in tags)
    description = DESCRIPTIONS.get(tag_key) or DESCRIPTIONS.get(f"{name}.{tag_field}") or sources.describe(model, name, field, ".".join(child.key)) \
        or f"which kind of {name}"
    example_tag = next((t for _, t in tags if t != default_tag), tags[0][1])
    variant_model = next(m for m in models if _tag_of(m) == (tag_field, example_tag))
    yield Entry(key=tag_key, yaml_key=".".join([*child.yaml, tag_field]), section=child.key[0],
                variant=_variant_words(where), type=words, default=default_tag or "required", unit="",
                description=description,
                example=_example(child, tag_field, example_tag, _required(variant_model, child)))
    for member, (_, tag) in zip(models, tags):
        inner = _Where((*child.key, tag), child.yaml,
                       (*child.variants, (child.yaml, tag_field, tag, _required(member, child))))
        yield from _walk(member, inner, sources)


def _variant_words(where: _Where) -> str:
    return ", ".join(f"{'.'.join(p)}.{f}: {t}" for p, f, t, _ in where.variants)


def _leaf(model: type[BaseModel], name: str, field: FieldInfo, where: _Where, sources: _Sources,
          required: dict[str, Any]) -> Entry:
    annotation, inner = _peel(field.annotation)
    metadata = [*field.metadata, *inner]
    members = [m for m in (_union(annotation) or []) if m is not type(None)]
    duration = _is_duration(metadata) or any(_is_duration(_peel(m)[1]) for m in members)
    key = ".".join([*where.key, name])
    default_text, default = _default(field, duration)
    if members and _is_distribution([_peel(m)[0] for m in members]):
        words = "distribution (a number, or {dist: constant | uniform | lognormal, ...})"
    else:
        words = type_words(field.annotation, field.metadata)
    if key in EXAMPLES:
        sample = EXAMPLES[key]
    elif field.is_required() and name in required:
        sample = required[name]
    else:
        sample = _sample(field.annotation, field.metadata, default, duration)
    return Entry(key=key, yaml_key=".".join([*where.yaml, name]), section=where.key[0] if where.key else name,
                 variant=_variant_words(where), type=words, default=default_text,
                 unit=_unit(name, key, duration), description=sources.describe(model, name, field, key),
                 example=_example(where, name, sample, required))
