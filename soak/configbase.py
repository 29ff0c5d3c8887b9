"""Shared pieces of the config schema: the strict base model and value types,
reading a YAML file and turning pydantic's errors into one ConfigError line.

Each stage keeps its own section model beside its code (``soak/<stage>/config.py``);
``soak.config`` composes them into the run config.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Mapping

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from soak.bounds import LIMITS, BoundExceeded, InputRejected, Limits, read_file
from soak.bounds import load_yaml as bounded_load_yaml
from soak.durations import parse_duration
from soak.errors import ConfigError

Duration = Annotated[float, BeforeValidator(parse_duration)]
"""Seconds; YAML says "90s", "66m", "1h30m", "250ms" (a bare 90 is read as seconds, and
``soak.config.load_run_config`` warns: one line naming the file, line and field)."""


class StrictModel(BaseModel):
    """Unknown keys are errors; values are not silently coerced across types."""

    model_config = ConfigDict(extra="forbid", strict=False, frozen=True, validate_default=True)


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key given twice in one mapping is an error
    (PyYAML keeps the last silently: a config that says ``duration`` twice runs
    with whichever came last)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    loader.flatten_mapping(node)
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            continue  # the base constructor reports unhashable keys itself
        if key in seen:
            first = seen[key].start_mark.line + 1
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first given on line {first})", key_node.start_mark
            )
        seen[key] = key_node
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(text: str, *, limits: Limits = LIMITS) -> Any:
    """``yaml.safe_load`` that refuses duplicate keys, nesting past
    ``limits.depth`` and alias bombs: ``InputRejected`` with the line."""
    return bounded_load_yaml(text, loader=_StrictLoader, limits=limits)


def data_path(loc: tuple[Any, ...], data: Any = None) -> list[str | int]:
    """pydantic's error location as the keys and indices of the input: validator
    steps and tagged-union branch names dropped.

    With ``data`` (the input that failed), a step that is not a key of the
    mapping at that point, and not the last step (a missing field), is a union
    branch's tag (its ``kind``, given or defaulted) and is dropped.
    """
    keys: list[str | int] = []
    node = data
    for position, item in enumerate(loc):
        last = position == len(loc) - 1
        if isinstance(item, int):
            keys.append(item)
            node = node[item] if isinstance(node, list) and -len(node) <= item < len(node) else None
            continue
        if isinstance(item, str) and (item.startswith("function-") or "[" in item):
            continue
        if isinstance(node, dict) and item not in node and not last and node.get("kind", item) == item:
            continue  # the union's tag (given, or defaulted): the branch, not a field
        keys.append(item)
        node = node.get(item) if isinstance(node, dict) else None
    return keys


def field_path(loc: tuple[Any, ...], data: Any = None) -> str:
    """pydantic's error location as a dotted path (``load.timeouts.stall``,
    ``workload.sessions[0]``); tagged-union branch names dropped (``data_path``)."""
    parts = [f"[{k}]" if isinstance(k, int) else ("." if i else "") + str(k)
             for i, k in enumerate(data_path(loc, data))]
    return "".join(parts) or "<root>"


def _message(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "union_tag_invalid":
        known = str(ctx.get("expected_tags", "")).replace("'", "")
        return f"unknown kind {ctx.get('tag')!r}, known: {known}"
    if kind == "union_tag_not_found":
        return "needs a kind"
    message = str(error["msg"])
    for lead in ("Value error, ", "Assertion failed, "):
        if message.startswith(lead):
            message = message[len(lead) :]
    return message


def validation_error_to_config_error(
    exc: ValidationError, path: str | Path, prefix: str = "", data: Any = None,
    model: type[BaseModel] | None = None,
) -> ConfigError:
    """The first error as one ``ConfigError``. With ``model`` (the model that was
    validated) an unknown key comes first, says which known key it is likely a
    misspelling of, and names its line in the file at ``path``."""
    errors = exc.errors(include_url=False)
    unknown = [e for e in errors if e["type"] == "extra_forbidden"] if model is not None else []
    line = None
    if unknown:
        from soak.configkeys import key_lines

        # A misspelt key is also a missing one ("base_ur" leaves base_url unset): the key
        # is the cause. Of several, the first in the file, as a person reads it.
        lines = key_lines(path, [data_path(tuple(e["loc"]), data) for e in unknown])
        line, first = min(zip(lines, unknown), key=lambda pair: pair[0] if pair[0] is not None else 1 << 62)
    else:
        first = errors[0]
    field = field_path(tuple(first["loc"]), data)
    if first["type"] in ("union_tag_invalid", "union_tag_not_found"):
        field = f"{field}.kind" if field != "<root>" else "kind"
    if prefix:
        field = f"{prefix}.{field}" if field != "<root>" else prefix
    if not unknown:
        return ConfigError(_message(first), path=path, field=field)
    from soak.configkeys import unknown_key_message

    assert model is not None
    return ConfigError(unknown_key_message(model, tuple(first["loc"])), path=path, field=field, line=line)


def read_yaml(path: str | Path, *, error: type[ConfigError] = ConfigError, limits: Limits = LIMITS) -> Any:
    """The YAML document in ``path``; a missing, unreadable, invalid or
    unbounded file (too large, too deep) is one ``error`` (a ConfigError, or the
    subclass a caller names) with the line."""
    path = Path(path)
    try:
        data = read_file(path, limit=limits.yaml_bytes)
        text = data.decode("utf-8")
    except FileNotFoundError as exc:
        raise error("no such file", path=path) from exc
    except BoundExceeded as exc:
        raise error(exc.message, path=path) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read: {exc}", path=path) from exc
    try:
        return load_yaml(text, limits=limits)
    except InputRejected as exc:
        raise error(exc.message, path=path, line=exc.line) from exc


_BARE_REDACTED = re.compile(r"^(\s*(?:[^#\n]*?:|-)\s+)\*\*\*\s*$", re.M)


def read_recorded_yaml(path: str | Path, *, retry_redacted: bool = True,
                       limits: Limits = LIMITS) -> dict[str, Any] | None:
    """A run directory's config.yaml as a mapping, or None where it is missing,
    unreadable, not a mapping or past a bound: the readers of a run (report,
    summary, thresholds) go on without it. A reader of a whole run directory
    reads it through ``soak.store.rundir.RunDir.config`` (read and parsed once)."""
    try:
        data = read_file(path, limit=limits.yaml_bytes)
    except (OSError, BoundExceeded):
        return None
    return parse_recorded_yaml(data, retry_redacted=retry_redacted, limits=limits)


def parse_recorded_yaml(data: bytes, *, retry_redacted: bool = True,
                        limits: Limits = LIMITS) -> dict[str, Any] | None:
    """config.yaml's bytes as a mapping, or None where they are not UTF-8, not
    YAML, not a mapping or past a bound. A redacted value written bare
    (``key: ***``) reads as a YAML alias, so it is quoted and read again."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    try:
        parsed = load_yaml(text, limits=limits)
    except BoundExceeded:
        return None
    except InputRejected:
        if not retry_redacted:
            return None
        try:
            parsed = load_yaml(_BARE_REDACTED.sub(r"\1'***'", text), limits=limits)
        except InputRejected:
            return None
    return parsed if isinstance(parsed, dict) else None
