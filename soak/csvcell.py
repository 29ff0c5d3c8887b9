"""CSV cells a spreadsheet opens as data, never as formulas: the one writer.

A string from outside (a server's ``/version``, a run id, a label, a path) that
begins with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return is evaluated by
Excel, LibreOffice and Sheets when the CSV is opened: ``=HYPERLINK(...)`` becomes
a live link, ``=cmd|...`` a DDE call (OWASP "CSV injection"). Every such cell is
prefixed with ``'``, which the spreadsheet shows as text and hides. A plain
number (``-1.5``, ``+3e-4``) is left alone: it is a value, not a formula.

Invariant: no cell written by ``rows_to_csv`` begins (after leading spaces) with
a formula trigger unless it is a plain decimal number, and ``unescape`` of what
the csv module reads back is the original string.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Any, Iterable

# The ASCII triggers OWASP lists, their full-width forms (some spreadsheets fold
# them), and line breaks (a cell that starts a new logical line).
TRIGGERS = frozenset("=+-@\t\r\n\uff1d\uff0b\uff0d\uff20")
ESCAPE = "'"
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\Z")


def needs_escape(text: str) -> bool:
    stripped = text.lstrip(" ")
    if not stripped or stripped[0] not in TRIGGERS:
        return False
    return _NUMBER.match(text) is None


def cell(value: Any) -> str:
    """The text of one cell: ``None`` is empty, anything else ``str()``, escaped if a formula."""
    text = "" if value is None else str(value)
    return ESCAPE + text if needs_escape(text) else text


def unescape(text: str) -> str:
    """What ``cell`` was given, from the text the csv module reads back."""
    if text.startswith(ESCAPE) and needs_escape(text[1:]):
        return text[1:]
    return text


def rows_to_csv(rows: Iterable[Iterable[Any]]) -> str:
    """Every row through ``cell``; the header too (it is data to a spreadsheet)."""
    out = io.StringIO()
    # RFC 4180's CRLF: with a bare "\n" terminator the csv module leaves a cell
    # holding a lone "\r" unquoted, and a reader splits the row there.
    writer = csv.writer(out, lineterminator="\r\n")
    for row in rows:
        writer.writerow([cell(v) for v in row])
    return out.getvalue()
