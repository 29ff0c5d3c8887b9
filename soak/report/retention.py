"""Nightly retention: keep the newest N run directories and the newest failing
one, delete the rest, and point ``latest`` at the newest run.

Safety: only direct children of the runs folder that are run directories
(``soak.store.rundir.is_run_dir``: events.jsonl, requests.jsonl, samples or
summary.json) are candidates; symlinks are never followed or deleted (except ``latest``, which
is replaced); every path is checked to resolve inside the runs folder before
it is removed. Anything else in the folder, and everything outside it, is left
alone.

    python -m soak.report.retention RUNS_DIR --keep 14 [--dry-run]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from soak.events import EventType
from soak.fsio import symlink_atomic
from soak.jsonl import is_timestamp
from soak.records import Verdict
from soak.store.rundir import RunDir, is_run_dir

LATEST = "latest"


@dataclass(frozen=True)
class RunEntry:
    path: Path
    started_at: float
    failed: bool


@dataclass(frozen=True)
class RetentionResult:
    kept: tuple[Path, ...]
    deleted: tuple[Path, ...]
    newest_failure: Path | None
    latest: Path | None


def _first_ts(run: RunDir) -> float | None:
    """The first event's label: when a run cut off before its summary started."""
    try:
        first = next(run.events(fields={"ts": is_timestamp}), None)
    except OSError:
        return None
    ts = first.get("ts") if first is not None else None
    return float(ts) if ts is not None else None


def _failed_without_summary(run: RunDir) -> bool:
    """A run cut off before its summary: an incident's evidence or event counts as a failure."""
    if any((folder / "incident.json").is_file() for folder in run.incident_dirs()):
        return True
    try:
        return any(event.get("type") == EventType.INCIDENT for event in run.events())
    except OSError:
        return False


def _describe(path: Path) -> RunEntry:
    run = RunDir(path)
    summary = run.summary()
    started = summary.started_at if summary is not None else None
    if started is None:
        started = _first_ts(run)
    if started is None:
        started = path.stat().st_mtime
    if summary is not None:
        failed = summary.verdict is Verdict.FAIL or bool(summary.incidents)
    else:
        failed = _failed_without_summary(run)
    return RunEntry(path=path, started_at=float(started), failed=failed)


def find_runs(runs_dir: Path) -> list[RunEntry]:
    """Run directories directly inside ``runs_dir``, newest first."""
    out = []
    for child in runs_dir.iterdir():
        if not child.is_symlink() and is_run_dir(child):
            out.append(_describe(child))
    out.sort(key=lambda r: (r.started_at, r.path.name), reverse=True)
    return out


def _inside(path: Path, root: Path) -> bool:
    try:
        resolved = path.resolve(strict=True)
    except OSError:
        return False
    return resolved.parent == root and not path.is_symlink()


def update_latest(runs_dir: Path, target: Path | None) -> Path | None:
    """Point ``runs_dir/latest`` at ``target`` (relative link, replaced atomically)."""
    link = runs_dir / LATEST
    if link.exists() and not link.is_symlink():
        raise ValueError(f"{link} exists and is not a symlink; not touching it")
    if target is None:
        if link.is_symlink():
            link.unlink()
        return None
    symlink_atomic(target.name, link)
    return link


def prune(runs_dir: str | Path, *, keep: int, dry_run: bool = False) -> RetentionResult:
    if keep < 1:
        raise ValueError("keep must be at least 1")
    root = Path(runs_dir).resolve(strict=True)
    if not root.is_dir():
        raise ValueError(f"{runs_dir} is not a directory")
    runs = find_runs(root)
    keep_set = {r.path for r in runs[:keep]}
    newest_failure = next((r.path for r in runs if r.failed), None)
    if newest_failure is not None:
        keep_set.add(newest_failure)
    deleted = []
    for run in runs:
        if run.path in keep_set:
            continue
        if not _inside(run.path, root):
            continue
        if not dry_run:
            shutil.rmtree(run.path)
        deleted.append(run.path)
    latest = None
    if not dry_run:
        latest = update_latest(root, runs[0].path if runs else None)
    kept = tuple(r.path for r in runs if r.path in keep_set)
    return RetentionResult(kept=kept, deleted=tuple(deleted), newest_failure=newest_failure, latest=latest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m soak.report.retention", description=__doc__.splitlines()[0])
    parser.add_argument("runs_dir", type=Path, help="the folder that holds one directory per run")
    parser.add_argument("--keep", type=int, default=14, help="how many of the newest runs to keep (default 14)")
    parser.add_argument("--dry-run", action="store_true", help="print what would be deleted, delete nothing")
    args = parser.parse_args(argv)
    try:
        result = prune(args.runs_dir, keep=args.keep, dry_run=args.dry_run)
    except (OSError, ValueError) as exc:
        print(f"retention: {args.runs_dir}: {exc}", file=sys.stderr)
        return 2
    verb = "would delete" if args.dry_run else "deleted"
    for path in result.deleted:
        print(f"{verb} {path}")
    print(f"kept {len(result.kept)} run(s)"
          + (f"; newest failing run kept: {result.newest_failure.name}" if result.newest_failure else "")
          + (f"; latest -> {os.readlink(result.latest)}" if result.latest else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
