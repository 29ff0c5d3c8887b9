"""A bisect's segments read back from their run directories: how a killed
bisect resumes, and how bisect.json is rebuilt. Each segment is an ordinary run
directory named ``segment-NNN-build-K`` (``conduct.segment_dir``) under the
bisect's folder; its evidence is its time at risk and hangs as report and
history read them (``soak.report.rundir.load_run``, ``soak.exposure``), one
definition everywhere.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from soak.bisect.executor import SegmentResult
from soak.errors import ConfigError

NOTHING_ANSWERED = "nothing answered"  # no ok request and no hang: zero time at risk
SEGMENT_NAME = re.compile(r"segment-(\d{3,})-build-(\d+)")


def parse_segment_dir(path: Path) -> tuple[int, int] | None:
    """(segment number, build index) from a segment directory's name, else None."""
    match = SEGMENT_NAME.fullmatch(path.name)
    return (int(match.group(1)), int(match.group(2))) if match else None


_NUMBERED = re.compile(r"segment-(\d{3,})-")


def next_number(root: Path) -> int:
    """Past the highest number any ``segment-NNN-*`` entry under ``root`` holds, a
    set-aside ``*.unreadable`` one included: a new segment never takes a used
    number (its directory, its seeds)."""
    try:
        names = [child.name for child in root.iterdir()]
    except OSError:
        return 0
    return max([-1, *(int(m.group(1)) for name in names if (m := _NUMBERED.match(name)))]) + 1


def read_segment(run_dir: Path, *, build: int) -> SegmentResult:
    """One segment's evidence; a cut-off run (the bisect was killed mid-segment)
    counts up to the last thing it recorded. ConfigError when it cannot be read."""
    from soak.exposure import at_risk
    from soak.report.rundir import load_run
    from soak.store.rundir import RunDir
    from soak.store.summary import REQUEST_TYPES

    data = load_run(run_dir)
    # The segment's judge's count (summary.json's at_risk), as history and the report read
    # it; a segment cut off before its judge ran is counted with its requests' evidence of work.
    intervals = at_risk(data.events, data.summary, RunDir(run_dir).requests(fields=REQUEST_TYPES)).intervals
    hangs = sum(1 for i in intervals if i.hang)
    if not hangs and not bool(data.requests.ok.any()):
        # Loaded time with no answer is not time a build ran clean: a server that
        # failed every request would otherwise be evidence that the build is good.
        return SegmentResult(build=build, run_dir=run_dir, exposure_s=0.0, hangs=0, ended_by=NOTHING_ANSWERED)
    return SegmentResult(build=build, run_dir=run_dir, exposure_s=sum(i.length_s for i in intervals),
                         hangs=hangs, ended_by=intervals[-1].ended_by if intervals else "nothing ran")


def read_segments(root: Path, *, builds: int | None = None,
                  on_skip: Callable[[ConfigError], None] | None = None) -> tuple[SegmentResult, ...]:
    """Every segment under ``root`` in segment order. One that cannot be read, or
    (given ``builds``, the bisect's count) names a build past the last, is handed
    to ``on_skip`` and left out: evidence missing, not evidence of anything."""
    found = sorted((parsed, child) for child in root.iterdir()
                   if child.is_dir() and not child.is_symlink() and (parsed := parse_segment_dir(child)) is not None)
    results = []
    for (_, build), path in found:
        try:
            if builds is not None and build >= builds:
                raise ConfigError(f"build {build} is past the last of this bisect's {builds} builds "
                                  f"(0 to {builds - 1})", path=path)
            results.append(read_segment(path, build=build))
        except ConfigError as exc:
            if on_skip is not None:
                on_skip(exc)
    return tuple(results)
