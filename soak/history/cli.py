"""``soak history DIR...``: history.html, history.csv and history.json over many runs.

``--json``: stdout is one JSON document (keys in ``JSON_HELP``) instead of the
text; the files are written all the same, and skipped runs still go to stderr."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from soak.printable import printable


JSON_HELP = ("print one JSON document instead of the text; its fields are version (1), lines (the text's "
             "lines: a line per build ending in its one verdict, then the lead), history "
             "(what history.json holds: confidence, baseline, baseline_mtbf_s, best, builds, rate_tests, costs, "
             "runs, and proofs with --prove), written ({html, csv, json}: the paths written), pushed (null, or "
             "{url, job, builds} with --pushgateway)")


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
    parser.add_argument("--json", action="store_true", help=JSON_HELP)
    prove = parser.add_argument_group(
        "is it fixed? (--prove: Wald's sequential test over each build's nights, as a run config's prove: section)")
    prove.add_argument("--prove", nargs="?", const="", default=None, metavar="BUILD",
                       help="test BUILD (default: every build but --broken-build) over its nights laid end to end")
    prove.add_argument("--broken-mtbf", default=None, help="θ1, the broken build's MTBF, e.g. 20m")
    prove.add_argument("--broken-build", default=None, metavar="BUILD",
                       help="take θ1 from this build's nights in the history (its exposure over its hangs)")
    prove.add_argument("--target-mtbf", default=None, help="θ0, the MTBF a fixed build has, e.g. 200m")
    prove.add_argument("--ratio", type=float, default=None, help="θ0 as a multiple of θ1 (instead of --target-mtbf)")
    prove.add_argument("--alpha", type=float, default=0.05, help="risk of calling a fixed build broken (default 0.05)")
    prove.add_argument("--beta", type=float, default=0.05, help="risk of calling a broken build fixed (default 0.05)")
    prove.add_argument("--max-exposure", default=None, help="truncation: the test ends undecided after this exposure")
    prove.add_argument("--max-hangs", type=int, default=None, help="truncation: ... or at this many hangs")


_PROVE_FLAGS = {"broken_mtbf": "--broken-mtbf", "broken_build": "--broken-build", "target_mtbf": "--target-mtbf",
                "ratio": "--ratio", "alpha": "--alpha", "beta": "--beta", "max_exposure": "--max-exposure",
                "max_hangs": "--max-hangs"}


def prove_section(args: argparse.Namespace, dirs: list[Path]) -> Any:
    """The flags as a ``prove:`` section, checked by the same rules (one line, exit 2)."""
    from pydantic import ValidationError

    from soak.errors import ArgumentError
    from soak.prove.config import ProveConfig

    given = {key: getattr(args, key) for key in _PROVE_FLAGS if getattr(args, key) is not None}
    if "broken_build" in given:
        given["history"] = str(dirs[0])  # the history given is where the broken build's nights are
    try:
        return ProveConfig.model_validate(given)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        field = error["loc"][0] if error["loc"] else None
        flag = _PROVE_FLAGS.get(str(field), "--prove")
        raise ArgumentError(f"{flag}: {error['msg'].removeprefix('Value error, ')}".replace("_mtbf", "-mtbf")
                            .replace("broken_build", "broken-build")) from None


def main(args: argparse.Namespace) -> int:
    section = prove_section(args, args.dirs) if args.prove is not None else None
    return history(args.dirs, out=args.out, confidence=args.confidence, baseline=args.baseline,
                   baseline_mtbf=args.baseline_mtbf, window=args.window, pushgateway=args.pushgateway,
                   job=args.job, labels=args.label, reports=args.reports, prove=section, prove_build=args.prove,
                   as_json=args.json)


def history(dirs: list[Path], *, out: Path | None, confidence: float, baseline: str | None,
            baseline_mtbf: str | None, window: str, pushgateway: str | None, job: str, labels: list[str],
            reports: Path | None = None, prove: Any = None, prove_build: str | None = None,
            as_json: bool = False) -> int:
    from soak.durations import duration_flag
    from soak.errors import ArgumentError
    from soak.history.collect import find_runs, is_run_dir
    from soak.history.render import write_history

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
        print(printable(f"soak history: skipped {error}"), file=sys.stderr)

    h = build_history(runs, confidence=confidence, baseline=baseline, baseline_mtbf_s=baseline_mtbf_s,
                      window_s=window_s, reports=reports, on_skip=skip)
    if prove is not None:
        h = with_proofs(h, prove, only=prove_build or None)
    if out is None:
        out = dirs[0] if len(dirs) == 1 and not is_run_dir(dirs[0]) else Path(".")
    written = write_history(h, out)
    if not as_json:
        for line in terminal_lines(h):
            print(line)
        for path in written.values():
            print(printable(f"wrote {path}"))
    pushed = None
    if pushgateway:
        from soak.report.push import push_history

        push_history(h, url=pushgateway, job=job, grouping=grouping)
        pushed = {"url": pushgateway, "job": job, "builds": len(h.builds)}
        if not as_json:
            print(f"pushed {len(h.builds)} builds to {pushgateway} (job {job})")
    if as_json:
        print(history_document(h, written=written, pushed=pushed))
    return 0


def history_document(h: Any, *, written: dict[str, Path], pushed: dict[str, Any] | None) -> str:
    """What the text says, as one JSON document. Labels from run directories stay
    as they are (JSON escapes control bytes: nothing in it drives a terminal)."""
    import json

    from soak.history.render import history_json

    document = {"version": 1, "lines": terminal_lines(h), "history": history_json(h),
                "written": {kind: str(path) for kind, path in written.items()}, "pushed": pushed}
    return json.dumps(document, indent=2, allow_nan=False)


def terminal_lines(h: Any) -> list[str]:
    """What ``soak history`` prints of a history: a line per build ending in its one
    verdict (soak.history.verdict: the sequential test's sentence for a build ``--prove``
    tested), then the lead, which repeats the sentence of the build closest to fixed.
    Build labels come from run
    directories: hostile, so each line goes through soak.printable (an escape
    sequence in a label must not drive the terminal)."""
    from soak.history.render import no_baseline_sentence

    lines = []
    # A label that named several builds is said once, before its first build: what differed.
    splits = {split.builds[0]: split for split in h.splits}
    for b in h.builds:
        if b.build in splits:
            lines.append(splits[b.build].sentence())
        line = f"{b.build}: {b.runs} runs, " + (b.mtbf.sentence() if b.mtbf else "no exposure")
        lines.append(line + (f"; {b.verdict}" if b.verdict and b.verdict != "baseline"
                             else (" (baseline)" if b.verdict else "")))
    if h.best:
        lines.append(str(h.best["statement"]))
    elif h.baseline is None:
        lines.append(no_baseline_sentence(h))
    return [printable(line) for line in lines]


def with_proofs(h: Any, section: Any, *, only: str | None) -> Any:
    """The history with each tested build's sequential test (``soak.history.prove``):
    ``only`` that build, else every build but the broken one."""
    import dataclasses

    from soak.errors import ArgumentError, ConfigError
    from soak.history.prove import broken_mtbf_of, prove_builds
    from soak.history.verdict import judged
    from soak.prove.config import plan_of

    known = [b.build for b in h.builds]
    try:
        broken = broken_mtbf_of(h.runs, section.broken_build) if section.broken_build is not None else None
    except ConfigError as exc:  # a label of several builds: their hangs are not one build's MTBF
        raise ArgumentError(f"--broken-build: {exc.message}") from None
    try:
        plan = plan_of(section, broken_mtbf_s=broken)
    except ValueError as exc:
        raise ArgumentError(f"--broken-build: {exc} (builds: {', '.join(known)})") from None
    labels: dict[str, list[str]] = {}  # label -> its builds: one label may name several (what ran differed)
    for r in h.runs:
        if r.label and r.build not in labels.setdefault(r.label, []):
            labels[r.label].append(r.build)
    if only is not None and only not in known and only not in labels:
        raise ArgumentError(f"--prove: no build {only!r} among the runs, known: {', '.join(known)}")
    skip = set(labels.get(section.broken_build or "", [section.broken_build]))
    # A label of several builds: each tested on its own nights, never pooled.
    builds = (([only] if only in known else labels[only]) if only is not None
              else [b for b in known if b not in skip])
    # the proofs are evidence: every build's one verdict and the lead are judged again with them
    return judged(dataclasses.replace(h, proofs=prove_builds(plan, h.runs, builds)))
