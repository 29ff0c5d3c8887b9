"""``soak report DIR``: summary.json, report.html and junit.xml from a run directory,
also from a run that was cut off."""

from __future__ import annotations

import argparse
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="DIR", type=Path, help="the run directory")
    parser.add_argument("--confidence", type=float, default=0.95,
                        help="confidence level of the MTBF statement (default 0.95)")


def main(args: argparse.Namespace) -> int:
    return report(args.run_dir, confidence=args.confidence)


def report(run_dir: Path, *, confidence: float) -> int:
    from soak.errors import ArgumentError
    from soak.report.render import write_report

    if not 0 < confidence < 1:
        raise ArgumentError(f"--confidence must be between 0 and 1, got {confidence}")
    written = write_report(run_dir, confidence=confidence)
    model = written.model
    line = f"{model.name}: {model.verdict}" + (" (cut off)" if model.cut_off else "")
    if model.mtbf is not None:
        line += f"; {model.mtbf.sentence()}"
    print(line)
    print(f"wrote {written.html}")
    print(f"wrote {written.junit}")
    return 0
