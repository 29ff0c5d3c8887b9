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
    """Renders whatever the directory holds; a damaged one (torn lines, a missing
    or unreadable summary, a run that never started) still renders, and what
    cannot be done is one line: exit 2 for a run that cannot be read, exit 4
    for the harness's own I/O; never a traceback."""
    import os

    from soak.errors import ArgumentError, ConfigError, HarnessFault, SoakError
    from soak.redact import Redactor
    from soak.report.render import ended_because, write_report

    if not 0 < confidence < 1:
        raise ArgumentError(f"--confidence must be between 0 and 1, got {confidence}")
    try:
        written = write_report(run_dir, confidence=confidence)
    except SoakError:
        raise
    except OSError as exc:
        raise HarnessFault(f"{run_dir}: cannot write the report: {exc.strerror or exc}") from exc
    except (MemoryError, RecursionError, Exception) as exc:
        # The run's records are input: one damaged in a way no reader foresaw is
        # exit 2 naming the run, as load_run says of the damage it knows.
        raise ConfigError(f"cannot render the report: {type(exc).__name__}: {exc}"[:300], path=run_dir) from exc
    # The same redactor as the run's, from this environment: a key never reaches the report.
    redactor = Redactor.for_run(environ=os.environ)
    for path in (written.html, written.junit, written.summary):
        if path is not None:
            redactor.scrub_file(path, shapes=True)  # every shape: URLs, flags, headers
    model = written.model
    line = f"{model.name}: {model.verdict}" + (" (cut off)" if model.cut_off else "")
    if model.mtbf is not None:
        line += f"; {model.mtbf.sentence()}"
    print(line)
    why = ended_because(written.html.parent, model.summary)
    if why:
        print(why)
    print(f"wrote {written.html}")
    print(f"wrote {written.junit}")
    return 0
