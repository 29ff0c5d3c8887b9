"""``soak run CONFIG [--out DIR] [--duration 66m]``: the main job.

Validates the whole config (and builds the workload) before anything starts,
then runs the soak: starts or attaches to the target, drives the load, samples,
judges, responds, and records everything in the run directory. Exit status per
CONTRACTS.md: 0 pass, 1 incident, 2 bad config, 3 target never ready, the
environment lacks something or the target is not what the config says, 4 the
harness itself failed (traceback in harness_error.txt), 130 interrupted (the
results so far are kept); with a ``prove:`` section, 0 accepted, 1 rejected and
5 undecided (docs/prove.md, "contract addition").
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from soak.summary_file import RunSummary


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", type=Path, help="the run config (YAML)")
    parser.add_argument("--out", metavar="DIR", type=Path, default=None,
                        help="the run directory (new or empty; default runs/<name>-<UTC time>)")
    parser.add_argument("--duration", metavar="DURATION", default=None,
                        help="overrides the config's duration, e.g. 90s, 66m, 1h30m")
    parser.add_argument("--view", choices=("auto", "rich", "plain", "off"), default=None,
                        help="live view: rich status on a terminal, plain lines otherwise (default: the config's, auto)")
    parser.add_argument("--exporter-port", metavar="PORT", type=_port, default=None,
                        help="the harness's Prometheus port (overrides exporter.port; 0 picks a free one, "
                             "named in the start line)")
    parser.add_argument("--no-html", action="store_true",
                        help="end without report.html (summary.json and junit.xml are still written; "
                             "`soak report DIR` renders the page later): the run's end then does no plotting")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0-65535)")
    return value


def main(args: argparse.Namespace) -> int:
    return run(args.config, out=args.out, duration=args.duration, view=args.view,
               exporter_port=args.exporter_port, report_html=not args.no_html)


def run(config_path: Path, *, out: Path | None, duration: str | None, view: str | None,
        exporter_port: int | None = None, report_html: bool = True) -> int:
    import asyncio
    import sys

    from soak.config import load_run_config
    from soak.durations import duration_flag
    from soak.errors import HarnessFault, SoakError
    from soak.run.heap import bound_heap_growth
    from soak.run.wiring import build_soak_run
    from soak.summary_file import RunSummary

    heap = bound_heap_growth()  # first: the heap a day-long run grows is shaped from its start
    config = load_run_config(config_path, duration=duration_flag(duration))
    try:
        soak_run = build_soak_run(config, config_path=Path(config_path), out=out, view_mode=view,
                                  exporter_port=exporter_port, report_html=report_html, heap=heap)
    except (SoakError, KeyboardInterrupt):
        raise
    except Exception as exc:  # a bug before anything started: one line, exit 4
        raise HarnessFault(f"harness fault before the run started: {type(exc).__name__}: {exc}") from exc
    if heap.trimmer is not None:
        heap.trimmer.start()
    try:
        outcome = asyncio.run(soak_run.run())
    finally:
        if heap.trimmer is not None:
            heap.trimmer.close()
    say_end(RunSummary.of(outcome.summary), exit_code=outcome.exit_code, run_dir=soak_run.run_dir,
            stream=sys.stderr)
    return outcome.exit_code


def say_end(summary: RunSummary, *, exit_code: int, run_dir: Path, stream: TextIO) -> None:
    """The end-of-run block (soak.run.end_block), on every view mode; colour as soak.colour says."""
    from soak.report.oracle import read_oracle
    from soak.run.end_block import end_block

    files = [str(run_dir / name) for name in ("report.html", "summary.json") if (run_dir / name).exists()]
    build = summary.build_entry.key if summary.build_entry is not None else None
    import os

    from soak.colour import colour_wanted

    colour = colour_wanted(stream, os.environ)  # NO_COLOR wins; FORCE_COLOR; else a terminal
    try:
        # The time at risk is the judge's (summary.json's time_at_risk_s): one MTBF a night.
        stream.write(end_block(summary, exit_code=exit_code, files=files, build=build, colour=colour,
                               at_risk=summary.at_risk, oracle=read_oracle(run_dir)))
        stream.flush()
    except (OSError, ValueError):
        pass  # a closed stream: the run's record and exit status stand
