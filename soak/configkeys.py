"""An unknown config key, said so a person can fix it: the known key it is
likely a misspelling of (``load.concurency: unknown key; did you mean
'concurrency'?``) and its line in the file.

``section_keys(model, loc)`` walks the config's types along pydantic's error
location (tagged-union branches, dicts, lists) to the section that refused the
key; ``key_line(path, keys)`` finds the key in the file's YAML nodes, whose marks
keep the line the parsed mapping has lost. Both are read only on an error.
``bare_durations(model, data)`` finds durations written without a unit (``30``
where ``30s`` was meant, or ``30m``), for the warning the loader gives.
"""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any, Sequence

from pydantic import BaseModel

from soak.bounds import LIMITS, read_file


def _unwrap(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _members(annotation: Any) -> list[Any]:
    """The non-None members of a union (Optional included), else [annotation]."""
    annotation = _unwrap(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [_unwrap(a) for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


# the fields tagged unions are told apart by: a section's kind, a distribution's dist
TAG_FIELDS = ("kind", "dist")


def _tags(model: type[BaseModel]) -> tuple[Any, ...]:
    for name in TAG_FIELDS:
        tag = model.model_fields.get(name)
        if tag is not None:
            return typing.get_args(_unwrap(tag.annotation)) or (tag.default,)
    return ()


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _step(annotation: Any, item: Any) -> tuple[Any, bool]:
    """(the type one step down at ``item``, whether ``item`` was consumed); a union
    branch's tag is consumed choosing the branch."""
    members = _members(annotation)
    if len(members) > 1:
        for member in members:
            if _is_model(member) and item in _tags(member):
                return member, True
        models = [m for m in members if _is_model(m) and isinstance(item, str) and item in m.model_fields]
        return (models[0], False) if models else (None, True)
    (annotation,) = members
    if _is_model(annotation):
        field = annotation.model_fields.get(item) if isinstance(item, str) else None
        return (field.annotation if field is not None else None), True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (dict, typing.Mapping) or (origin is not None and getattr(origin, "__name__", "") == "Mapping"):
        return (args[1] if len(args) == 2 else None), True
    if origin in (list, tuple, typing.Sequence) and args:
        return args[0], True
    return None, True


def section_keys(model: type[BaseModel], loc: Sequence[Any]) -> list[str]:
    """The keys the section at ``loc[:-1]`` (pydantic's location of an unknown
    key, ``loc[-1]``) knows, in their declared order; [] where the walk is lost."""
    annotation: Any = model
    for item in loc[:-1]:
        if isinstance(item, str) and (item.startswith("function-") or "[" in item):
            continue
        consumed = False
        while not consumed and annotation is not None:
            annotation, consumed = _step(annotation, item)
        if annotation is None:
            return []
    members = [m for m in _members(annotation) if _is_model(m)]
    return list(members[0].model_fields) if len(members) == 1 else []


def _is_duration(annotation: Any, metadata: Sequence[Any] = ()) -> bool:
    """Is this a ``soak.configbase.Duration`` (parsed by ``parse_duration``)?"""
    from soak.durations import parse_duration

    found = list(metadata)
    while typing.get_origin(annotation) is typing.Annotated:
        found.extend(typing.get_args(annotation)[1:])
        annotation = typing.get_args(annotation)[0]
    return any(getattr(m, "func", None) is parse_duration for m in found)


def _bare(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    try:
        float(str(value).strip())
    except ValueError:
        return False
    return isinstance(value, str)


def bare_durations(model: type[BaseModel], data: Any) -> list[tuple[list[str | int], Any]]:
    """(keys, value) of every duration in ``data`` (a config as parsed) written as a
    bare number, in the order of the data."""
    found: list[tuple[list[str | int], Any]] = []

    def visit(annotation: Any, metadata: Sequence[Any], value: Any, keys: list[str | int]) -> None:
        inner = _unwrap(annotation)
        options = typing.get_args(inner) if typing.get_origin(inner) in (typing.Union, types.UnionType) else ()
        if _is_duration(annotation, metadata) or any(_is_duration(m) for m in options):
            if _bare(value):
                found.append((keys, value))
            return
        members = _members(annotation)
        models = [m for m in members if _is_model(m)]
        if models and isinstance(value, dict):
            chosen = [m for m in models if value.get("kind") in _tags(m)] or models[:1]
            for key, item in value.items():
                field = chosen[0].model_fields.get(key) if isinstance(key, str) else None
                if field is not None:
                    visit(field.annotation, field.metadata, item, [*keys, key])
            return
        if len(members) != 1:
            return
        origin, args = typing.get_origin(members[0]), typing.get_args(members[0])
        if origin is dict and len(args) == 2 and isinstance(value, dict):
            for key, item in value.items():
                visit(args[1], (), item, [*keys, key])
        elif origin in (list, tuple) and args and isinstance(value, list):
            for index, item in enumerate(value):
                visit(args[0], (), item, [*keys, index])

    visit(model, (), data, [])
    return found


def one_edit(a: str, b: str) -> bool:
    """``a`` is ``b`` with one letter dropped, added, changed, or two neighbours swapped."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                   and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long = (a, b) if len(a) < len(b) else (b, a)
    i = next((i for i, (x, y) in enumerate(zip(short, long)) if x != y), len(short))
    return short[i:] == long[i + 1:]


def suggestion(key: str, known: Sequence[str]) -> str | None:
    """The known key ``key`` most likely misspells, or None. A key one slip away
    (``one_edit``) wins over a merely similar one: difflib alone reads
    ``mai_context_tokens`` as ``min_context_tokens``, two slips away."""
    near = [k for k in known if one_edit(key, k)]
    close = difflib.get_close_matches(key, near or known, n=1, cutoff=0.0 if near else 0.6)
    return close[0] if close else None


def unknown_key_message(model: type[BaseModel], loc: Sequence[Any]) -> str:
    known = section_keys(model, loc)
    near = suggestion(str(loc[-1]), known) if known else None
    if near is not None:
        return f"unknown key; did you mean {near!r}?"
    return f"unknown key (known: {', '.join(known)})" if known else "unknown key"


def key_lines(path: str | Path, paths: Sequence[Sequence[str | int]]) -> list[int | None]:
    """The 1-based line of the last key of each of ``paths`` (mapping keys and
    list indices) in the YAML file at ``path``; None where one cannot be found."""
    import yaml

    try:
        text = read_file(Path(path), limit=LIMITS.yaml_bytes).decode("utf-8")
        # The file was read whole and bounded already (depth, aliases); composing
        # builds nodes only, and an alias is the same node, never a copy.
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except Exception:  # the line is a courtesy: an error finding it never hides the error itself
        return [None] * len(paths)
    return [_line_in(root, keys) for keys in paths]


def key_line(path: str | Path, keys: Sequence[str | int]) -> int | None:
    return key_lines(path, [keys])[0]


def _line_in(node: Any, keys: Sequence[str | int]) -> int | None:
    import yaml

    line = None
    for key in keys:
        if isinstance(node, yaml.SequenceNode) and isinstance(key, int) and -len(node.value) <= key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        elif isinstance(node, yaml.MappingNode):
            found = [(k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(key)]
            if not found:
                return None
            key_node, node = found[-1]
            line = key_node.start_mark.line + 1
        else:
            return None
    return line


__all__ = ["bare_durations", "key_line", "key_lines", "one_edit", "section_keys", "suggestion", "unknown_key_message"]
