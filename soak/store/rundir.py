"""One reader of a run directory: what makes a folder a run, its config.yaml,
and its files read under one rule (soak.jsonl: bounded, damaged lines counted).

Everything downstream of the run store that opens a run directory (the judge,
the report, history, compare, replay, retention, thresholds) opens it through
``RunDir``, so "is this a run?" has one answer and config.yaml one parse.
The sample reads are segment-aware (soak.store.segments): rolled gzip segments
first, then the open ``samples.jsonl``.
"""

from __future__ import annotations

import gzip
from functools import cached_property
from pathlib import Path
from typing import Any, Collection, Iterable, Iterator, Mapping

from soak.bounds import LIMITS, BoundExceeded, open_input, read_file
from soak.configbase import parse_recorded_yaml
from soak.errors import ConfigError
from soak.jsonl import SKIP, FieldCheck, JsonlLineError, parse_line, raw_lines, read_json, read_records
from soak.samples import Sample, sample_from_json
from soak.store.segments import iter_sample_lines, read_sample_records, sample_files
from soak.store.store import CONFIG, EVENTS, PLAN, REQUESTS, SUMMARY
from soak.summary_file import RunSummary

# Any one of these files, or a rolled sample segment, makes a folder a run
# directory: the run store opens events.jsonl and requests.jsonl before it
# writes anything else, samples may survive only as rolled segments, and a run
# re-rendered elsewhere may keep only summary.json. config.yaml is no marker:
# soak writes it after the JSONL files, and a folder of configs is not a run
# (retention deletes what this answers yes for).
MARKERS = (EVENTS, REQUESTS, "samples.jsonl", SUMMARY)
MARKERS_TEXT = f"none of {', '.join(MARKERS)} or a rolled samples-NNN.jsonl.gz"
INCIDENTS = "incidents"


def is_run_dir(path: str | Path) -> bool:
    """Whether ``path`` is a folder holding a recorded run (see MARKERS)."""
    path = Path(path)
    try:
        return path.is_dir() and (any((path / m).is_file() for m in MARKERS) or bool(sample_files(path)))
    except OSError:
        return False


class RunDir:
    """A recorded run directory, read lazily; each file is read when asked."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def is_run(self) -> bool:
        return is_run_dir(self.path)

    # -- config.yaml: read once, parsed once ------------------------------------------
    @cached_property
    def config_bytes(self) -> bytes | None:
        """config.yaml as recorded (secrets redacted, bounded); None where missing or unreadable."""
        try:
            return read_file(self.path / CONFIG, limit=LIMITS.yaml_bytes)
        except (OSError, BoundExceeded):
            return None

    @property
    def config_text(self) -> str:
        """config.yaml for people: bytes that are not UTF-8 shown replaced; "" where missing."""
        data = self.config_bytes
        return "" if data is None else data.decode("utf-8", errors="replace")

    @cached_property
    def _parsed_config(self) -> dict[str, Any] | None:
        data = self.config_bytes
        return parse_recorded_yaml(data) if data is not None else None

    @cached_property
    def config(self) -> Mapping[str, Any]:
        """config.yaml as recorded (secrets redacted); {} where missing or unreadable."""
        return self._parsed_config or {}

    @property
    def config_unreadable(self) -> bool:
        """config.yaml is there but reads as no mapping (damaged, not UTF-8, past a
        bound): a reader that falls back to defaults says so."""
        return self._parsed_config is None and (self.path / CONFIG).exists()

    def section(self, name: str) -> Mapping[str, Any] | None:
        """One top-level section of config.yaml, or None where absent or not a mapping."""
        value = self.config.get(name)
        return value if isinstance(value, Mapping) else None

    # -- the JSONL files --------------------------------------------------------
    def events(self, *, stats: dict[str, int] | None = None,
               fields: Mapping[str, FieldCheck] | None = None) -> Iterator[dict[str, Any]]:
        return read_records(self.path / EVENTS, stats=stats, fields=fields)

    def requests(self, *, stats: dict[str, int] | None = None,
                 fields: Mapping[str, FieldCheck] | None = None) -> Iterator[dict[str, Any]]:
        return read_records(self.path / REQUESTS, stats=stats, fields=fields)

    def samples(self, *, kinds: Collection[str] | None = None, stats: dict[str, int] | None = None,
                scan: dict[str, float] | None = None) -> Iterator[dict[str, Any]]:
        """Every sample record, rolled segments first (soak.store.segments.read_sample_records)."""
        return read_sample_records(self.path, kinds=kinds, stats=stats, scan=scan)

    def sample_lines(self, *, stats: dict[str, int] | None = None) -> Iterator[tuple[Path, int, bytes]]:
        """The raw sample lines, unparsed, for readers that skip most of them."""
        return iter_sample_lines(self.path, stats=stats)

    # -- the JSON files -----------------------------------------------------------
    def summary_json(self) -> Any:
        """summary.json as parsed JSON (any shape: read it through soak.summary_file), None if absent."""
        path = self.path / SUMMARY
        if not path.is_file():
            return None
        return read_json(path)

    def summary(self) -> RunSummary | None:
        """summary.json as the typed record; None where absent, unreadable or not an object."""
        raw = self.summary_json()
        return RunSummary.from_json(raw) if isinstance(raw, Mapping) else None

    def plan_json(self) -> Any:
        path = self.path / PLAN
        return read_json(path) if path.is_file() else None

    def incident_dirs(self) -> list[Path]:
        """incidents/N folders, by number."""
        root = self.path / INCIDENTS
        try:
            found = [p for p in root.iterdir() if p.is_dir() and p.name.isdigit()]
        except OSError:
            return []
        return sorted(found, key=lambda p: int(p.name))



def read_samples(path: str | Path) -> Iterator[Sample]:
    """Samples from a run directory (its rolled ``samples-NNN.jsonl.gz`` segments,
    then ``samples.jsonl``), or from one ``samples.jsonl`` / ``.jsonl.gz`` file,
    read under ``soak.jsonl``'s rule: a torn last line is skipped; any other line
    that is not a sample record is an error naming its file and line."""
    path = Path(path)
    if path.is_dir():
        lines: Iterable[tuple[Path, int, bytes]] = RunDir(path).sample_lines()
    else:
        lines = _file_lines(path)
    for source, number, raw in lines:
        try:
            obj = parse_line(raw, path=source, number=number)
            if obj is SKIP:
                continue
            yield sample_from_json(obj)
        except JsonlLineError as exc:
            raise ConfigError(exc.message, path=source, line=number) from exc
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"not a sample record: {exc}", path=source, line=number) from exc


def _file_lines(path: Path) -> Iterator[tuple[Path, int, bytes]]:
    # Opened by open_input: a FIFO or directory named as the file is refused, never waited on.
    with open_input(path, devices=False) as raw_file:
        if path.suffix != ".gz":
            yield from ((path, number, raw) for number, raw in raw_lines(raw_file))
            return
        with gzip.GzipFile(fileobj=raw_file, mode="rb") as fh:
            for number, raw in raw_lines(fh):
                yield path, number, raw


__all__ = ["INCIDENTS", "MARKERS", "MARKERS_TEXT", "RunDir", "is_run_dir", "read_samples"]
