"""The reference file: a known-good build's canary answers, read by later nights.

JSON Lines (docs/oracle.md): a header, then one line per canary.

    {"soak_reference": 1, "model": "m", "build": "b", "recorded_at": 1.7e9,
     "server_version": "0.11.2", "tie_margin": 0.2}
    {"canary_id": "short-0", "digest": "…", "max_tokens": 32, "long": false,
     "answer": {"tokens": [{"token": "Hi", "logprob": -0.01, "top": [["Hi", -0.01], …]}, …],
                "text": "…", "finish_reason": "stop", "model": "m", "malformed": null}}

Written whole or not at all (``soak.fsio.write_atomic``), so every line of a
file soak wrote parses: a reader that meets a line that does not (a cut-off last
line included) names it, ``ConfigError(path=, line=)``, one line, exit 2. The read
is bounded (the whole file, each line, nesting, the number of entries) and never
waits (a FIFO is refused).

An entry is used only for the canary it was recorded for: ``matching`` keeps
the entries whose prompt digest (and ``max_tokens``, and the header's model, when
given) match what this run builds, and ``mismatches`` says why the others are not used.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from soak.bounds import InputRejected, read_file
from soak.errors import ConfigError
from soak.fsio import write_atomic
from soak.jsonl import SKIP, JsonlLineError, is_number, parse_line, raw_lines
from soak.oracle.answer import Answer
from soak.oracle.compare import usable

VERSION = 1
# A reference file holds a few dozen canaries of a few dozen tokens each: far
# below these, which bound a hostile or mistaken file.
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_ENTRIES = 4096
MAX_ID_CHARS = 200
_HEADER_FIELDS = ("model", "build", "recorded_at", "server_version", "tie_margin")


@dataclass(frozen=True)
class ReferenceEntry:
    """One canary's recorded answer, with what identifies its prompt."""

    canary_id: str
    digest: str
    max_tokens: int
    long: bool
    answer: Answer

    def to_json(self) -> dict[str, Any]:
        return {"canary_id": self.canary_id, "digest": self.digest, "max_tokens": self.max_tokens,
                "long": self.long, "answer": self.answer.to_json()}


@dataclass(frozen=True)
class ReferenceFile:
    """A reference file as read: its header (``soak_reference`` and the known
    fields, each None where absent) and its entries in file order."""

    path: str
    header: Mapping[str, Any]
    entries: tuple[ReferenceEntry, ...] = field(default=())

    @property
    def model(self) -> str | None:
        return self.header.get("model")

    @property
    def build(self) -> str | None:
        return self.header.get("build")

    @property
    def tie_margin(self) -> float | None:
        return self.header.get("tie_margin")

    def by_id(self) -> dict[str, ReferenceEntry]:
        return {e.canary_id: e for e in self.entries}


def write_reference(path: str | Path, *, header: Mapping[str, Any], entries: Sequence[ReferenceEntry]) -> None:
    """The file, whole (atomic). ``ValueError`` for what no reader could use
    (two entries of one canary, an answer that cannot be judged, a header value
    that is not JSON, ``TypeError`` for one JSON has no form for): the caller's
    bug, raised before anything is written."""
    head = {"soak_reference": VERSION, **{k: v for k, v in header.items() if k != "soak_reference"}}
    lines = [json.dumps(head, allow_nan=False, sort_keys=False)]
    seen: set[str] = set()
    for entry in entries:
        if entry.canary_id in seen:
            raise ValueError(f"two reference entries for canary {entry.canary_id!r}")
        why = usable(entry.answer)
        if why is not None:
            raise ValueError(f"canary {entry.canary_id!r}: an answer that cannot be a reference ({why})")
        seen.add(entry.canary_id)
        # ASCII: a token may hold a lone surrogate, which UTF-8 cannot carry.
        lines.append(json.dumps(entry.to_json(), allow_nan=False))
    write_atomic(path, "\n".join(lines) + "\n")


def _fail(path: str | Path, message: str, line: int | None = None, fld: str | None = None) -> ConfigError:
    return ConfigError(message, path=path, line=line, field=fld)


def _header(value: Any, path: str | Path) -> dict[str, Any]:
    if not isinstance(value, dict) or "soak_reference" not in value:
        raise _fail(path, "not a soak reference file (its first line has no soak_reference header)", 1)
    version = value["soak_reference"]
    if type(version) is not int or version != VERSION:
        raise _fail(path, f"reference format version {json.dumps(version)[:40]}; this soak reads version {VERSION}",
                    1, "soak_reference")
    head: dict[str, Any] = {"soak_reference": version}
    for name in _HEADER_FIELDS:
        item = value.get(name)
        numeric = name in ("recorded_at", "tie_margin")
        if item is not None and not (is_number(item) if numeric else type(item) is str):
            raise _fail(path, f"must be {'a number' if numeric else 'a string'}", 1, name)
        head[name] = float(item) if numeric and item is not None else item
    return head


def _entry(value: Any, path: str | Path, line: int) -> ReferenceEntry:
    if not isinstance(value, dict):
        raise _fail(path, "a reference entry must be a JSON object", line)
    cid, digest, max_tokens, long = (value.get(k) for k in ("canary_id", "digest", "max_tokens", "long"))
    if type(cid) is not str or not cid or len(cid) > MAX_ID_CHARS:
        raise _fail(path, f"must be a non-empty string of at most {MAX_ID_CHARS} characters", line, "canary_id")
    if type(digest) is not str:
        raise _fail(path, "must be a string", line, "digest")
    if type(max_tokens) is not int or not 1 <= max_tokens <= 1_000_000:
        raise _fail(path, "must be a positive integer", line, "max_tokens")
    if type(long) is not bool:
        raise _fail(path, "must be true or false", line, "long")
    answer = Answer.from_json(value.get("answer"))
    why = usable(answer)
    if why is not None:
        raise _fail(path, f"cannot serve as a reference: {why}", line, "answer")
    return ReferenceEntry(cid, digest, max_tokens, long, answer)


def read_reference(path: str | Path) -> ReferenceFile:
    """The reference file at ``path``, or one ``ConfigError`` naming it (and the
    line): missing, unreadable, not a regular file, past a bound, a line that
    does not parse or is cut off, a wrong version, a field of the wrong type."""
    try:
        data = read_file(path, limit=MAX_FILE_BYTES, devices=False)
    except InputRejected as exc:  # before OSError: a FIFO is both
        raise _fail(path, f"cannot read the reference file: {exc.message}") from None
    except OSError as exc:
        raise _fail(path, f"cannot read the reference file: {exc.strerror or exc}") from None
    header: dict[str, Any] | None = None
    entries: list[ReferenceEntry] = []
    seen: set[str] = set()
    for number, raw in raw_lines(io.BytesIO(data)):
        try:
            value = parse_line(raw, path=path, number=number, errors="raise")
        except JsonlLineError as exc:
            raise _fail(path, exc.message, number) from None
        if value is SKIP:  # the write is atomic: a cut-off line is damage, not a torn append
            raise _fail(path, "the line is cut off (the file was not written whole)", number)
        if header is None:
            header = _header(value, path)
            continue
        entry = _entry(value, path, number)
        if entry.canary_id in seen:
            raise _fail(path, f"a second entry for canary {entry.canary_id!r}", number, "canary_id")
        if len(entries) >= MAX_ENTRIES:
            raise _fail(path, f"more than {MAX_ENTRIES} reference entries", number)
        seen.add(entry.canary_id)
        entries.append(entry)
    if header is None:
        raise _fail(path, "empty: no soak_reference header")
    return ReferenceFile(str(path), header, tuple(entries))


def _unused(file: ReferenceFile, canary_id: str, digest: str, *, max_tokens: Mapping[str, int] | None,
            model: str | None) -> str | None:
    entry = file.by_id().get(canary_id)
    if entry is None:
        return f"canary {canary_id}: not in the reference file"
    if file.model is not None and model is not None and file.model != model:
        return f"canary {canary_id}: recorded for model {file.model!r}, this run serves {model!r}"
    if entry.digest != digest:
        return f"canary {canary_id}: its prompt changed since the reference was recorded " \
               f"(digest {entry.digest[:12]!r}, now {str(digest)[:12]!r})"
    want = (max_tokens or {}).get(canary_id)
    if want is not None and want != entry.max_tokens:
        return f"canary {canary_id}: recorded with max_tokens {entry.max_tokens}, this run asks {want}"
    return None


def matching(file: ReferenceFile, prompts: Mapping[str, str], *, max_tokens: Mapping[str, int] | None = None,
             model: str | None = None) -> dict[str, Answer]:
    """The recorded answers this run can judge against: ``prompts`` maps each
    canary id of this run to its prompt's digest; an entry is used only where
    the digest (and, when given, ``max_tokens`` and the header's ``model``) match."""
    entries = file.by_id()
    return {cid: entries[cid].answer for cid, digest in prompts.items()
            if _unused(file, cid, digest, max_tokens=max_tokens, model=model) is None}


def mismatches(file: ReferenceFile, prompts: Mapping[str, str], *, max_tokens: Mapping[str, int] | None = None,
               model: str | None = None) -> tuple[str, ...]:
    """Why each canary of this run gets no recorded reference, and the entries
    no canary of this run asks for: one sentence each, for an event and the report."""
    out = [why for cid, digest in prompts.items()
           if (why := _unused(file, cid, digest, max_tokens=max_tokens, model=model)) is not None]
    out += [f"reference entry {cid}: no canary of this run has that id" for cid in file.by_id() if cid not in prompts]
    return tuple(out)


__all__ = ["MAX_ENTRIES", "MAX_FILE_BYTES", "ReferenceEntry", "ReferenceFile", "VERSION", "matching",
           "mismatches", "read_reference", "write_reference"]
