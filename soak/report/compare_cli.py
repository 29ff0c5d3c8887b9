"""``soak compare RUN_A RUN_B``: throughput, TTFT, ITL, hit ratio and hang rate side
by side with their uncertainty, and a verdict on each difference (B against A).

What the two runs record differently (target, workload, model, layout, build) is
listed first; runs that differ in any but the build are not judged unless
``--force`` (soak.report.compare.compare_pair)."""

from __future__ import annotations

import argparse
from pathlib import Path

# The exit status, as --help and docs/report.md give it.
EXIT_STATUS = """\
exit status:
  0  compared; with --fail-on worse, no row judges B worse. Also runs not compared
     (they differ in target, workload, model or layout) when --fail-on is not given
  1  --fail-on worse, and some row judges B worse than A
  2  bad arguments, or a run directory that cannot be read (one line naming the
     file and the field, no traceback)
  3  --fail-on given, and the runs were not compared: they differ in target,
     workload, model or layout (--force compares them); no verdict is no pass

Lines "differs: ASPECT FIELD A's-value vs B's-value" name what the runs record
differently; "unknown: ..." a fact only one of them records (not held against them).
A build that differs is what an A/B compares: it is named, and the rows are judged."""

FAIL_ON = ("worse",)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXIT_STATUS
    parser.add_argument("run_a", metavar="RUN_A", type=Path, help="baseline run directory")
    parser.add_argument("run_b", metavar="RUN_B", type=Path, help="candidate run directory")
    parser.add_argument("--confidence", type=float, default=0.95, help="confidence level (default 0.95)")
    parser.add_argument("--window", default="60s", help="window for per-window throughput and hit ratio (default 60s)")
    parser.add_argument("--json", action="store_true",
                        help="print the comparison as JSON (rows, compared, not_compared, worse, differences, "
                             "identity)")
    parser.add_argument("--force", action="store_true",
                        help="judge runs that differ in target, workload, model or layout all the same "
                             "(their differences still listed first)")
    parser.add_argument("--fail-on", choices=FAIL_ON, default=None, dest="fail_on",
                        help="worse: exit 1 when a row judges B worse than A, and 3 when the runs were not "
                             "compared (CI reads no verdict as no pass)")


def main(args: argparse.Namespace) -> int:
    return compare(args.run_a, args.run_b, confidence=args.confidence, window=args.window, as_json=args.json,
                   force=args.force, fail_on=args.fail_on)


def compare(run_a: Path, run_b: Path, *, confidence: float, window: str, as_json: bool, force: bool = False,
            fail_on: str | None = None) -> int:
    import json

    from soak.durations import duration_flag
    from soak.errors import ArgumentError
    from soak.report.compare import compare_pair, comparison_json, format_comparison
    from soak.report.rundir import load_run

    if not 0 < confidence < 1:
        raise ArgumentError(f"--confidence must be between 0 and 1, got {confidence}")
    window_s = duration_flag(window, flag="--window", positive=True)
    a, b = load_run(run_a), load_run(run_b)
    result = compare_pair(a, b, a_name=run_a.name or str(run_a), b_name=run_b.name or str(run_b), force=force,
                          window_s=window_s, confidence=confidence)
    if as_json:
        print(json.dumps(comparison_json(result), default=str, indent=2))
    else:
        print(format_comparison(result))
    return exit_status(compared=result.compared, worse=result.worse(), fail_on=fail_on)


def exit_status(*, compared: bool, worse: bool, fail_on: str | None) -> int:
    """EXIT_STATUS: without --fail-on compare only reports (0, as it always did)."""
    if fail_on is None:
        return 0
    if not compared:
        return 3
    return 1 if worse else 0
