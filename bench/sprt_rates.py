"""Observed risks of the sequential test (soak/prove/sprt.py) over replayed tests.

    .venv/bin/python bench/sprt_rates.py [--replays 1000] [--seed 36]

For each plan, ``--replays`` sequential tests run through the pure core on
seeded exponential times between hangs: once with the true MTBF at the target
θ0 (a fixed build: every reject is a producer's-risk error, observed α), once
at the broken θ1 (a broken build: every accept is a consumer's-risk error,
observed β). A test grows hang by hang, and ``walk`` is asked at every step
whether it has decided, as a live run would ask it.

Wald's bounds promise true risks of at most α / (1 - β) and β / (1 - α)
(``bound``). Here the conservatism is one-sided: a test rejects at a hang, a
jump that overshoots the reject line (evidence the bound does not count), so
observed α lies well below α; it accepts during clean time, exactly on the
accept line, so observed β sits at β, within the bound. ``ok`` says the stated
risk lies at or above the low end of the observed rate's 95% Wilson interval
(the observed rate is not significantly above it). The median exposure to a decision is printed
against Wald's approximate mean (the average sample number, in minutes).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from soak.prove.sprt import Plan, ProofState, plan, walk  # noqa: E402

MIN = 60.0


def one_test(p: Plan, mtbf_s: float, rng: random.Random) -> tuple[ProofState, float]:
    """Hangs at exponential gaps of mean ``mtbf_s`` until the test decides."""
    marks: list[float] = []
    t = 0.0
    while True:
        t_next = t + rng.expovariate(1 / mtbf_s)
        # clean time up to the next hang: may accept (or reach the truncation) on the way
        d = walk(p, hang_exposures_s=marks, exposure_s=t_next)
        if d.state is not ProofState.UNDECIDED:
            return d.state, d.exposure_s
        marks.append(t_next)
        d = walk(p, hang_exposures_s=marks, exposure_s=t_next)
        if d.state is not ProofState.UNDECIDED:
            return d.state, d.exposure_s
        t = t_next


def wald_asn_s(p: Plan, mtbf_s: float) -> float:
    """Wald's approximate mean exposure to a decision (overshoot ignored): the
    mean log-ratio per second is ln d / θ - (1/θ1 - 1/θ0), and the walk ends at
    ln B with the probability of accepting (1 - α at θ0, β at θ1)."""
    ln_a, ln_b = math.log((1 - p.beta) / p.alpha), math.log(p.beta / (1 - p.alpha))
    drift = math.log(p.ratio) / mtbf_s - (1 / p.broken_mtbf_s - 1 / p.target_mtbf_s)
    accept = 1 - p.alpha if mtbf_s == p.target_mtbf_s else p.beta
    return (accept * ln_b + (1 - accept) * ln_a) / drift


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    f = k / n
    mid = (f + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(f * (1 - f) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half), min(1.0, mid + half)


PLANS = [
    ("issue: θ1 20 min, θ0 200 min, α=β=5%", plan(broken_mtbf_s=20 * MIN, target_mtbf_s=200 * MIN)),
    ("III-D: d=2, α=β=10% (θ1 60 min)", plan(broken_mtbf_s=60 * MIN, ratio=2.0, alpha=0.10, beta=0.10)),
    ("IV-D: d=2, α=β=20% (θ1 60 min)", plan(broken_mtbf_s=60 * MIN, ratio=2.0, alpha=0.20, beta=0.20)),
    ("I-D: d=1.5, α=β=10% (θ1 60 min)", plan(broken_mtbf_s=60 * MIN, ratio=1.5, alpha=0.10, beta=0.10)),
    ("issue, truncated at 6 h or 6 hangs", plan(broken_mtbf_s=20 * MIN, target_mtbf_s=200 * MIN,
                                                max_exposure_s=360 * MIN, max_hangs=6)),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replays", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=36)
    args = parser.parse_args()
    print(f"{args.replays} replayed tests per plan and truth, seed {args.seed}")
    header = (f"{'plan':40} {'truth':6} {'risk':5} {'stated':>6} {'observed':>8} {'95% interval':>15} "
              f"{'ok':3} {'bound':>6} {'truncated':>9} {'median min':>10} {'Wald ASN min':>12}")
    print(header)
    print("-" * len(header))
    all_ok = True
    for index, (name, p) in enumerate(PLANS):
        for truth, mtbf, wrong, stated in (("θ0", p.target_mtbf_s, ProofState.REJECTED, p.alpha),
                                           ("θ1", p.broken_mtbf_s, ProofState.ACCEPTED, p.beta)):
            rng = random.Random(f"{args.seed}/{index}/{truth}")  # one stream per cell: cells replay alone
            results = [one_test(p, mtbf, rng) for _ in range(args.replays)]
            errors = sum(1 for state, _ in results if state is wrong)
            truncated = sum(1 for state, _ in results if state is ProofState.TRUNCATED)
            lo, hi = wilson(errors, args.replays)
            ok = lo <= stated
            bound = p.alpha / (1 - p.beta) if truth == "θ0" else p.beta / (1 - p.alpha)
            all_ok &= ok
            median = statistics.median(t for _, t in results) / MIN
            asn = wald_asn_s(p, mtbf) / MIN
            print(f"{name:40} {truth:6} {'α' if truth == 'θ0' else 'β':5} {stated:6.3f} "
                  f"{errors / args.replays:8.3f} {f'[{lo:.3f}, {hi:.3f}]':>15} {'yes' if ok else 'NO':3} "
                  f"{bound:6.3f} {truncated / args.replays:9.3f} {median:10.1f} {asn:12.1f}")
    print("every observed risk within its stated one" if all_ok else "SOME OBSERVED RISK ABOVE ITS STATED ONE")
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
