"""``soak history DIR...``: history.html, history.csv and history.json over many runs."""

from __future__ import annotations

import argparse
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirs", metavar="DIR", nargs="+", type=Path,
                        help="run directories, or folders of them (such as the nightly's runs folder)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write history.* (default: the folder of runs given, else the current directory)")
    parser.add_argument("--confidence", type=float, default=0.95, help="confidence level (default 0.95)")
    parser.add_argument("--baseline", default=None, metavar="BUILD",
                        help="the build to judge the others against (default: none; history never picks one "
                             "itself, so adding a night cannot change it)")
    parser.add_argument("--baseline-mtbf", default=None,
                        help="judge against this MTBF instead of the baseline build's, e.g. 15m")
    parser.add_argument("--reports", type=Path, default=None, metavar="DIR",
                        help="where each run's report.html lives when the run directories given are copies "
                             "without it (the nightly's runs folder): DIR/<run name>/report.html")
    parser.add_argument("--window", default="60s", help="throughput window for the cost between builds (default 60s)")
    parser.add_argument("--pushgateway", default=None, metavar="URL",
                        help="also push each build's pooled exposure, hangs and MTBF to this Pushgateway")
    parser.add_argument("--job", default="soak_history", help="the Pushgateway job (default soak_history)")
    parser.add_argument("--label", action="append", default=[], metavar="NAME=VALUE",
                        help="a grouping label for the push, e.g. box=rtx3090-01 (repeatable)")


def main(args: argparse.Namespace) -> int:
    return history(args.dirs, out=args.out, confidence=args.confidence, baseline=args.baseline,
                   baseline_mtbf=args.baseline_mtbf, window=args.window, pushgateway=args.pushgateway,
                   job=args.job, labels=args.label, reports=args.reports)


def history(dirs: list[Path], *, out: Path | None, confidence: float, baseline: str | None,
            baseline_mtbf: str | None, window: str, pushgateway: str | None, job: str, labels: list[str],
            reports: Path | None = None) -> int:
    from soak.durations import duration_flag
    from soak.errors import ArgumentError
    from soak.history.collect import find_runs, is_run_dir
    from soak.history.render import no_baseline_sentence, write_history

    if not 0 < confidence < 1:
        raise ArgumentError(f"--confidence must be between 0 and 1, got {confidence}")
    window_s = duration_flag(window, flag="--window", positive=True)
    baseline_mtbf_s = duration_flag(baseline_mtbf, flag="--baseline-mtbf", positive=True)
    grouping: dict[str, str] = {}
    for item in labels:
        name, eq, value = item.partition("=")
        if not eq or not name.isidentifier():
            raise ArgumentError(f"--label {item!r}: expected NAME=VALUE")
        grouping[name] = value
    if reports is not None and not reports.is_dir():
        raise ArgumentError(f"--reports {reports}: not a directory")
    runs = find_runs(dirs)
    from soak.history.collect import build_history

    import sys

    def skip(error: Exception) -> None:  # one line per night left out; the others still count
        print(f"soak history: skipped {error}", file=sys.stderr)

    h = build_history(runs, confidence=confidence, baseline=baseline, baseline_mtbf_s=baseline_mtbf_s,
                      window_s=window_s, reports=reports, on_skip=skip)
    if out is None:
        out = dirs[0] if len(dirs) == 1 and not is_run_dir(dirs[0]) else Path(".")
    written = write_history(h, out)
    for b in h.builds:
        line = f"{b.build}: {b.runs} runs, " + (b.mtbf.sentence() if b.mtbf else "no exposure")
        print(line + (f"; {b.verdict}" if b.verdict and b.verdict != "baseline" else (" (baseline)" if b.verdict else "")))
    if h.best:
        print(h.best["statement"])
    elif h.baseline is None:
        print(no_baseline_sentence(h))
    for path in written.values():
        print(f"wrote {path}")
    if pushgateway:
        from soak.report.push import push_history

        push_history(h, url=pushgateway, job=job, grouping=grouping)
        print(f"pushed {len(h.builds)} builds to {pushgateway} (job {job})")
    return 0
