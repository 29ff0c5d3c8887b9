"""One sentence per build: what ``soak history`` says of a build, wherever it is read.

A build's nights are evidence for up to three tests: Wald's sequential test
(``--prove``: "is it fixed?" asked with its risks α and β; soak.history.prove),
the one-sided MTBF bound against the baseline's MTBF (``fixed_verdict``), and the
exact Poisson rate-ratio test against the baseline build (``rate_test``). Each
reader used to speak for one of them, so the same nights read "no build is shown
better than unfixed at 95%" in history.html's lead, "fixed at 95%" in its builds
table and the terminal, "fixed (α 5%, β 5%)" under ``--prove``, and Grafana showed
the MTBF test's "fixed". ``build_verdict`` turns a build's evidence into one
standing and one sentence; ``judged`` writes them into the History (each build's
``standing``, ``verdict`` and ``fixed``, and the lead, ``best``), which the
terminal, history.html, history.json, the Pushgateway push, and Grafana through
it, all show.

Which test speaks for a build, the first that applies:

1. the sequential test, where ``--prove`` tested the build: the question asked,
   with its stated risks; its sentence as the test words it;
2. against a baseline build (what to beat: its nights' MTBF estimate): fixed only
   when the one-sided MTBF bound beats that MTBF *and* the rate-ratio test shows
   the build hangs less often at the confidence. The baseline's MTBF is itself an
   estimate: beating its point value is not yet shown, and the rate test carries
   both builds' uncertainty;
3. against a stated ``--baseline-mtbf`` (a figure, not an estimate): the MTBF bound;
4. no baseline MTBF and no proof: no verdict ("").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from scipy import stats as sps

from soak.durations import format_duration
from soak.history.model import (
    BuildStats, History, RateTest, fixed_verdict, mtbf_clean_needed, mtbf_to_beat, nights_said,
)
from soak.prove.sprt import Decision, ProofState
from soak.standing import FIXED_VALUES, Standing, pushed_fixed


_PROOF_STANDINGS = {ProofState.ACCEPTED: Standing.FIXED, ProofState.REJECTED: Standing.NOT_FIXED,
                    ProofState.UNDECIDED: Standing.OPEN, ProofState.TRUNCATED: Standing.OPEN}
RATE_TEST = "exact Poisson rate-ratio test, one-sided"


@dataclass(frozen=True)
class BuildVerdict:
    standing: Standing
    sentence: str

    @property
    def fixed(self) -> bool | None:
        return {Standing.FIXED: True, Standing.NOT_FIXED: False}.get(self.standing)


def rate_clean_needed(t: RateTest, *, confidence: float) -> float | None:
    """More clean exposure of B (its hangs as they are) after which the rate-ratio test shows
    B hangs less often than A at ``confidence``; None where no amount would (A never hung)."""
    n, goal = t.hangs_a + t.hangs_b, 1.0 - confidence

    def p_lower(extra: float) -> float:  # the test's one-sided p, as rate_test computes it
        total = t.exposure_a_s + t.exposure_b_s + extra
        return float(sps.binom.cdf(t.hangs_b, n, (t.exposure_b_s + extra) / total)) if total > 0 else 1.0

    if p_lower(0.0) <= goal:
        return 0.0
    if t.hangs_a == 0:
        return None  # every hang is B's whatever its exposure: p stays 1
    hi = max(t.exposure_a_s, t.exposure_b_s, 1.0)
    for _ in range(200):  # p falls towards 0 as B's clean time grows: bracket, then halve
        if p_lower(hi) <= goal:
            break
        hi *= 2.0
    else:
        return None
    lo = 0.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        lo, hi = (lo, mid) if p_lower(mid) <= goal else (mid, hi)
    return hi


def _rate_said(t: RateTest, baseline: str) -> str:
    return f"it hangs less often than {baseline} with {(1.0 - t.p_b_lower) * 100:.1f}% confidence"


def _against_build(b: BuildStats, *, baseline: str, baseline_mtbf_s: float, confidence: float,
                   rate: RateTest) -> BuildVerdict:
    """Route 2: the MTBF bound against the baseline build's MTBF estimate, and the rate test."""
    text, fixed = fixed_verdict(b, baseline_mtbf_s, baseline, confidence=confidence)
    shown = 1.0 - rate.p_b_lower >= confidence
    if fixed is False or b.mtbf is None:
        return BuildVerdict(Standing.NOT_FIXED if fixed is False else Standing.OPEN, text)
    if fixed and shown:
        return BuildVerdict(Standing.FIXED, f"{text}; {_rate_said(rate, baseline)} ({RATE_TEST})")
    pct = f"{confidence * 100:g}%"
    rate_need = rate_clean_needed(rate, confidence=confidence)
    if fixed:  # the bound beats the estimate, the rate test does not yet: not shown
        more = "; no clean load alone can show it" if rate_need is None else \
            f"; {format_duration(rate_need, approx=True)} more clean load would show it"
        return BuildVerdict(Standing.OPEN, (
            f"not yet shown at {pct}: {nights_said(b)}, {format_duration(b.exposure_s, approx=True)} pooled, "
            f"MTBF above {format_duration(b.mtbf.one_sided_lower_s, approx=True)}, above "
            f"{mtbf_to_beat(baseline_mtbf_s, baseline)}, but {_rate_said(rate, baseline)} only ({RATE_TEST}){more}"))
    # neither yet: the MTBF bound's need is said; the rate test's too where it is the longer
    if rate_need is not None and rate_need > mtbf_clean_needed(b, baseline_mtbf_s, confidence=confidence):
        text += f", {format_duration(rate_need, approx=True)} to show it hangs less often than {baseline} at {pct}"
    return BuildVerdict(Standing.OPEN, text)


def build_verdict(b: BuildStats, *, confidence: float, baseline: str | None, baseline_mtbf_s: float | None,
                  baseline_mtbf_given: bool = False, rate: RateTest | None = None,
                  proof: Decision | None = None) -> BuildVerdict:
    """The build's one standing and sentence from its evidence (the module's routes, in order)."""
    if proof is not None:
        return BuildVerdict(_PROOF_STANDINGS[proof.state], proof.sentence)
    if b.build == baseline:
        return BuildVerdict(Standing.BASELINE, "baseline")
    if baseline_mtbf_s is None:
        return BuildVerdict(Standing.NONE, "")
    if rate is not None and baseline is not None and not baseline_mtbf_given:
        return _against_build(b, baseline=baseline, baseline_mtbf_s=baseline_mtbf_s, confidence=confidence,
                              rate=rate)
    text, fixed = fixed_verdict(b, baseline_mtbf_s, baseline or "baseline", confidence=confidence)
    return BuildVerdict({True: Standing.FIXED, False: Standing.NOT_FIXED, None: Standing.OPEN}[fixed], text)


def proofs_by_build(h: History) -> dict[str, Decision]:
    """Each tested build's decision by its history key. ``--prove`` may name a build by its
    label: the nights it tested (soak.history.prove.runs_of, the same reading) say which build."""
    from soak.errors import ConfigError
    from soak.history.prove import runs_of

    out: dict[str, Decision] = {}
    for p in h.proofs:
        try:
            keys = {r.build for r in runs_of(h.runs, p.build)}
        except ConfigError:  # a label of several builds was never tested (with_proofs refuses it)
            continue
        if len(keys) == 1:
            out[keys.pop()] = p.decision
    return out


def verdicts_of(h: History) -> dict[str, BuildVerdict]:
    """Every build's one verdict, from the evidence the History holds."""
    proofs = proofs_by_build(h)
    rates = {t.b: t for t in h.rate_tests}
    out = {b.build: build_verdict(b, confidence=h.confidence, baseline=h.baseline, baseline_mtbf_s=h.baseline_mtbf_s,
                                  baseline_mtbf_given=h.baseline_mtbf_given, rate=rates.get(b.build),
                                  proof=proofs.get(b.build))
           for b in h.builds}
    # Nothing broken is called fixed, whichever test speaks: a night its judge withheld
    # (it failed otherwise: summary.json's at_risk.withheld) keeps the build from "fixed".
    for build, verdict in out.items():
        failed = next((r for r in h.runs if r.build == build and r.withheld), None)
        if verdict.standing is Standing.FIXED and failed is not None:
            out[build] = BuildVerdict(Standing.OPEN, f"not yet shown: night {failed.run_id or failed.path} failed "
                                                     f"otherwise ({failed.withheld}), so its hang-free time proves no fix")
    return out


def lead(h: History, verdicts: Mapping[str, BuildVerdict]) -> dict[str, Any] | None:
    """The page's lead (history.json's ``best``): the build closest to fixed, said in its own
    sentence, so the lead never says other than the build's line. A fixed build first, then one
    not yet shown, then one not fixed; among equals the one the rate test favours most."""
    rates = {t.b: t for t in h.rate_tests}
    order = {Standing.FIXED: 0, Standing.OPEN: 1, Standing.NOT_FIXED: 2}
    judged = [b.build for b in h.builds if verdicts[b.build].standing in order]
    if not judged:
        if h.baseline is None or h.baseline_mtbf_s is not None or len(h.builds) < 2:
            return None
        return {"build": None, "baseline": h.baseline, "standing": Standing.NONE.value, "confidence": None,
                "significant": False, "statement": f"no build is judged against {h.baseline}: it has no hang, so "
                                                   "no MTBF to beat (give --baseline-mtbf)"}
    top = min(judged, key=lambda k: (order[verdicts[k].standing], rates[k].p_b_lower if k in rates else 2.0))
    said = verdicts[top]
    statement = f"{top}: {said.sentence}"
    if said.standing is not Standing.FIXED:
        statement = f"no build is shown fixed yet; {statement}"
    conf = 1.0 - rates[top].p_b_lower if top in rates else None
    return {"build": top, "baseline": h.baseline, "standing": said.standing.value, "confidence": conf,
            "significant": conf is not None and conf >= h.confidence, "statement": statement}


def judged(h: History) -> History:
    """``h`` with each build's one verdict written in and the lead to match: call it again
    whenever the evidence changes (``soak history --prove`` adds proofs)."""
    verdicts = verdicts_of(h)
    builds = tuple(dataclasses.replace(b, verdict=verdicts[b.build].sentence, fixed=verdicts[b.build].fixed,
                                       standing=verdicts[b.build].standing.value) for b in h.builds)
    return dataclasses.replace(h, builds=builds, best=lead(h, verdicts))


__all__ = ["BuildVerdict", "FIXED_VALUES", "Standing", "build_verdict", "judged", "lead", "proofs_by_build",
           "pushed_fixed", "rate_clean_needed", "verdicts_of"]
