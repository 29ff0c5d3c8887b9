"""Find run directories and turn them into a ``History`` (the I/O edge of soak/history).

``find_runs(paths)``: each path is a run directory, or a folder of them (only
its direct children; symlinks such as the nightly's ``latest`` are skipped so
no run counts twice). What a run directory is: ``soak.store.rundir.is_run_dir``. ``build_history(runs, ...)`` reads each run once
(soak.report.rundir.load_run: the run store's own summary, also of a run that
was cut off) and computes everything in soak.history.model.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from soak.errors import ConfigError
from soak.history.build import LabelSplit, group_keys, label_splits
from soak.redact import clip
from soak.history.model import (
    BuildStats, Cost, History, RunRecord, build_stats, mean_cost, quantile_cost, rate_test, run_record,
)
from soak.history.verdict import judged as judge
from soak.store.rundir import MARKERS_TEXT, is_run_dir


def find_runs(paths: Sequence[str | Path]) -> list[Path]:
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            raise ConfigError("not a directory", path=path)
        if is_run_dir(path):
            found.append(path)
            continue
        children = sorted(c for c in path.iterdir() if not c.is_symlink() and is_run_dir(c))
        if not children:
            raise ConfigError(f"neither a run directory nor a folder of them ({MARKERS_TEXT})", path=path)
        found.extend(children)
    unique: dict[Path, Path] = {}
    for p in found:
        unique.setdefault(p.resolve(), p)
    return list(unique.values())


def report_of(path: Path, reports: Path | None) -> str | None:
    """The run's report.html while it exists: beside the run, or, for a run kept
    beyond retention without it (the nightly's history copies), in ``reports``
    under the run's directory name (the nightly's runs folder)."""
    for folder in ([reports / path.name] if reports is not None else []) + [path]:
        candidate = folder / "report.html"
        if candidate.is_file():
            return str(candidate.absolute())  # absolute: the page links to it relative to where it is written
    return None


def _requests(path: Path) -> Iterator[dict[str, Any]]:
    """The run's request records, for the evidence of work its time at risk needs
    (``soak.exposure.intervals_of``); damaged lines are skipped (the load already counted them)."""
    from soak.store.rundir import RunDir
    from soak.store.summary import REQUEST_TYPES

    return RunDir(path).requests(fields=REQUEST_TYPES)


def read_night(path: Path, *, window_s: float, reports: Path | None = None
               ) -> tuple[RunRecord, list[float], dict[str, list[float]]]:
    """One run's record, throughput windows and latencies; a run that cannot be
    read (damaged in any way) is one ``ConfigError`` naming it, never a traceback."""
    from soak.report.compare import window_throughput
    from soak.report.rundir import load_run

    try:
        data = load_run(path)
        record = run_record(path=str(path), summary=data.summary, events=data.events, config=data.config,
                            report=report_of(path, reports), records=_requests(path))
        windows = window_throughput(data, window_s)
        latencies = {key: data.requests.ok_values(key).tolist() for key in ("ttft_s", "tpot_s")}
    except ConfigError:
        raise
    except (MemoryError, RecursionError, Exception) as exc:  # a damage no reader foresaw: this night only
        raise ConfigError(clip(f"cannot read the run: {type(exc).__name__}: {exc}", 300), path=path) from exc
    return record, windows, latencies


def build_history(run_dirs: Sequence[Path], *, confidence: float = 0.95, baseline: str | None = None,
                  baseline_mtbf_s: float | None = None, window_s: float = 60.0, resamples: int = 400,
                  reports: Path | None = None, on_skip: Callable[[ConfigError], None] | None = None) -> History:
    """Every readable run pooled; a run that cannot be read is left out and
    handed to ``on_skip`` (one line naming it), so one bad night never blocks
    the others. None readable is a ``ConfigError``.

    The baseline build is the one a person names (``baseline``), never a guess:
    a guess (the highest hang rate) flipped to another build when one night was
    added, and turned the page's lead sentence around. Without one there is no
    verdict against a build, no rate test and no cost; ``baseline_mtbf_s`` alone
    still judges every build against that MTBF."""
    nights: list[tuple[RunRecord, list[float], dict[str, list[float]]]] = []
    skipped: list[ConfigError] = []
    for path in run_dirs:
        try:
            nights.append(read_night(path, window_s=window_s, reports=reports))
        except ConfigError as exc:
            skipped.append(exc)
            if on_skip is not None:
                on_skip(exc)
            continue
    if run_dirs and not nights:
        raise ConfigError(f"no readable run among {len(run_dirs)}: first skipped: {skipped[0]}"[:400])
    nights.sort(key=lambda n: (n[0].started_at is None, n[0].started_at or 0.0, n[0].path))
    # A build is what ran: nights pool under one key only where their identity is equal
    # (soak.history.build.group_keys), so a label that named two builds is two.
    keys = group_keys([n[0] for n in nights])
    records: list[RunRecord] = []
    windows: dict[str, list[float]] = {}
    latencies: dict[str, dict[str, list[float]]] = {}
    for (record, night_windows, night_latencies), key in zip(nights, keys):
        record = dataclasses.replace(record, build=key)
        records.append(record)
        windows.setdefault(record.build, []).extend(night_windows)
        lat = latencies.setdefault(record.build, {"ttft_s": [], "tpot_s": []})
        for name, into in lat.items():
            into.extend(night_latencies[name])
    splits = label_splits([(r.label, r.build, r.facts) for r in records])
    baseline = baseline_key(records, baseline, splits=splits) if baseline is not None else None

    order: list[str] = []
    for r in records:
        if r.build not in order:
            order.append(r.build)
    builds = [build_stats(b, [r for r in records if r.build == b], confidence=confidence) for b in order]
    if baseline is not None and baseline not in order:
        raise ConfigError(f"--baseline: no build {baseline!r} among the runs, known: {', '.join(order)}")
    base = next((b for b in builds if b.build == baseline), None)
    given = baseline_mtbf_s is not None  # --baseline-mtbf: a stated figure, not the baseline's estimate
    if baseline_mtbf_s is None and base is not None and base.mtbf is not None and base.mtbf.point_s is not None:
        baseline_mtbf_s = base.mtbf.point_s

    # Each build's verdict, and the lead, are soak.history.verdict's one sentence (judged below).
    judged: list[BuildStats] = builds

    tests = []
    costs: dict[str, tuple[Cost, ...]] = {}
    if base is not None:
        for b in judged:
            if b.build == base.build or b.exposure_s <= 0:
                continue
            tests.append(rate_test(base, b, confidence=confidence))
            la, lb = latencies[base.build], latencies[b.build]
            costs[b.build] = (
                mean_cost("output_tokens_per_s", windows[base.build], windows[b.build], confidence=confidence,
                          label=f"throughput (generated tokens/s per {window_s:g} s window)"),
                quantile_cost("ttft_p50", 0.50, la["ttft_s"], lb["ttft_s"], confidence=confidence, resamples=resamples),
                quantile_cost("ttft_p99", 0.99, la["ttft_s"], lb["ttft_s"], confidence=confidence, resamples=resamples),
                quantile_cost("tpot_p50", 0.50, la["tpot_s"], lb["tpot_s"], confidence=confidence, resamples=resamples),
                quantile_cost("tpot_p99", 0.99, la["tpot_s"], lb["tpot_s"], confidence=confidence, resamples=resamples),
            )
    return judge(History(confidence=confidence, runs=tuple(records), builds=tuple(judged), baseline=baseline,
                         baseline_mtbf_s=baseline_mtbf_s, rate_tests=tuple(tests), costs=costs, splits=splits,
                         baseline_mtbf_given=given))


def baseline_key(records: Sequence[RunRecord], name: str, *, splits: Sequence[LabelSplit] = ()) -> str:
    """The build ``--baseline NAME`` means: its key, or its ``label@identity``; a label
    that names several builds names none of them (one line saying which there are), and
    a name no run has is left as given (``build_history`` says which builds there are)."""
    for r in records:
        if name in (r.build, r.identity_key):
            return r.build
    for split in splits:
        if split.label == name:
            from soak.errors import ArgumentError
            from soak.printable import printable

            # the labels and facts come from run directories: one printable line (no escape drives the terminal)
            raise ArgumentError(printable(clip(f"--baseline: {split.sentence()}; name one: {', '.join(split.builds)}",
                                               600)))
    return name
