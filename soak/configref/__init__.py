"""The config reference, generated from the config models (docs/config-reference.md).

``entries()`` (soak.configref.walk): every key of a run config with its type, default,
unit, description and an example that validates; ``find``/``close_matches``/
``explain_text``/``markdown`` (soak.configref.lookup): ``soak validate --explain KEY``
and the page. ``python -m soak.configref > docs/config-reference.md`` regenerates it.
"""

from __future__ import annotations

from soak.configref.lookup import REGENERATE, close_matches, explain_text, find, markdown, section_purpose
from soak.configref.walk import Entry, entries, type_words

__all__ = ["REGENERATE", "Entry", "close_matches", "entries", "explain_text", "find", "markdown",
           "section_purpose", "type_words"]
