"""``soak run CONFIG [--out DIR] [--duration 66m]``: the main job.

Validates the whole config (and builds the workload) before anything starts,
then runs the soak: starts or attaches to the target, drives the load, samples,
judges, responds, and records everything in the run directory. Exit status per
CONTRACTS.md: 0 pass, 1 incident, 2 bad config, 3 target never ready or the
environment lacks something, 130 interrupted (the results so far are kept).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", type=Path, help="the run config (YAML)")
    parser.add_argument("--out", metavar="DIR", type=Path, default=None,
                        help="the run directory (new or empty; default runs/<name>-<UTC time>)")
    parser.add_argument("--duration", metavar="DURATION", default=None,
                        help="overrides the config's duration, e.g. 90s, 66m, 1h30m")
    parser.add_argument("--view", choices=("auto", "rich", "plain", "off"), default=None,
                        help="live view: rich status on a terminal, plain lines otherwise (default: the config's, auto)")


def main(args: argparse.Namespace) -> int:
    return run(args.config, out=args.out, duration=args.duration, view=args.view)


def run(config_path: Path, *, out: Path | None, duration: str | None, view: str | None) -> int:
    import asyncio
    import sys

    from soak.config import duration_flag, load_run_config
    from soak.run.wiring import build_soak_run

    config = load_run_config(config_path, duration=duration_flag(duration))
    soak_run = build_soak_run(config, config_path=Path(config_path), out=out, view_mode=view)
    outcome = asyncio.run(soak_run.run())
    summary = outcome.summary
    requests = summary.get("requests", {})
    print(
        f"soak run: {outcome.verdict} ({outcome.reason}); requests ok {requests.get('ok')} "
        f"failed {requests.get('failed')}; incidents {len(summary.get('incidents', []))}; "
        f"{soak_run.run_dir}/summary.json",
        file=sys.stderr,
    )
    return outcome.exit_code
