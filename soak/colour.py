"""Whether the harness may colour a stream: the one rule, for the live view and the end block.

https://no-color.org: ``NO_COLOR`` set and not empty means no ANSI colour at all,
whatever else says. ``FORCE_COLOR`` set, not empty and not ``0`` asks for colour
where the stream is no terminal (a CI log that renders it). Otherwise colour only
on a terminal. The environment is passed in: callers at the edge read it once.
"""

from __future__ import annotations

from typing import Any, Mapping


def no_color(environ: Mapping[str, str]) -> bool:
    return environ.get("NO_COLOR", "") != ""


def colour_wanted(stream: Any, environ: Mapping[str, str]) -> bool:
    if no_color(environ):
        return False
    if environ.get("FORCE_COLOR", "") not in ("", "0"):
        return True
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False
