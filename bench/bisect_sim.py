"""Bayesian bisection (soak/bisect/posterior.py) against two plain strategies,
over simulated builds.

    .venv/bin/python bench/bisect_sim.py [--replays 500] [--seed 36] [--segment-min 30]

``--builds`` (8) builds in order; in each replay the first bad build is drawn
uniformly among them (0: every build bad). Good builds hang with an MTBF of
``--good-min`` (200 min), bad ones with ``--bad-min`` (20 min), exponential
(the simulator's pp_deadlock with an MTBF). Every strategy soaks a build in
segments that stop at the build's first hang (the harness kills and moves on),
and sees only exposure and hangs; one seeded stream of hang times per build and
replay is shared by the strategies, so they face the same builds.

- bayes: the pure core's ``step``: soak the build of largest expected
  information gain for ``--segment-min``, until the posterior names a build at
  0.95 or the budget (``--budget-h``, 72 h of soak) is spent. Correct: found,
  and the build named is the first bad one.
- linear: one night (``--night-h``, 8 h) per build, oldest first, restarting
  after every hang as ``on_hang: restart`` does; the first build whose night
  shows an MTBF under ``--linear-cut-min`` (60 min, between the two: the user
  knows roughly how often it hangs now and how rarely it used to) is called
  first bad (the last if none is). A night is booked whole, so its time counts
  whole. (Calling a build bad at its night's first hang instead, as one segment
  stopped at a hang would, is right about 12% of the time: a good build with a
  200-minute MTBF hangs in 91% of 8-hour nights.)
- binary: plain binary search, one fixed-length segment per step: a hang in
  it calls the build bad, none good; ceil(log2 N) steps. Its time counts the
  exposure used (a segment stops at its hang).

Prints, side by side: fraction correct, the median and 90th percentile of total
soak time, and for bayes the share out of budget and the mean segment count.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from soak.bisect.posterior import BisectState, Segment, model, step  # noqa: E402

MIN = 60.0


class Builds:
    """One replay's builds: each build's hang times come from its own seeded
    stream, drawn on demand, so every strategy soaking build j sees the same
    sequence of times to hang (a fresh draw per segment, in order)."""

    def __init__(self, *, count: int, first_bad: int, good_s: float, bad_s: float, seed: str) -> None:
        self.first_bad = first_bad
        self._mtbf = [bad_s if j >= first_bad else good_s for j in range(count)]
        self._seed = seed

    def streams(self) -> list[random.Random]:
        return [random.Random(f"{self._seed}/{j}") for j in range(len(self._mtbf))]

    def night(self, streams: list[random.Random], build: int, length_s: float) -> int:
        """Soak ``build`` for ``length_s``, restarting after each hang: the hang count."""
        t, hangs = 0.0, 0
        while (t := t + streams[build].expovariate(1 / self._mtbf[build])) < length_s:
            hangs += 1
        return hangs

    def segment(self, streams: list[random.Random], build: int, length_s: float) -> Segment:
        """Soak ``build`` for up to ``length_s``, stopping at its first hang."""
        to_hang = streams[build].expovariate(1 / self._mtbf[build])
        return Segment(build, to_hang, 1) if to_hang < length_s else Segment(build, length_s, 0)


def bayes(b: Builds, *, builds: int, segment_s: float, budget_s: float, threshold: float,
          **options: float) -> tuple[bool, float, int, bool]:
    m = model(builds=builds, **options)
    streams = b.streams()
    segments: list[Segment] = []
    while True:
        now = step(segments, model=m, segment_s=segment_s, threshold=threshold, budget_s=budget_s)
        if now.state is not BisectState.SEARCHING:
            spent = sum(s.exposure_s for s in segments)
            found = now.state is BisectState.FOUND
            return found and now.posterior.best == b.first_bad, spent, len(segments), not found
        assert now.choice is not None
        segments.append(b.segment(streams, now.choice.build, segment_s))


def linear(b: Builds, *, builds: int, night_s: float, cut_s: float) -> tuple[bool, float]:
    streams = b.streams()
    for j in range(builds):
        if b.night(streams, j, night_s) > night_s / cut_s:  # observed MTBF under the cut
            return j == b.first_bad, (j + 1) * night_s
    return builds - 1 == b.first_bad, builds * night_s


def binary(b: Builds, *, builds: int, segment_s: float) -> tuple[bool, float]:
    streams = b.streams()
    lo, hi, spent = 0, builds - 1, 0.0  # the first bad build lies in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        s = b.segment(streams, mid, segment_s)
        spent += s.exposure_s
        lo, hi = (lo, mid) if s.hangs else (mid + 1, hi)
    return lo == b.first_bad, spent


def _p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replays", type=int, default=500)
    parser.add_argument("--seed", type=int, default=36)
    parser.add_argument("--builds", type=int, default=8)
    parser.add_argument("--good-min", type=float, default=200.0)
    parser.add_argument("--bad-min", type=float, default=20.0)
    parser.add_argument("--segment-min", type=float, default=30.0)
    parser.add_argument("--budget-h", type=float, default=72.0)
    parser.add_argument("--threshold", type=float, default=0.95)
    parser.add_argument("--night-h", type=float, default=8.0)
    parser.add_argument("--mtbf-max-h", type=float, default=None, help="the model's top MTBF (default its own)")
    parser.add_argument("--min-ratio", type=float, default=None, help="the model's bad/good rate ratio floor")
    parser.add_argument("--max-ratio", type=float, default=None)
    parser.add_argument("--grid", type=int, default=None)
    parser.add_argument("--bad-range-min", type=float, nargs=2, default=None,
                        help="the model's stated range for the bad MTBF, in minutes")
    parser.add_argument("--good-range-min", type=float, nargs=2, default=None)
    parser.add_argument("--linear-cut-min", type=float, default=60.0)
    parser.add_argument("--binary-min", type=float, nargs="+", default=[60.0, 480.0])
    args = parser.parse_args()
    picker = random.Random(f"{args.seed}/first-bad")
    rows: dict[str, tuple[list[bool], list[float]]] = {}
    segment_counts, out_of_budget = [], 0
    options = {k: v for k, v in (("mtbf_max_s", None if args.mtbf_max_h is None else args.mtbf_max_h * 3600),
                                 ("min_ratio", args.min_ratio), ("max_ratio", args.max_ratio), ("grid", args.grid),
                                 ("bad_mtbf_s", args.bad_range_min and [x * MIN for x in args.bad_range_min]),
                                 ("good_mtbf_s", args.good_range_min and [x * MIN for x in args.good_range_min]))
               if v is not None}
    for r in range(args.replays):
        first_bad = picker.randrange(args.builds)
        b = Builds(count=args.builds, first_bad=first_bad, good_s=args.good_min * MIN, bad_s=args.bad_min * MIN,
                   seed=f"{args.seed}/{r}")
        ok, spent, n, over = bayes(b, builds=args.builds, segment_s=args.segment_min * MIN,
                                   budget_s=args.budget_h * 3600, threshold=args.threshold, **options)
        name = f"bayes ({args.segment_min:g}-min segments, stop at {args.threshold:g})"
        rows.setdefault(name, ([], []))
        rows[name][0].append(ok)
        rows[name][1].append(spent)
        segment_counts.append(n)
        out_of_budget += over
        ok, spent = linear(b, builds=args.builds, night_s=args.night_h * 3600, cut_s=args.linear_cut_min * MIN)
        name = f"linear scan, one {args.night_h:g}-h night per build"
        rows.setdefault(name, ([], []))
        rows[name][0].append(ok)
        rows[name][1].append(spent)
        for minutes in args.binary_min:
            ok, spent = binary(b, builds=args.builds, segment_s=minutes * MIN)
            name = f"binary search, one {minutes:g}-min segment per step"
            rows.setdefault(name, ([], []))
            rows[name][0].append(ok)
            rows[name][1].append(spent)
    print(f"{args.replays} replays, {args.builds} builds, first bad uniform; good MTBF {args.good_min:g} min, "
          f"bad {args.bad_min:g} min; seed {args.seed}")
    header = f"{'strategy':52} {'correct':>8} {'median soak h':>14} {'p90 soak h':>11}"
    print(header)
    print("-" * len(header))
    for name, (oks, spent) in rows.items():
        print(f"{name:52} {sum(oks) / len(oks):8.3f} {statistics.median(spent) / 3600:14.1f} "
              f"{_p90(spent) / 3600:11.1f}")
    print(f"bayes: {out_of_budget} of {args.replays} out of budget ({args.budget_h:g} h); "
          f"segments per bisect: mean {statistics.mean(segment_counts):.1f}, max {max(segment_counts)}")
    bayes_ok = next(iter(rows.values()))[0]
    return 0 if sum(bayes_ok) / len(bayes_ok) >= 0.95 else 1


if __name__ == "__main__":
    raise SystemExit(main())
