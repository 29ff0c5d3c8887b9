"""Shared pieces of the config schema: the strict base model and value types.

Each stage keeps its own section model beside its code (``soak/<stage>/config.py``);
``soak.config`` composes them into the run config.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any) -> float:
    """Seconds from ``90``, ``90.5``, ``"90s"``, ``"66m"``, ``"1h30m"``, ``"250ms"``."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 90s, 66m or 1h30m")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            pos, seconds = 0, 0.0
            for m in _DURATION_PART.finditer(text):
                if m.start() != pos:
                    break
                seconds += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
                pos = m.end()
            if pos != len(text) or not text:
                raise ValueError(f"{value!r} is not a duration such as 90s, 66m or 1h30m") from None
    else:
        raise ValueError("expected a duration such as 90s, 66m or 1h30m")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


def format_duration(seconds: float) -> str:
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:g}s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    parts = [f"{hours}h"] if hours else []
    if minutes:
        parts.append(f"{minutes}m")
    if secs:
        parts.append(f"{secs}s")
    return "".join(parts)


Duration = Annotated[float, BeforeValidator(parse_duration)]
"""Seconds; YAML may say 90, "90s", "66m", "1h30m"."""


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


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` that refuses duplicate keys (``yaml.MarkedYAMLError`` with the line)."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
