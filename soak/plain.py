"""The one converter from soak's records to plain JSON values.

Samples, request records, decisions, incident records and evidence all reach
JSON through ``plain``: enums become their values, tuples and sets lists,
dataclasses dicts of their fields (a sample keeps its ``kind`` tag first, as
``samples.jsonl`` has it), paths strings, mapping keys strings, and floats that
JSON cannot hold (NaN, infinities) null, as the run store writes them.
"""

from __future__ import annotations

import dataclasses
import math
from enum import Enum
from pathlib import PurePath
from typing import Any, Mapping


def plain(value: Any, *, keep_infinity: bool = False) -> Any:
    """A JSON-ready copy of ``value``; anything else unknown becomes its ``str``.

    ``keep_infinity`` writes infinities as ``"inf"``/``"-inf"`` instead of null,
    where an infinite value is a finding (history.json's MTBF bounds) and not a gap."""
    if isinstance(value, Enum):
        return plain(value.value, keep_infinity=keep_infinity)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        if keep_infinity and not math.isnan(value):
            return "inf" if value > 0 else "-inf"
        return None
    if isinstance(value, Mapping):
        return {str(k): plain(v, keep_infinity=keep_infinity) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v, keep_infinity=keep_infinity) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        out: dict[str, Any] = {}
        tag = getattr(type(value), "kind", None)
        if isinstance(tag, str) and all(f.name != "kind" for f in fields):
            out["kind"] = tag  # a sample's ClassVar tag, first: the run store reads it off the line's front
        out.update((f.name, plain(getattr(value, f.name), keep_infinity=keep_infinity)) for f in fields)
        return out
    if isinstance(value, PurePath):
        return str(value)
    return str(value)


__all__ = ["plain"]
