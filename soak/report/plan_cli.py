"""``soak plan --baseline-mtbf 15m --confidence 0.95``: how long a clean soak must
run to reject the baseline MTBF (and how long with one or two hangs allowed).

``--json`` prints the same as one JSON document (keys in ``JSON_HELP``)."""

from __future__ import annotations

import argparse


JSON_HELP = ("print one JSON document instead of the text; its fields are version (1), baseline_mtbf_s, "
             "confidence, clean_exposure_s (the run length with no hang), factor (clean_exposure_s over the "
             "baseline), allowed (a list of {hangs, exposure_s}, 0 to --max-hangs), lines (the text's lines)")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline-mtbf", required=True, metavar="DURATION",
                        help="the MTBF to beat, e.g. 15m (the unfixed server's mean time between hangs)")
    parser.add_argument("--confidence", type=float, default=0.95, help="confidence level (default 0.95)")
    parser.add_argument("--max-hangs", type=int, default=2, metavar="N",
                        help="also show the run length when up to N hangs are allowed (default 2)")
    parser.add_argument("--json", action="store_true", help=JSON_HELP)


def main(args: argparse.Namespace) -> int:
    return plan(args.baseline_mtbf, confidence=args.confidence, max_hangs=args.max_hangs, as_json=args.json)


def plan_lines(baseline_s: float, *, confidence: float, max_hangs: int) -> list[str]:
    from soak.durations import format_duration
    from soak.report.stats import required_clean_exposure

    pct = f"{confidence * 100:g}%"
    clean = required_clean_exposure(baseline_s, confidence=confidence)
    lines = [
        f"To show MTBF above {format_duration(baseline_s, approx=True)} at {pct} confidence, run "
        f"{format_duration(clean)} ({clean / 60:.1f} min of load) with no hang.",
        f"  (Poisson process, one-sided exact chi-square: T = MTBF x chi2({confidence:g}; 2) / 2 "
        f"= {clean / baseline_s:.3f} x baseline)",
    ]
    for k in range(1, max_hangs + 1):
        t = required_clean_exposure(baseline_s, confidence=confidence, allowed_failures=k)
        lines.append(f"With {k} hang{'s' if k > 1 else ''} in the run: {format_duration(t)} ({t / 60:.1f} min).")
    return lines


def plan_json(baseline_s: float, *, confidence: float, max_hangs: int) -> dict:
    """The text's content as data: the same figures, its lines too."""
    from soak.report.stats import required_clean_exposure

    clean = required_clean_exposure(baseline_s, confidence=confidence)
    allowed = [{"hangs": k, "exposure_s": clean if k == 0 else
                required_clean_exposure(baseline_s, confidence=confidence, allowed_failures=k)}
               for k in range(max_hangs + 1)]
    return {"version": 1, "baseline_mtbf_s": baseline_s, "confidence": confidence, "clean_exposure_s": clean,
            "factor": clean / baseline_s, "allowed": allowed,
            "lines": plan_lines(baseline_s, confidence=confidence, max_hangs=max_hangs)}


def plan(baseline: str, *, confidence: float, max_hangs: int, as_json: bool = False) -> int:
    from soak.durations import duration_flag
    from soak.errors import ArgumentError

    baseline_s = duration_flag(baseline, flag="--baseline-mtbf", positive=True)
    if not 0 < confidence < 1:
        raise ArgumentError(f"--confidence must be between 0 and 1, got {confidence}")
    if not 0 <= max_hangs <= 20:
        raise ArgumentError("--max-hangs must be between 0 and 20")
    if as_json:
        import json

        print(json.dumps(plan_json(baseline_s, confidence=confidence, max_hangs=max_hangs), indent=2,
                         allow_nan=False))
        return 0
    print("\n".join(plan_lines(baseline_s, confidence=confidence, max_hangs=max_hangs)))
    return 0
