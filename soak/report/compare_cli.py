"""``soak compare RUN_A RUN_B``: throughput, TTFT, ITL, hit ratio and hang rate side
by side with their uncertainty, and a verdict on each difference (B against A)."""

from __future__ import annotations

import argparse
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_a", metavar="RUN_A", type=Path, help="baseline run directory")
    parser.add_argument("run_b", metavar="RUN_B", type=Path, help="candidate run directory")
    parser.add_argument("--confidence", type=float, default=0.95, help="confidence level (default 0.95)")
    parser.add_argument("--window", default="60s", help="window for per-window throughput and hit ratio (default 60s)")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")


def main(args: argparse.Namespace) -> int:
    return compare(args.run_a, args.run_b, confidence=args.confidence, window=args.window, as_json=args.json)


def compare(run_a: Path, run_b: Path, *, confidence: float, window: str, as_json: bool) -> int:
    import dataclasses
    import json

    from soak.durations import duration_flag
    from soak.errors import ArgumentError
    from soak.report.compare import compare_runs, format_comparison
    from soak.report.rundir import load_run

    if not 0 < confidence < 1:
        raise ArgumentError(f"--confidence must be between 0 and 1, got {confidence}")
    window_s = duration_flag(window, flag="--window", positive=True)
    a, b = load_run(run_a), load_run(run_b)
    result = compare_runs(a, b, a_name=run_a.name or str(run_a), b_name=run_b.name or str(run_b),
                          window_s=window_s, confidence=confidence)
    if as_json:
        print(json.dumps(dataclasses.asdict(result), default=str, indent=2))
    else:
        print(format_comparison(result))
    return 0
