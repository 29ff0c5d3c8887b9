"""``soak`` command line: a thin dispatcher.

Each command lives with its stage and exposes ``configure(parser)`` and
``main(args) -> int``; ``main`` unpacks the namespace into explicit keyword
arguments at once, so no argparse namespace travels further. Errors from the
``soak.errors`` tree become one line on stderr and their exit status.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

from soak import __version__
from soak.errors import SoakError, UsageError

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("soak.run.cli", "run a soak from a config (the main job)"),
    "validate": ("soak.run.validate_cli", "check a config and its workload, print the plan, run nothing"),
    "sim": ("soak.sim.cli", "the simulated pipeline-parallel vLLM server, in the foreground"),
    "report": ("soak.report.cli", "render summary.json, report.html and junit.xml from a run directory"),
    "compare": ("soak.report.compare_cli", "compare two runs: throughput, latency, hit ratio, hang rate"),
    "diagnose": ("soak.report.diagnose_cli", "name the first divergence of the NCCL flight-recorder dumps"),
    "plan": ("soak.report.plan_cli", "how long a clean soak must run to beat a baseline MTBF"),
    "history": ("soak.history.cli", "many runs read together: MTBF per build, fixed or not, cost between builds"),
    "bisect": ("soak.bisect.cli", "which build broke it? soak segments of ordered builds until one is named first bad"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        self.exit(2, f"{self.prog}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="soak", description="Soak-test harness for vLLM servers.")
    parser.add_argument("--version", action="version", version=f"soak {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(module_name)
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.configure(command_parser)
        command_parser.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # stdout and stderr are write boundaries like the run directory's files: the
    # live view, warnings, argparse's and the one error line pass the redactor
    # (soak.redact). The environment's secrets are known now; a run adds its own
    # (follow_in_streams). The simulator is a server, not the harness: its log is its own.
    from soak.redact import RedactingStream, Redactor

    saved = sys.stdout, sys.stderr
    redactor = Redactor.for_run(environ=os.environ)
    sys.stdout, sys.stderr = RedactingStream(sys.stdout, redactor), RedactingStream(sys.stderr, redactor)
    # An exception that escapes leaves them in place: the interpreter prints its
    # traceback to sys.stderr, redacted too.
    args = build_parser().parse_args(argv)
    if args.command == "sim":
        sys.stdout, sys.stderr = saved
    code = _dispatch(args)
    sys.stdout, sys.stderr = saved
    return code


def _dispatch(args: argparse.Namespace) -> int:
    try:
        return int(args._module.main(args) or 0)
    except UsageError as exc:
        print(f"soak {args.command}: {exc}", file=sys.stderr)
        return 2
    except SoakError as exc:
        print(f"soak {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"soak {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
