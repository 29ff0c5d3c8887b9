"""Finding a key in the reference, and the reference as text: one entry
(``soak validate --explain``) or the whole page (docs/config-reference.md)."""

from __future__ import annotations

import difflib
import inspect
import re
import sys
import textwrap
import typing
from typing import Sequence

from soak.configref.text import SECTION_PURPOSES, SECTION_SUMMARIES
from soak.configref.walk import Entry, _first_sentence, _is_model, _peel, _union, entries

REGENERATE = "python -m soak.configref > docs/config-reference.md"


# -- lookup and text ----------------------------------------------------------


def _normal(key: str) -> str:
    return re.sub(r"\[\d*\]", "[]", key.strip())


def find(key: str, found: Sequence[Entry] | None = None) -> list[Entry]:
    """The entries a key names: canonical (target.launched.command) or as YAML and
    error lines name it (target.command, target.sim.faults[0].at, thresholds.ttft_p99.window:
    every variant that has it); a section's path (load.timeouts) names its keys."""
    found = entries() if found is None else found
    key = re.sub(r"\[\d*\]$", "", _normal(key))  # a list's item is the list's key
    for name in ("key", "yaml_key"):
        exact = [e for e in found if getattr(e, name) == key
                 or ("<metric>" in getattr(e, name) and _pattern(getattr(e, name)).fullmatch(key))]
        if exact:
            return exact
    for name in ("key", "yaml_key"):
        below = [e for e in found if _pattern(getattr(e, name), prefix=True).match(key + ".")]
        if below:
            return below
    return []


def _pattern(key: str, *, prefix: bool = False) -> re.Pattern[str]:
    """An entry's key as a pattern: a metric placeholder takes any one part."""
    text = re.escape(key).replace(re.escape("<metric>"), r"[^.\[\]]+")
    if not prefix:
        return re.compile(text)
    # key + "." is a prefix of the entry's key: key names a section above it
    parts = text.split(r"\.")
    return re.compile("|".join(r"\.".join(parts[:n]) + r"\.$" for n in range(1, len(parts))) or "$^")


def close_matches(key: str, found: Sequence[Entry] | None = None, n: int = 3) -> list[str]:
    found = entries() if found is None else found
    names = sorted({e.key for e in found} | {e.yaml_key for e in found})
    near = difflib.get_close_matches(_normal(key), names, n=n, cutoff=0.6)
    last = _normal(key).rsplit(".", 1)[-1]
    same_leaf = [k for k in names if k.rsplit(".", 1)[-1] == last and k not in near]
    return (near + same_leaf)[:n]


def explain_text(entry: Entry) -> str:
    lines = [entry.key + (f"  (in YAML: {entry.yaml_key})" if entry.yaml_key != entry.key else ""),
             f"  type:     {entry.type}", f"  default:  {entry.default}"]
    if entry.unit:
        lines.append(f"  unit:     {entry.unit}")
    if entry.variant:
        lines.append(f"  when:     {entry.variant}")
    lines += [f"  section:  {entry.section}: {section_purpose(entry.section)}",
              *textwrap.wrap(entry.description or "(no description)", 88, initial_indent="  ",
                             subsequent_indent="  "),
              f"  example:  {entry.example}"]
    return "\n".join(lines)


def section_purpose(section: str) -> str:
    """The section's purpose in one sentence."""
    if section in SECTION_SUMMARIES:
        return SECTION_SUMMARIES[section]
    return _first_sentence(re.sub(r"\s+", " ", section_doc(section)).strip())


def section_doc(section: str) -> str:
    """The section's module docstring, as markdown: what the section is for."""
    if section in SECTION_PURPOSES:
        return SECTION_PURPOSES[section]
    from soak.config import RunConfig

    field = RunConfig.model_fields.get(section)
    if field is None:
        return ""
    annotation, _ = _peel(field.annotation)
    members = [_peel(m)[0] for m in (_union(annotation) or [annotation]) if m is not type(None)]
    origin_args = typing.get_args(annotation)
    model = members[0] if _is_model(members[0]) else (origin_args[-1] if origin_args else None)
    doc = inspect.getdoc(sys.modules.get(getattr(model, "__module__", ""), None)) or ""
    lines = [re.sub(r"\(issue \d+\)\s?|issue \d+, ", "", line).replace("``", "`") for line in doc.splitlines()]
    return "\n".join(lines).strip()


def markdown(found: Sequence[Entry] | None = None) -> str:
    from soak.configref.text import PAGE_HEAD

    found = entries() if found is None else found
    out = [PAGE_HEAD.format(regenerate=REGENERATE)]
    sections = list(dict.fromkeys(e.section for e in found))
    top = [e for e in found if e.key == e.section]
    out += ["## Top-level keys", "", *_table(top), ""]
    for section in sections:
        rows = [e for e in found if e.section == section and e.key != e.section]
        if not rows:
            continue
        out += [f"## `{section}:`", "", section_doc(section), "", *_table(rows), ""]
    return "\n".join(out).rstrip() + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(rows: Sequence[Entry]) -> list[str]:
    out = ["| key | type | default | unit | description | example |", "| --- | --- | --- | --- | --- | --- |"]
    for e in rows:
        key = f"`{e.key}`" + (f" (YAML `{e.yaml_key}`)" if e.yaml_key != e.key else "")
        out.append(f"| {key} | {_cell(e.type)} | `{_cell(e.default)}` | {_cell(e.unit)} | {_cell(e.summary)} "
                   f"| `{_cell(e.example)}` |")
    return out
