"""History across nights: per-run records and per-build statistics, pure.

Counting (docs/nightly.md, "Honest counting"): a night's exposure is its time at
risk, ``soak.exposure`` (one definition, shared with report.html's MTBF).
Per build, hangs are a Poisson process in pooled exposure: MTBF with the exact
chi-square interval (soak.report.stats), a verdict against a baseline build's
MTBF, the exact Poisson rate-ratio test between builds, and the throughput and
latency cost with intervals (the same methods as ``soak compare``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from scipy import stats as sps

from soak.printable import printable
from soak.redact import clip
from soak.durations import format_duration
from soak.exposure import Interval, at_risk, intervals_of  # noqa: F401 (the night's time at risk as its judge counted it)
from soak.report.stats import MtbfEstimate, mtbf_estimate, quantile_estimate, required_clean_exposure
from soak.summary_file import BuildEntry, IncidentEntry, RunSummary
from soak.thresholds.metrics import RUN_METRICS, run_value

# The per-run figures history shows: names from the one metric table.
RUN_FIGURES = ("output_tokens_per_s", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "prefix_hit_ratio", "error_rate")


@dataclass(frozen=True)
class RunRecord:
    path: str
    run_id: str | None
    name: str | None
    started_at: float | None
    build: str
    vllm_version: str | None
    launch_digest: str | None
    label: str | None
    verdict: str
    cut_off: bool
    intervals: tuple[Interval, ...]
    incidents: tuple[IncidentEntry, ...]
    figures: Mapping[str, float | None]
    thresholds_passed: bool | None
    restarts: int
    thresholds_breached: tuple[str, ...] = ()
    report: str | None = None  # the run's report.html, where one existed when the history was read
    # What ran (soak.history.build.identity_of the recorded build): nights pool only where it is
    # equal; ``build`` is its history key (soak.history.build.group_keys), ``facts`` what it is.
    identity: str = ""
    facts: Mapping[str, str] = field(default_factory=dict)
    launch_recorded: bool = True  # False: a night from before soak read what it launched
    # Why this night's hang-free time proves no fix (it failed otherwise: summary.json's
    # at_risk.withheld, the judge's); a build with such a night is never called fixed.
    withheld: str | None = None

    @property
    def identity_key(self) -> str:
        """The key this night's build has where its label names several: ``label@identity``."""
        return f"{self.label}@{self.identity}" if self.label else self.build

    @property
    def exposure_s(self) -> float:
        return sum(i.length_s for i in self.intervals)

    @property
    def clean(self) -> bool:
        """A night a person reads as fine: it passed, with no incident and every threshold held.
        A night without a hang that breached a threshold (exit 99) is hang-free, not clean."""
        return (self.verdict == "pass" and not self.cut_off and not self.incidents and self.hangs == 0
                and self.thresholds_passed is not False and not self.thresholds_breached and self.exposure_s > 0)

    @property
    def incident_kinds(self) -> tuple[tuple[str, int], ...]:
        """The night's incidents counted by kind, in the order they first came: (("corruption", 1), ("hang", 1))."""
        counts: dict[str, int] = {}
        for i in self.incidents:
            counts[i.kind or "incident"] = counts.get(i.kind or "incident", 0) + 1
        return tuple(counts.items())

    @property
    def corrupt(self) -> bool:
        """A corruption was recorded: the answers were wrong, a failure night whatever else it shows
        (it is never clean, and a hang-free corrupt night is no evidence of a fix)."""
        return any(i.kind == "corruption" for i in self.incidents)

    @property
    def hangs(self) -> int:
        return sum(1 for i in self.intervals if i.hang)

    @property
    def times_to_hang_s(self) -> tuple[float, ...]:
        return tuple(i.length_s for i in self.intervals if i.hang)


def run_record(*, path: str, summary: RunSummary, events: Sequence[Mapping[str, Any]],
               config: Mapping[str, Any], report: str | None = None,
               records: Iterable[Mapping[str, Any]] | None = None) -> RunRecord:
    """The night's time at risk is its judge's (summary.json's ``at_risk``); a summary
    written before it is counted here, ``records`` (requests.jsonl) giving the
    evidence of work: a night whose server did no work has no time at risk."""
    from soak.history.build import build_identity, build_key, identity_fields, identity_of

    recorded: Mapping[str, Any] | None = summary.build
    launch_recorded = isinstance(recorded, Mapping) and isinstance(recorded.get("launch"), Mapping)
    if recorded is None:  # a run recorded before the build event existed
        recorded = build_identity(config, vllm_version=None, served_model=summary.model)
    build = BuildEntry.from_json(recorded)
    label = build.label or config.get("build")
    # A label is a name: a number in a hand-edited config.yaml reads as its text, anything else as none.
    label = str(label) if isinstance(label, (str, int, float)) and not isinstance(label, bool) and label != "" else None
    key = build_key(label, build.vllm_version, build.launch_digest)
    return RunRecord(
        path=path, run_id=summary.run_id, name=config.get("name"),
        started_at=summary.started_at, build=key, vllm_version=build.vllm_version,
        launch_digest=build.launch_digest, label=label, verdict=summary.verdict.value if summary.verdict is not None else "None",
        cut_off=bool(summary.cut_off), intervals=at_risk(events, summary, records).intervals,
        incidents=summary.incidents,
        figures={name: run_value(name, summary) for name in RUN_FIGURES},
        thresholds_passed=summary.thresholds.passed if summary.thresholds is not None else None,
        restarts=summary.restarts or 0,
        thresholds_breached=summary.thresholds.breached if summary.thresholds is not None else (),
        report=report, identity=identity_of(recorded), facts=identity_fields(recorded),
        launch_recorded=launch_recorded, withheld=_withheld(summary),
    )


def _withheld(summary: RunSummary) -> str | None:
    entry = summary.raw.get("at_risk") if isinstance(summary.raw, Mapping) else None
    why = entry.get("withheld") if isinstance(entry, Mapping) else None
    return printable(clip(why, 300)) if isinstance(why, str) and why else None


# -- per build ---------------------------------------------------------------

@dataclass(frozen=True)
class BuildStats:
    build: str
    runs: int
    clean_runs: int  # passed, no incident, thresholds held (RunRecord.clean)
    exposure_s: float
    hangs: int
    mtbf: MtbfEstimate | None
    vllm_versions: tuple[str, ...]
    digests: tuple[str, ...]
    verdict: str = ""  # the build's one sentence (soak.history.verdict.judged)
    fixed: bool | None = None
    standing: str = ""  # that sentence's standing: fixed, not fixed, not yet shown, baseline, "" (none)
    hang_free_runs: int = 0  # what the MTBF verdict counts: a breached threshold is no hang
    label: str | None = None  # the config's build: label, as given (one label may name several builds)
    identity: str = ""  # what ran (soak.history.build.identity_of): one per build
    facts: Mapping[str, str] = field(default_factory=dict)  # soak.history.build.identity_fields


@dataclass(frozen=True)
class Cost:
    """B against A on one figure: the change with its interval."""
    metric: str
    label: str
    a: float | None
    b: float | None
    delta: float | None
    delta_lower: float | None
    delta_upper: float | None
    relative: float | None  # delta / a
    p_value: float | None
    n_a: int
    n_b: int
    method: str
    verdict: str


@dataclass(frozen=True)
class RateTest:
    a: str
    b: str
    hangs_a: int
    exposure_a_s: float
    hangs_b: int
    exposure_b_s: float
    rate_ratio: float | None  # b / a
    ratio_lower: float | None
    ratio_upper: float | None
    p_two_sided: float
    p_b_lower: float  # one-sided: B's hang rate is lower than A's
    statement: str


@dataclass(frozen=True)
class History:
    confidence: float
    runs: tuple[RunRecord, ...]
    builds: tuple[BuildStats, ...]
    baseline: str | None
    baseline_mtbf_s: float | None
    rate_tests: tuple[RateTest, ...]
    costs: Mapping[str, tuple[Cost, ...]] = field(default_factory=dict)  # build -> its costs against the baseline
    best: Mapping[str, Any] | None = None
    proofs: tuple[Any, ...] = ()  # soak history --prove: soak.history.prove.BuildProof, one per build tested
    baseline_mtbf_given: bool = False  # --baseline-mtbf: a stated figure, not the baseline build's estimate
    # labels that name several builds, and what differs between them (soak.history.build.LabelSplit)
    splits: tuple[Any, ...] = ()


def build_stats(build: str, runs: Sequence[RunRecord], *, confidence: float) -> BuildStats:
    exposure = sum(r.exposure_s for r in runs)
    hangs = sum(r.hangs for r in runs)
    return BuildStats(
        build=build, runs=len(runs), clean_runs=sum(1 for r in runs if r.clean),
        hang_free_runs=sum(1 for r in runs if r.hangs == 0 and r.exposure_s > 0),
        exposure_s=exposure, hangs=hangs,
        mtbf=mtbf_estimate(hangs, exposure, confidence=confidence) if exposure > 0 else None,
        vllm_versions=tuple(sorted({r.vllm_version for r in runs if r.vllm_version})),
        digests=tuple(sorted({r.launch_digest for r in runs if r.launch_digest})),
        # what ran: the first night that recorded its launch says it (older nights pooled in, if any, did not)
        **_what_ran(runs),
    )


def _what_ran(runs: Sequence[RunRecord]) -> dict[str, Any]:
    first = next((r for r in runs if r.launch_recorded), runs[0]) if runs else None
    return {"label": first.label, "identity": first.identity, "facts": first.facts} if first is not None else {}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def nights_said(b: BuildStats) -> str:
    """"5 nights without a hang", "3 nights, 2 hangs": the evidence a verdict names."""
    if b.hangs:
        return f"{_plural(b.runs, 'night')}, {_plural(b.hangs, 'hang')}"
    return f"{_plural(b.hang_free_runs, 'night')} without a hang"


def mtbf_to_beat(baseline_mtbf_s: float, baseline: str) -> str:
    """"the unfixed MTBF of 15 min"."""
    return f"the {baseline} MTBF of {format_duration(baseline_mtbf_s, approx=True)}"


def mtbf_clean_needed(b: BuildStats, baseline_mtbf_s: float, *, confidence: float) -> float:
    """More clean exposure after which the build's one-sided MTBF bound beats ``baseline_mtbf_s``."""
    needed = required_clean_exposure(baseline_mtbf_s, confidence=confidence, allowed_failures=b.hangs)
    return max(0.0, needed - b.exposure_s)


def fixed_verdict(b: BuildStats, baseline_mtbf_s: float, baseline: str, *, confidence: float) -> tuple[str, bool | None]:
    """The one-sided MTBF bound against ``baseline_mtbf_s``: "fixed at 95%: 5 nights without
    a hang, 330 min pooled, beat the unfixed MTBF of 15 min". A build's one sentence, which
    weighs this with the other tests, is soak.history.verdict's."""
    pct = f"{confidence * 100:g}%"
    base = mtbf_to_beat(baseline_mtbf_s, baseline)
    if b.mtbf is None:
        return f"no exposure yet to judge against {base}", None
    nights = nights_said(b)
    pooled = format_duration(b.exposure_s, approx=True)
    if b.mtbf.one_sided_lower_s > baseline_mtbf_s:
        return (f"fixed at {pct}: {nights}, {pooled} pooled, MTBF above "
                f"{format_duration(b.mtbf.one_sided_lower_s, approx=True)}, beat {base}"), True
    if b.hangs and b.mtbf.upper_s < baseline_mtbf_s:
        return f"not fixed: {nights} in {pooled}, MTBF below {base} at {pct}", False
    needed = mtbf_clean_needed(b, baseline_mtbf_s, confidence=confidence)
    return (f"not yet shown at {pct}: {nights}, {pooled} pooled, MTBF above "
            f"{format_duration(b.mtbf.one_sided_lower_s, approx=True)}; {format_duration(needed, approx=True)} more clean load "
            f"would beat {base}"), None


def rate_test(a: BuildStats, b: BuildStats, *, confidence: float) -> RateTest:
    """Exact Poisson rate-ratio test: given n = n_a + n_b hangs, B's count is
    binomial(n, T_b / (T_a + T_b)) when both builds hang at the same rate."""
    total = a.hangs + b.hangs
    p0 = b.exposure_s / (a.exposure_s + b.exposure_s) if a.exposure_s + b.exposure_s > 0 else 0.5
    rr = lo = hi = None
    if total == 0:
        p_two = p_less = 1.0
    else:
        test = sps.binomtest(b.hangs, total, p0)
        p_two = float(test.pvalue)
        p_less = float(sps.binomtest(b.hangs, total, p0, alternative="less").pvalue)
        ci = test.proportion_ci(confidence_level=confidence, method="exact")
        odds = a.exposure_s / b.exposure_s if b.exposure_s > 0 else math.inf

        def ratio(p: float) -> float:
            return math.inf if p >= 1 else p / (1 - p) * odds

        lo, hi = ratio(ci.low), ratio(ci.high)
        rate_a = a.hangs / a.exposure_s if a.exposure_s > 0 else math.inf
        rr = math.inf if a.hangs == 0 else (b.hangs / b.exposure_s) / rate_a
    conf = 1.0 - p_less
    rate = lambda s: s.hangs / s.exposure_s * 3600.0 if s.exposure_s > 0 else math.inf  # noqa: E731
    statement = (f"{b.build} vs {a.build}: {_plural(b.hangs, 'hang')} in {format_duration(b.exposure_s, approx=True)} "
                 f"({rate(b):.2f}/h) against {_plural(a.hangs, 'hang')} in {format_duration(a.exposure_s, approx=True)} "
                 f"({rate(a):.2f}/h); exact Poisson rate-ratio test: {b.build} hangs less often "
                 f"with {conf * 100:.1f}% confidence (one-sided p = {p_less:.3g}; two-sided p = {p_two:.3g})")
    return RateTest(a.build, b.build, a.hangs, a.exposure_s, b.hangs, b.exposure_s, rr, lo, hi, p_two, p_less, statement)


# -- costs -------------------------------------------------------------------

def _clean(values: Sequence[float]) -> np.ndarray:
    return np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)


def mean_cost(metric: str, a: Sequence[float], b: Sequence[float], *, confidence: float, label: str | None = None,
              higher_is_better: bool = True) -> Cost:
    """Welch's t interval for the difference of means (B - A)."""
    xa, xb = _clean(a), _clean(b)
    label = label or RUN_METRICS[metric].label
    if xa.size < 2 or xb.size < 2:
        ma = float(xa.mean()) if xa.size else None
        mb = float(xb.mean()) if xb.size else None
        delta = mb - ma if ma is not None and mb is not None else None
        return Cost(metric, label, ma, mb, delta, None, None, delta / ma if delta is not None and ma else None,
                    None, int(xa.size), int(xb.size), "Welch t-test (too few windows for an interval)",
                    "not enough data")
    ma, mb = float(xa.mean()), float(xb.mean())
    if xa.std() == 0 and xb.std() == 0:
        lo = hi = mb - ma
        p = 1.0 if ma == mb else 0.0
    else:
        res = sps.ttest_ind(xb, xa, equal_var=False)
        p = float(res.pvalue)
        ci = res.confidence_interval(confidence_level=confidence)
        lo, hi = float(ci.low), float(ci.high)
    return _cost(metric, label, ma, mb, lo, hi, p, xa.size, xb.size, "Welch t-test on per-window means",
                 higher_is_better, confidence)


def quantile_cost(metric: str, q: float, a: Sequence[float], b: Sequence[float], *, confidence: float,
                  resamples: int = 400, seed: int = 0) -> Cost:
    """Percentile bootstrap of the difference of a quantile (B - A), as ``soak compare``."""
    ea, da = quantile_estimate(a, q, confidence=confidence, resamples=resamples, seed=seed)
    eb, db = quantile_estimate(b, q, confidence=confidence, resamples=resamples, seed=seed + 1)
    label = RUN_METRICS[metric].label
    if ea.n < 2 or eb.n < 2:
        delta = None if ea.value is None or eb.value is None else eb.value - ea.value
        return Cost(metric, label, ea.value, eb.value, delta, None, None, None, None, ea.n, eb.n,
                    "bootstrap (too few requests)", "not enough data")
    diff = db - da
    lo, hi = (float(x) for x in np.quantile(diff, [0.5 - confidence / 2, 0.5 + confidence / 2]))
    p = float(min(1.0, 2.0 * min((diff <= 0).mean(), (diff >= 0).mean())))
    return _cost(metric, label, ea.value, eb.value, lo, hi, p, ea.n, eb.n,
                 f"bootstrap of p{q * 100:g} ({resamples} resamples)", False, confidence)


def _cost(metric, label, ma, mb, lo, hi, p, na, nb, method, higher_is_better, confidence) -> Cost:
    delta = mb - ma
    if p >= 1 - confidence or delta == 0:
        verdict = "no significant difference"
    else:
        verdict = "better" if (delta > 0) == higher_is_better else "worse"
    return Cost(metric, label, ma, mb, delta, lo, hi, delta / ma if ma else None, p, int(na), int(nb), method, verdict)
