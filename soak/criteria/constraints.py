"""The failure criteria themselves: each a pure function of a ``RequestTally``
(``soak.criteria.rules``) to a ``CriterionResult`` with its reasons, and
``judge(config, tally, final=...)``, every criterion at once as a
``CriteriaDecision``. No clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from soak.criteria.config import CriteriaConfig
from soak.criteria.rules import CriterionState, Gap, RequestTally


@dataclass(frozen=True)
class CriterionResult:
    name: str
    state: CriterionState
    value: float | None
    threshold: float | None
    reasons: tuple[str, ...]
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state.value, "value": self.value, "threshold": self.threshold,
                "reasons": list(self.reasons), "evidence": dict(self.evidence)}


@dataclass(frozen=True)
class CriteriaDecision:
    results: tuple[CriterionResult, ...]
    stop: bool  # end the soak now (a breach that cannot recover, with stop_on_breach)

    @property
    def failed(self) -> tuple[CriterionResult, ...]:
        return tuple(r for r in self.results if r.state is CriterionState.FAIL)

    @property
    def passed(self) -> bool:
        return not self.failed

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(reason for r in self.failed for reason in r.reasons[:1])

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "failed": [r.name for r in self.failed],
                "results": [r.to_json() for r in self.results]}


def _outcomes(tally: RequestTally) -> str:
    parts = sorted(tally.failed_by_outcome.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{name} {count}" for name, count in parts)


def error_rate(config: CriteriaConfig, tally: RequestTally, *, final: bool) -> CriterionResult:
    cfg = config.error_rate
    name = "error_rate"
    evidence = {"finished": tally.finished, "failed": tally.failed, "failed_by_outcome": dict(tally.failed_by_outcome),
                "cut": dict(tally.cut), "min_requests": cfg.min_requests}
    if not cfg.enabled:
        return CriterionResult(name, CriterionState.INACTIVE, None, cfg.max, ("disabled",), evidence)
    if tally.finished < cfg.min_requests:
        return CriterionResult(name, CriterionState.INACTIVE, None, cfg.max,
                               (f"{tally.finished} finished request(s), fewer than min_requests {cfg.min_requests}",),
                               evidence)
    rate = tally.failed / tally.finished
    summary = f"{tally.failed} of {tally.finished} finished requests failed"
    if tally.failed:
        summary += f" ({_outcomes(tally)})"
    if rate > cfg.max:
        state = CriterionState.FAIL if final else CriterionState.AT_RISK
        reason = f"error rate {rate:.1%} is above the {cfg.max:.1%} allowed: {summary}"
    else:
        state = CriterionState.PASS
        reason = f"error rate {rate:.1%} is within the {cfg.max:.1%} allowed: {summary}"
    return CriterionResult(name, state, rate, cfg.max, (reason,), evidence)


def no_success(config: CriteriaConfig, tally: RequestTally, *, final: bool) -> CriterionResult:
    cfg = config.no_success
    name = "no_success"
    evidence: dict[str, Any] = {"window_s": cfg.window, "min_failures": cfg.min_failures,
                                "longest": tally.longest.to_json() if tally.longest else None}
    if not cfg.enabled:
        return CriterionResult(name, CriterionState.INACTIVE, None, cfg.window, ("disabled",), evidence)
    breach = tally.breach
    if breach is not None:
        evidence["breach"] = breach.to_json()
        reason = (f"requests kept failing for {breach.length_s:.1f}s with none succeeding "
                  f"({breach.failures} failures; window {cfg.window:g}s)")
        return CriterionResult(name, CriterionState.FAIL, breach.length_s, cfg.window, (reason,), evidence)
    longest = tally.longest.length_s if tally.longest else 0.0
    return CriterionResult(name, CriterionState.PASS, longest, cfg.window,
                           (f"longest stretch of failures with no success {longest:.1f}s (window {cfg.window:g}s)",),
                           evidence)


def _what_happened(tally: RequestTally) -> str:
    cut = sum(tally.cut.values())
    # Those that finished ok with nothing are among the failed (no_output): said once.
    others = tally.failed - tally.ok_without_tokens
    parts = [f"{tally.ok_without_tokens} finished ok with no generated tokens" if tally.ok_without_tokens else "",
             f"{others} failed" if others > 0 else "",
             f"{cut} cut by the harness still in flight" if cut else ""]
    said = ", ".join(p for p in parts if p)
    return said or "none finished"


def work_evidence(config: CriteriaConfig, tally: RequestTally, *, final: bool) -> CriterionResult:
    """No evidence, no pass: finished requests with generated tokens, in every
    full window at its floor, the first within ``startup`` of the load's start and
    never ``max_gap`` without one after. Final (the load over and its end
    recorded), a load with no such request at all fails whatever its length."""
    cfg = config.work_evidence
    name = "work_evidence"
    gap_bound, startup = cfg.gap_s, cfg.startup_s
    origin = tally.load_started
    if not cfg.enabled:
        return CriterionResult(name, CriterionState.INACTIVE, None, gap_bound, ("disabled",))
    if origin is None:
        return CriterionResult(name, CriterionState.INACTIVE, None, gap_bound, ("the load never started",))
    until = tally.until(final=final)
    assert until is not None
    tally = tally.settled(until)
    life = tally.life_started
    assert life is not None
    # A load that ran its course owes work however short; one the harness cut
    # (Ctrl-C, its own fault) is judged on the time it had, start-up allowance included.
    strict = final and tally.load_ended is not None and not tally.cut_short

    def rel(t: float) -> str:
        return f"+{t - origin:.1f}s"

    windows = tally.windows(until)
    first, last = tally.first_work, tally.last_work
    # The current life's silence: since its last work, or since it began (then the start-up allowance).
    trailing = Gap(tally.life_last if tally.life_last is not None else life, until)
    longest = tally.longest_gap
    gap = trailing if longest is None or trailing.length_s > longest.length_s else longest
    since_restart = " after the restart" if tally.restarts else ""
    evidence: dict[str, Any] = {
        "window_s": cfg.window, "min_requests": cfg.min_requests, "min_tokens": cfg.min_tokens,
        "max_gap_s": gap_bound, "startup_s": startup, "judged_s": round(until - origin, 3),
        "requests_with_tokens": tally.work_requests, "generated_tokens": tally.work_tokens,
        "ok_without_tokens": tally.ok_without_tokens,
        "first_work_s": None if first is None else round(first - origin, 3),
        "last_work_s": None if last is None else round(last - origin, 3),
        "longest_gap": {"from_s": round(gap.start - origin, 3), "to_s": round(gap.end - origin, 3),
                        "length_s": round(gap.length_s, 3)},
        "restarts": tally.restarts,
        "windows": {"judged": windows.judged, "short": windows.short,
                    "first_short": None if windows.first_short is None else {
                        "from_s": round(windows.first_short.start - origin, 3),
                        "requests": windows.first_short.requests, "tokens": windows.first_short.tokens}},
    }
    reasons: list[str] = []
    elapsed = until - origin
    if first is None and strict:
        reasons.append(f"no request finished with generated tokens in {elapsed:.1f}s of load "
                       f"({_what_happened(tally)})")
    elif tally.life_first is None and until - life >= startup:
        reasons.append(f"no request finished with generated tokens in the first {until - life:.1f}s of load"
                       f"{since_restart}, past the start-up allowance of {startup:g}s ({_what_happened(tally)})")
    slow = tally.slow_start
    if slow is not None and slow.length_s >= startup:
        reasons.append(f"the first request with generated tokens finished {slow.length_s:.1f}s into the load"
                       f"{' (or a restart)' if tally.restarts else ''}, past the start-up allowance of {startup:g}s")
    # Gaps after a life's first work count against max_gap; the silence before it is the start-up's.
    gaps = [g for g in (longest, trailing if tally.life_first is not None else None) if g is not None]
    worst = max(gaps, key=lambda g: g.length_s, default=None)
    if worst is not None and worst.length_s >= gap_bound:
        reasons.append(f"no request finished with generated tokens for {worst.length_s:.1f}s "
                       f"({rel(worst.start)} to {rel(worst.end)} of the load; at most {gap_bound:g}s allowed)")
    short = windows.first_short
    if short is not None:
        start = short.start
        reasons.append(f"{windows.short} of {windows.judged} window(s) of {cfg.window:g}s below the floor of "
                       f"{cfg.min_requests} request(s) and {cfg.min_tokens} token(s): the first, {rel(start)} to "
                       f"{rel(start + cfg.window)}, had {short.requests} request(s) with {short.tokens} "
                       f"generated token(s)")
    if reasons:
        return CriterionResult(name, CriterionState.FAIL, round(gap.length_s, 3), gap_bound, tuple(reasons), evidence)
    said = (f"{tally.work_requests} request(s) finished with {tally.work_tokens} generated tokens; "
            f"longest gap {gap.length_s:.1f}s (at most {gap_bound:g}s); {windows.judged} full window(s) of "
            f"{cfg.window:g}s at the floor")
    return CriterionResult(name, CriterionState.PASS, round(gap.length_s, 3), gap_bound, (said,), evidence)


from soak.criteria.claim_checks import server_work, work_rate, wrong_model  # noqa: E402 (they build CriterionResult)

CRITERIA = (error_rate, no_success, work_evidence, work_rate, server_work, wrong_model)
# A breach of these cannot recover: the soak can end at once (stop_on_breach).
FINAL_ONCE_FAILED = ("no_success", "work_evidence", "work_rate", "server_work", "wrong_model")


def judge(config: CriteriaConfig, tally: RequestTally, *, final: bool) -> CriteriaDecision:
    """Every criterion on the tally. ``final``: the run's load is over (the error
    rate is then decided; before, a rate over its threshold is only at risk; and
    a load that ended with no work at all fails however short)."""
    results = tuple(rule(config, tally, final=final) for rule in CRITERIA)
    stop = config.stop_on_breach and any(
        r.state is CriterionState.FAIL and r.name in FINAL_ONCE_FAILED for r in results)
    return CriteriaDecision(results=results, stop=stop)
