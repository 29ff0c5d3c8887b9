"""A number read from outside (a scrape, a samples file, a summary), or nothing.

Invariant: ``finite`` returns a finite float or None, never raises: a bool, text, a
list, NaN and inf all read as absent. A NaN read as a number never equals itself, so
a counter of NaN "moved" every scrape and a hung server looked alive for ever.
"""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


__all__ = ["finite"]
