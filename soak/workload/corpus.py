"""Text that looks like agent traffic: code and prose from a corpus of files.

The default corpus is the Python standard library's own source (found through
``sysconfig``), so it works offline on any machine; a user's directory or file
list is the option. Files are read in sorted order up to ``max_bytes``, so one
machine and one seed give the same text every time.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from soak.errors import WorkloadError
from soak.workload.config import CorpusConfig, DirectoryCorpus, FilesCorpus, StdlibCorpus

# Test suites and vendored trees are left out: huge, repetitive, or not ours.
_STDLIB_SKIP = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "lib2to3", "turtledemo"}
_MIN_LINES = 8


@dataclass(frozen=True)
class CorpusFile:
    name: str  # relative path, shown in the generated text
    lines: tuple[str, ...]  # each ends with "\n", no line is empty


@dataclass(frozen=True)
class Corpus:
    files: tuple[CorpusFile, ...]
    source: str  # what it was read from, for the plan

    @property
    def line_count(self) -> int:
        return sum(len(f.lines) for f in self.files)


def _stdlib_files() -> Iterator[tuple[str, Path]]:
    """The standard library's ``.py`` files, lazily, in ``sorted(rglob)`` order.

    Lazy and pruned because the caller stops at ``max_bytes``: listing every
    file first (site-packages and the test suite included, 50,000 files under
    a pyenv Python) cost more than reading the text, in every run and every
    ``soak validate``.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    yield from _sorted_py_files(root, root)


def _sorted_py_files(root: Path, folder: Path) -> Iterator[tuple[str, Path]]:
    # Sorting one folder's files and sub-folders together by name gives the
    # same order as sorting whole paths part by part, as sorted(rglob) did.
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError:
        return
    for entry in entries:
        if entry.name in _STDLIB_SKIP:
            continue
        path = folder / entry.name
        try:
            is_dir = entry.is_dir()
        except OSError:
            continue
        if is_dir:
            yield from _sorted_py_files(root, path)
        elif entry.name.endswith(".py"):
            yield str(path.relative_to(root)), path


def _clean_lines(text: str) -> tuple[str, ...]:
    # Blank lines are dropped so that no two newlines meet: with real BPE
    # tokenizers "\n\n" can merge into one token and break per-line counts.
    return tuple(line + "\n" for line in map(str.rstrip, text.splitlines()) if line)


def load_corpus(config: CorpusConfig, *, field: str = "corpus", config_path: str | Path | None = None) -> Corpus:
    """Read the corpus; a missing or empty one is a ``WorkloadError`` naming ``field``."""
    if isinstance(config, StdlibCorpus):
        candidates = _stdlib_files()
        source = "python standard library"
    elif isinstance(config, DirectoryCorpus):
        root = Path(config.path)
        if not root.is_dir():
            raise WorkloadError(f"no such directory: {root}", path=config_path, field=f"{field}.path")
        candidates = [(str(p.relative_to(root)), p) for p in sorted(root.glob(config.glob)) if p.is_file()]
        source = f"directory {root}"
    elif isinstance(config, FilesCorpus):
        candidates = []
        for index, path in enumerate(config.paths):
            if not Path(path).is_file():
                raise WorkloadError(f"no such file: {path}", path=config_path, field=f"{field}.paths[{index}]")
            candidates.append((Path(path).name, Path(path)))
        source = f"{len(candidates)} files"
    else:  # pragma: no cover - the union is closed
        raise WorkloadError(f"unknown corpus {config!r}", path=config_path, field=field)

    files: list[CorpusFile] = []
    total = 0
    for name, path in candidates:
        if total >= config.max_bytes:
            break
        try:
            # One huge file in a directory costs the corpus's max_bytes, not its size.
            with open(path, "rb") as handle:
                data = handle.read(config.max_bytes + 1)
            if len(data) > config.max_bytes:
                data = data[: data.rfind(b"\n") + 1]  # whole lines only
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # binary or unreadable files are simply not text to reuse
        lines = _clean_lines(text)
        if len(lines) < _MIN_LINES:
            continue
        files.append(CorpusFile(name=name, lines=lines))
        total += sum(len(line) for line in lines)
    if not files:
        if isinstance(config, StdlibCorpus):
            raise WorkloadError("no standard library sources found on this machine", path=config_path, field=field)
        raise WorkloadError("the corpus has no readable text files", path=config_path, field=field)
    return Corpus(files=tuple(files), source=source)
