"""Shared pieces of the config schema: the strict base model and value types.

Each stage keeps its own section model beside its code (``soak/<stage>/config.py``);
``soak.config`` composes them into the run config.
"""

from __future__ import annotations

from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict

from soak.durations import parse_duration

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
