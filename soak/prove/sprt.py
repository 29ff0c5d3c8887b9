"""Wald's sequential probability ratio test for exponential times between hangs,
in the form of MIL-HDBK-781A section 5.9 (Epstein and Sobel 1955).

The question is "is this build fixed?": H0, the target MTBF θ0 (fixed), against
H1, the broken MTBF θ1 < θ0 (still broken); d = θ0 / θ1 is the discrimination
ratio. After exposure t (loaded time at risk, the one definition of
``soak.exposure``) with r hangs, the log of the likelihood ratio L1/L0 is

    λ(t, r) = r ln d - (1/θ1 - 1/θ0) t.

Wald's bounds are A = (1 - β) / α (reject H0) and B = β / (1 - α) (accept H0).
Written, as MIL-HDBK-781A writes them, as lines in the (t, r) plane:

    accept "fixed"   when r <= a + b t    a = ln B / ln d (negative)
    reject (broken)  when r >= c + b t    c = ln A / ln d
    b = (1/θ1 - 1/θ0) / ln d              (hangs per second of exposure)

so with r hangs the accept time is (r - a) / b and r hangs reject only if they
land by (r - c) / b. Between hangs r is constant and the lines rise, so a test
can accept only during clean time and reject only at a hang.

With θ1 = 20 min, θ0 = 200 min, α = β = 0.05 (the issue's figures): accept after
ln 19 / 0.045 = 65.4 clean minutes; 2 hangs within 36.9 minutes reject; with
one hang the accept time is 116.6 minutes.

α is the producer's risk (a fixed build called broken), β the consumer's
(a broken build called fixed). Wald's bounds make the true risks at most about
α / (1 - β) and β / (1 - α). The conservatism is one-sided here: a test rejects
at a hang, a jump of ln d that overshoots the reject line, so the true α lies
below α (well below for a large d); it accepts in clean time, exactly on the
accept line, so the true β is about β. bench/sprt_rates.py measures both.
The correction factor (d + 1) / 2d that MIL-HDBK-781A applies to A is not
applied: the issue's published figures are plain Wald.

A truncation (a maximum exposure, a maximum hang count) makes every test end;
a test that reaches it undecided is ``truncated``, its own outcome (the issue:
neither a pass nor a fail), not MIL-HDBK-781A's forced accept or reject.
``truncation`` gives the handbook's choice of the two (Epstein 1954), the
fixed-length test with the same risks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, Sequence


class ProofState(str, Enum):
    UNDECIDED = "undecided"  # between the lines: keep soaking
    ACCEPTED = "accepted"  # the accept line crossed: fixed (MTBF at least θ0, risk β)
    REJECTED = "rejected"  # the reject line crossed: still broken (risk α)
    TRUNCATED = "truncated"  # the truncation reached between the lines: no answer


@dataclass(frozen=True)
class Plan:
    """One sequential test. Times in seconds; ``ratio`` is d = θ0 / θ1."""

    broken_mtbf_s: float  # θ1
    target_mtbf_s: float  # θ0
    alpha: float
    beta: float
    max_exposure_s: float | None = None
    max_hangs: int | None = None

    @property
    def ratio(self) -> float:
        return self.target_mtbf_s / self.broken_mtbf_s

    @property
    def slope(self) -> float:
        """b: hangs per second of exposure, the slope of both lines."""
        return (1 / self.broken_mtbf_s - 1 / self.target_mtbf_s) / math.log(self.ratio)

    @property
    def accept_intercept(self) -> float:
        """a = ln(β / (1 - α)) / ln d, in hangs (negative)."""
        return math.log(self.beta / (1 - self.alpha)) / math.log(self.ratio)

    @property
    def reject_intercept(self) -> float:
        """c = ln((1 - β) / α) / ln d, in hangs (positive)."""
        return math.log((1 - self.beta) / self.alpha) / math.log(self.ratio)

    def accept_at_s(self, hangs: int) -> float:
        """The exposure at which a test with ``hangs`` hangs, and no more, accepts."""
        return (hangs - self.accept_intercept) / self.slope

    def reject_by_s(self, hangs: int) -> float | None:
        """The exposure by which the ``hangs``-th hang must land to reject; None when
        that many hangs reject at no exposure (fewer than c)."""
        at = (hangs - self.reject_intercept) / self.slope
        return at if at >= 0 else None

    def log_ratio(self, exposure_s: float, hangs: int) -> float:
        """ln(L1 / L0): positive leans broken, negative leans fixed."""
        return hangs * math.log(self.ratio) - (1 / self.broken_mtbf_s - 1 / self.target_mtbf_s) * exposure_s

    def to_json(self) -> dict[str, Any]:
        return {"broken_mtbf_s": self.broken_mtbf_s, "target_mtbf_s": self.target_mtbf_s,
                "ratio": self.ratio, "alpha": self.alpha, "beta": self.beta,
                "max_exposure_s": self.max_exposure_s, "max_hangs": self.max_hangs}


# The plans a test can hold. A ratio near 1 needs an unbounded test (the truncation's hang
# count grows without bound as d -> 1) and a huge one overflows the lines (ln d, 1/θ1 - 1/θ0):
# neither asks a question a soak can answer. MTBFs from a millisecond to about 300 years.
MIN_RATIO, MAX_RATIO = 1.1, 1e6
MIN_MTBF_S, MAX_MTBF_S = 1e-3, 1e10
MAX_TRUNCATION_HANGS = 100_000  # truncation's r0 beyond this: the ratio is too close to 1


def _real(name: str, value: Any) -> float:
    """A finite real number, or ValueError naming it (an int of 400 digits, a bool, a string are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, not {value!r:.40}")
    try:
        out = float(value)
    except OverflowError:
        raise ValueError(f"{name} is out of range ({str(value)[:20]}...)") from None
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite, not {value!r}")
    return out


def plan(*, broken_mtbf_s: float, target_mtbf_s: float | None = None, ratio: float | None = None,
         alpha: float = 0.05, beta: float = 0.05, max_exposure_s: float | None = None,
         max_hangs: int | None = None) -> Plan:
    """A checked plan: the target MTBF given, or as ``ratio`` times the broken one.
    Raises ValueError naming the bad option (a config section turns it into a
    ConfigError with its field); a plan read back from a run directory goes through
    here too, so every Plan is within the stated bounds."""
    if (target_mtbf_s is None) == (ratio is None):
        raise ValueError("give exactly one of target_mtbf_s and ratio")
    broken = _real("broken_mtbf_s", broken_mtbf_s)
    if not MIN_MTBF_S <= broken <= MAX_MTBF_S:
        raise ValueError(f"broken_mtbf_s must be between {MIN_MTBF_S:g} and {MAX_MTBF_S:g} seconds, not {broken!r}")
    target = broken * _real("ratio", ratio) if ratio is not None else _real("target_mtbf_s", target_mtbf_s)
    if not (math.isfinite(target) and target > broken):
        raise ValueError(f"the target MTBF ({target!r} s) must be above the broken one ({broken!r} s)")
    if not MIN_RATIO <= target / broken <= MAX_RATIO or target > MAX_MTBF_S:
        raise ValueError(f"the ratio of the target MTBF to the broken one must be between {MIN_RATIO:g} and "
                         f"{MAX_RATIO:g} (and the target at most {MAX_MTBF_S:g} s), not {target / broken:.6g}")
    for name, risk in (("alpha", alpha), ("beta", beta)):
        if not 0 < _real(name, risk) < 0.5:  # at 0.5 or more the lines cross: no test
            raise ValueError(f"{name} must be between 0 and 0.5, not {risk!r}")
    if max_exposure_s is not None and not _real("max_exposure_s", max_exposure_s) > 0:
        raise ValueError(f"max_exposure_s must be positive, not {max_exposure_s!r}")
    if max_hangs is not None and (isinstance(max_hangs, bool) or not isinstance(max_hangs, int)):
        raise ValueError(f"max_hangs must be a whole number of hangs, not {max_hangs!r:.40}")
    if max_hangs is not None and max_hangs < 1:
        raise ValueError(f"max_hangs must be at least 1, not {max_hangs!r}")
    return Plan(broken_mtbf_s=broken, target_mtbf_s=float(target), alpha=float(alpha), beta=float(beta),
                max_exposure_s=None if max_exposure_s is None else float(max_exposure_s), max_hangs=max_hangs)


def truncation(*, broken_mtbf_s: float, target_mtbf_s: float, alpha: float, beta: float) -> tuple[float, int]:
    """(max exposure, max hangs): MIL-HDBK-781A's truncation after Epstein (1954),
    the fixed-length test of the same risks. r0 is the smallest r with
    χ²(α; 2r) / χ²(1 - β; 2r) >= θ1 / θ0 (lower quantiles), and the exposure
    θ0 χ²(α; 2r0) / 2. For the issue's plan: r0 = 3, 200 min x 1.635383 / 2 =
    163.5 min."""
    from scipy.stats import chi2  # heavy: only a caller that truncates pays for it

    if not 0 < broken_mtbf_s < target_mtbf_s:
        raise ValueError("the target MTBF must be above the broken one")

    def enough(r: int) -> bool:  # monotone in r: the ratio of the quantiles tends to 1 as r grows
        return chi2.ppf(alpha, 2 * r) / chi2.ppf(1 - beta, 2 * r) >= broken_mtbf_s / target_mtbf_s

    # the smallest r: doubling, then halving (a few dozen quantiles, not one per r: 4547 at ratio 1.05)
    high = 1
    while not enough(high):
        if high >= MAX_TRUNCATION_HANGS:
            raise ValueError(f"no truncation within {MAX_TRUNCATION_HANGS} hangs: the ratio "
                             f"{target_mtbf_s / broken_mtbf_s:.4g} is too close to 1")
        high *= 2
    low = high // 2  # not enough (or 0)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return float(target_mtbf_s * chi2.ppf(alpha, 2 * high) / 2), high


@dataclass(frozen=True)
class BoundaryPoint:
    hangs: int
    exposure_s: float  # accept line: the accept time; reject line: the deadline


@dataclass(frozen=True)
class Boundaries:
    """Both lines as points, for a plot of hangs over exposure: the accept line
    from 0 hangs, the reject line from the first hang count that can reject."""

    accept: tuple[BoundaryPoint, ...]
    reject: tuple[BoundaryPoint, ...]
    max_exposure_s: float | None
    max_hangs: int | None

    def to_json(self) -> dict[str, Any]:
        return {"accept": [[p.hangs, p.exposure_s] for p in self.accept],
                "reject": [[p.hangs, p.exposure_s] for p in self.reject],
                "max_exposure_s": self.max_exposure_s, "max_hangs": self.max_hangs}


def boundaries(p: Plan, *, up_to_hangs: int | None = None) -> Boundaries:
    """The lines' points for 0..``up_to_hangs`` hangs (default: the truncation's
    hang count, else enough to pass the reject intercept and two more)."""
    top = up_to_hangs if up_to_hangs is not None else math.ceil(p.reject_intercept) + 2
    if p.max_hangs is not None:
        top = min(top, p.max_hangs)
    accept = tuple(BoundaryPoint(r, p.accept_at_s(r)) for r in range(top + 1)
                   if p.max_exposure_s is None or p.accept_at_s(r) <= p.max_exposure_s)
    reject = tuple(BoundaryPoint(r, by) for r in range(1, top + 1)
                   if (by := p.reject_by_s(r)) is not None)
    return Boundaries(accept, reject, p.max_exposure_s, p.max_hangs)


@dataclass(frozen=True)
class Needed:
    """What is still needed, from where the test stands: ``clean_s`` more clean
    exposure to accept (None when the truncation comes first), or ``hangs`` more
    hangs by exposure ``by_s`` to reject (None when the truncation comes first)."""

    clean_s: float | None
    hangs: int | None
    by_s: float | None

    def to_json(self) -> dict[str, Any]:
        return {"clean_s": self.clean_s, "hangs": self.hangs, "by_s": self.by_s}


@dataclass(frozen=True)
class Decision:
    state: ProofState
    exposure_s: float  # where the test stands (for a decided test: where it decided)
    hangs: int
    log_ratio: float  # ln(L1 / L0) there
    accept_at_s: float  # the accept time for this many hangs
    needed: Needed | None  # None once decided
    reasons: tuple[str, ...]  # the first is the sentence (live view, report, junit)
    plan: Plan

    @property
    def sentence(self) -> str:
        return self.reasons[0]

    def to_json(self) -> dict[str, Any]:
        """summary.json's ``proof``: decision, exposure, hangs, both boundaries,
        what is still needed, and the sentence. The lines reach two hangs past
        where the test stands and the reject intercept (a plot shows what comes
        next), or the truncation if that comes first: a few points whatever the
        truncation (max_hangs 10^8 once drew 2e8)."""
        p = self.plan
        top = max(self.hangs, math.ceil(p.reject_intercept)) + 2
        return {"decision": self.state.value, "exposure_s": self.exposure_s, "hangs": self.hangs,
                "log_ratio": self.log_ratio, "accept_at_s": self.accept_at_s,
                "needed": None if self.needed is None else self.needed.to_json(),
                "boundaries": boundaries(p, up_to_hangs=top).to_json(),
                "plan": p.to_json(), "sentence": self.sentence, "reasons": list(self.reasons)}


def _number(seconds: float, *, exact: bool = False) -> tuple[str, str]:
    """(figure, unit) for a sentence: minutes, one decimal for a decision ("65.4
    clean minutes"), whole minutes for what is still to come ("41 more"), where a
    tenth is noise; under a minute, seconds (a plan of seconds, or the last stretch)."""
    if seconds < 59.5:
        return (f"{seconds:.1f}" if exact or seconds < 10 else f"{seconds:.0f}"), "second"
    m = seconds / 60
    return (f"{m:.1f}" if exact or m < 10 else f"{m:.0f}"), "minute"


def _span(seconds: float, adjective: str = "", *, exact: bool = False) -> str:
    """"65.4 clean minutes", "12 more clean seconds"."""
    figure, unit = _number(seconds, exact=exact)
    return f"{figure} {adjective + ' ' if adjective else ''}{unit}s"


def _mark(seconds: float, *, exact: bool = False) -> str:
    """A point of exposure: "minute 36.9", "second 12"."""
    figure, unit = _number(seconds, exact=exact)
    return f"{unit} {figure}"


def _mtbf(seconds: float) -> str:
    figure, unit = _number(seconds, exact=True)
    return f"{figure} {'min' if unit == 'minute' else 's'}"


def _percent(risk: float) -> str:
    return f"{risk * 100:.3g}%"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _risks(p: Plan) -> str:
    return f"α {_percent(p.alpha)}, β {_percent(p.beta)}"


def needed(p: Plan, *, exposure_s: float, hangs: int) -> Needed:
    """From an undecided point: the clean exposure left to the accept line, and
    the fewest more hangs that reject with the exposure they must land by."""
    accept_at = p.accept_at_s(hangs)
    clean: float | None = max(0.0, accept_at - exposure_s)
    while clean is not None and exposure_s + clean < accept_at:  # rounding: the sum must reach the line
        clean = math.nextafter(clean, math.inf)
    if p.max_exposure_s is not None and exposure_s + clean > p.max_exposure_s:
        clean = None
    # k more hangs reject when hangs + k >= c + b t, the earliest t being now; checked on
    # the line as a time (decide's form), so rounding never names a deadline already past
    more = max(1, math.ceil(p.reject_intercept + p.slope * exposure_s - hangs))
    while (at := p.reject_by_s(hangs + more)) is not None and at < exposure_s:
        more += 1
    while more > 1 and (at := p.reject_by_s(hangs + more - 1)) is not None and at >= exposure_s:
        more -= 1
    by = p.reject_by_s(hangs + more)
    if by is None or (p.max_exposure_s is not None and exposure_s > p.max_exposure_s) \
            or (p.max_hangs is not None and hangs + more > p.max_hangs):
        return Needed(clean, None, None)
    if p.max_exposure_s is not None:
        by = min(by, p.max_exposure_s)
    return Needed(clean, more, by)


def _basis(p: Plan, exposure_s: float, hangs: int) -> str:
    return (f"θ1 {_mtbf(p.broken_mtbf_s)} broken, θ0 {_mtbf(p.target_mtbf_s)} target (ratio {p.ratio:.3g}); "
            f"{_plural(hangs, 'hang')} in {_span(exposure_s, exact=True)} of exposure")


def pending(d: Decision, *, exposure_s: float, wait_s: float, horizon_s: float) -> Decision:
    """A live test past the accept line (or the exposure truncation) at ``d`` but
    standing at ``exposure_s``: a hang that began before the line may still be
    undetected for up to ``horizon_s``, so the decision is not yet final. Undecided,
    ``wait_s`` more clean exposure to go."""
    p = d.plan
    goal = "accept" if d.state is ProofState.ACCEPTED else "the truncation"
    head = (f"{_span(wait_s, 'more clean')} to {goal}: the line was reached at {_mark(d.exposure_s, exact=True)}, "
            f"and a hang that began before it can take {_span(horizon_s, exact=True)} to be detected")
    return Decision(ProofState.UNDECIDED, exposure_s, d.hangs, p.log_ratio(exposure_s, d.hangs),
                    p.accept_at_s(d.hangs), Needed(wait_s, None, None), (head, _basis(p, exposure_s, d.hangs)), p)


def withheld(d: Decision, reason: str) -> Decision:
    """An accept the run cannot stand behind: it failed otherwise (a failed criterion,
    a corruption, a crash), so its hang-free time proves no fix. Undecided, saying
    why; a reject or an undecided test is returned as it is."""
    if d.state is not ProofState.ACCEPTED and d.state is not ProofState.TRUNCATED:
        return d
    p = d.plan
    head = f"no proof: {reason}, so its hang-free time proves no fix"
    return Decision(ProofState.UNDECIDED, d.exposure_s, d.hangs, d.log_ratio, d.accept_at_s, None,
                    (head, *d.reasons[1:]), p)


def _decision(p: Plan, state: ProofState, exposure_s: float, hangs: int) -> Decision:
    lr = p.log_ratio(exposure_s, hangs)
    basis = _basis(p, exposure_s, hangs)
    if state is ProofState.ACCEPTED:
        what = _span(exposure_s, "clean", exact=True) if hangs == 0 else \
            f"{_span(exposure_s, exact=True)} with {_plural(hangs, 'hang')}"
        head = f"fixed ({_risks(p)}) after {what}"
        why = f"the accept line for {_plural(hangs, 'hang')} is {_span(p.accept_at_s(hangs), exact=True)}"
        return Decision(state, exposure_s, hangs, lr, p.accept_at_s(hangs), None, (head, why, basis), p)
    if state is ProofState.REJECTED:
        head = f"not fixed ({_risks(p)}): {_plural(hangs, 'hang')} within {_span(exposure_s, exact=True)}"
        by = p.reject_by_s(hangs)
        lands = "rejects when it lands" if hangs == 1 else "reject when they land"
        why = f"{_plural(hangs, 'hang')} {lands} by {_mark(by or 0.0, exact=True)}"
        return Decision(state, exposure_s, hangs, lr, p.accept_at_s(hangs), None, (head, why, basis), p)
    if state is ProofState.TRUNCATED:
        lean = "fixed" if lr < 0 else "broken"
        head = (f"undecided at the truncation ({_risks(p)}): {_plural(hangs, 'hang')} in "
                f"{_span(exposure_s, exact=True)}, leaning {lean}")
        limits = [_span(p.max_exposure_s, exact=True) if p.max_exposure_s is not None else "",
                  _plural(p.max_hangs, "hang") if p.max_hangs is not None else ""]
        why = "the test stops at " + " or ".join(x for x in limits if x) + " without crossing a line"
        return Decision(state, exposure_s, hangs, lr, p.accept_at_s(hangs), None, (head, why, basis), p)
    need = needed(p, exposure_s=exposure_s, hangs=hangs)
    parts = []
    if need.clean_s is not None:
        parts.append(f"{_span(need.clean_s, 'more clean')} to accept")
    if need.hangs is not None and need.by_s is not None:
        more = "more " if hangs else ""  # "2 hangs" from a clean start, "2 more hangs" after one
        parts.append(f"{need.hangs} {more}{'hang' if need.hangs == 1 else 'hangs'} before "
                     f"{_mark(need.by_s)} reject")
    if not parts:
        parts.append("undecided until the truncation")
    return Decision(state, exposure_s, hangs, lr, p.accept_at_s(hangs), need, ("; ".join(parts), basis), p)


def decide(p: Plan, *, exposure_s: float, hangs: int) -> Decision:
    """Where a test stands at (exposure, hangs), taking the point as one its path
    has just reached without crossing a line before (``walk`` checks a path).
    A point on or past the reject line has crossed it at its last hang (the line
    only rises), so it is rejected at this point; on or past the accept line,
    accepted; past a truncation, truncated."""
    if exposure_s < 0 or hangs < 0:
        raise ValueError("exposure and hangs are not negative")
    # the lines as times (not hang counts), so decide, walk and needed round alike
    by = p.reject_by_s(hangs)
    if by is not None and exposure_s <= by:
        return _decision(p, ProofState.REJECTED, exposure_s, hangs)
    if exposure_s >= p.accept_at_s(hangs):
        return _decision(p, ProofState.ACCEPTED, exposure_s, hangs)
    if (p.max_exposure_s is not None and exposure_s >= p.max_exposure_s) or \
            (p.max_hangs is not None and hangs >= p.max_hangs):
        return _decision(p, ProofState.TRUNCATED, exposure_s, hangs)
    return _decision(p, ProofState.UNDECIDED, exposure_s, hangs)


def walk(p: Plan, *, hang_exposures_s: Sequence[float], exposure_s: float) -> Decision:
    """A whole path: hangs at these marks of cumulative exposure, the test
    standing at ``exposure_s``. Returns the first line or truncation crossed, at
    the point it was crossed (an accept exactly at the truncation is an accept;
    an accept and a hang at one mark: the accept came first), else where the
    test stands, undecided."""
    marks = sorted(hang_exposures_s)
    if marks and (marks[0] < 0 or marks[-1] > exposure_s):
        raise ValueError("every hang lies within the exposure")
    hangs = 0
    for at in [*marks, None]:
        until = exposure_s if at is None else at
        accept_at = p.accept_at_s(hangs)
        cap = p.max_exposure_s
        if accept_at <= until and (cap is None or accept_at <= cap):
            return _decision(p, ProofState.ACCEPTED, accept_at, hangs)
        if cap is not None and cap <= until and (at is None or cap < at):
            return _decision(p, ProofState.TRUNCATED, cap, hangs)
        if at is None:
            break
        hangs += 1
        state = decide(p, exposure_s=at, hangs=hangs).state
        if state is not ProofState.UNDECIDED:
            return _decision(p, state, at, hangs)
    return _decision(p, ProofState.UNDECIDED, exposure_s, hangs)
