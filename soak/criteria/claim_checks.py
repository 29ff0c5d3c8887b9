"""The work-claim criteria (``work_rate``, ``server_work``, ``wrong_model``): pure
functions of a ``RequestTally`` and the ``ClaimsTally`` it carries
(``soak.criteria.claims``), each a ``CriterionResult`` with its figures.

A claim that cannot be checked (no /metrics counter, no served model recorded)
is ``inactive`` with a reason that says "not checked": never a silent pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from soak.criteria.claims import models_json
from soak.criteria.config import CriteriaConfig
from soak.criteria.rules import CriterionState, RequestTally

if TYPE_CHECKING:
    from soak.criteria.constraints import CriterionResult


def _result(*args: Any, **kwargs: Any) -> "CriterionResult":
    from soak.criteria.constraints import CriterionResult

    return CriterionResult(*args, **kwargs)


def work_rate(config: CriteriaConfig, tally: RequestTally, *, final: bool) -> "CriterionResult":
    cfg = config.work_rate
    name = "work_rate"
    if not cfg.enabled:
        return _result(name, CriterionState.INACTIVE, None, cfg.floor, ("disabled",))
    until = tally.until(final=final)
    if tally.load_started is None or until is None:
        return _result(name, CriterionState.INACTIVE, None, cfg.floor, ("the load never started",))
    tally = tally.settled(until)
    book = tally.claims.rate
    book.judge(until)
    origin = tally.load_started
    reference = book.reference
    evidence: dict[str, Any] = {
        "window_s": book.window_s, "floor": cfg.floor, "consecutive": cfg.consecutive,
        "windows_judged": book.judged, "silent_windows": book.silent,
        "healthy_tokens_per_window": reference,
        "lowest": None if book.lowest is None else {
            "from_s": round(book.lowest.start - origin, 3), "tokens": book.lowest.tokens,
            "share": round(book.lowest.share, 6)},
    }
    breach = book.breach
    if breach is not None:
        at = breach.start - origin
        share = f"{breach.share:.2%}" if breach.share < 0.01 else f"{breach.share:.1%}"
        reason = (f"work rate fell to {share} of the run's healthy rate at +{at:.0f}s: "
                  f"{breach.tokens} generated token(s) in the {breach.window_s:g}s window from +{at:.1f}s against "
                  f"a median of {breach.reference:g} per window before it, below the floor of {cfg.floor:.0%} "
                  f"for {cfg.consecutive} window(s) in a row")
        evidence["breach"] = {"from_s": round(at, 3), "tokens": breach.tokens, "reference": breach.reference,
                              "share": round(breach.share, 6)}
        return _result(name, CriterionState.FAIL, round(breach.share, 6), cfg.floor, (reason,), evidence)
    if reference is None or book.judged == 0:
        sized = "" if book.window_s is not None else f" (the window is sized after {cfg.window_requests} requests)"
        return _result(name, CriterionState.INACTIVE, None, cfg.floor,
                       (f"not checked: too few full windows with work to know the run's healthy rate{sized}",),
                       evidence)
    lowest = book.lowest.share if book.lowest is not None else None
    said = (f"work rate stayed above {cfg.floor:.0%} of the run's healthy rate ({reference:g} generated tokens per "
            f"{book.window_s:g}s window) in {book.judged} window(s)")
    if lowest is not None:
        said += f"; the lowest run of windows below the floor was shorter than {cfg.consecutive}"
    return _result(name, CriterionState.PASS, lowest, cfg.floor, (said,), evidence)


def server_work(config: CriteriaConfig, tally: RequestTally, *, final: bool) -> "CriterionResult":
    """The server's own count of generated tokens against the client's, over the
    span the server's scrapes cover (judged once the run is read: ``final``)."""
    cfg = config.server_work
    name = "server_work"
    work = tally.claims.server
    if not cfg.enabled:
        return _result(name, CriterionState.INACTIVE, None, cfg.min_ratio, ("disabled",))
    if work is None:
        return _result(name, CriterionState.INACTIVE, None, cfg.min_ratio,
                       ("not checked: judged once the run's server counters are read" if not final else
                        "not checked: the server's counters were not read",))
    evidence: dict[str, Any] = {"server_generated": work.generated if work.seen else None,
                                "client_within": work.client_within, "client_all": work.client_all,
                                "counter_resets": work.resets, "covered": work.covered,
                                "min_ratio": cfg.min_ratio, "min_tokens": cfg.min_tokens}
    if not work.seen:
        return _result(name, CriterionState.INACTIVE, None, cfg.min_ratio,
                       ("not checked: the server exported no generation_tokens counter (/metrics); the client's "
                        f"{work.client_all} generated tokens are unconfirmed by the server",), evidence)
    if work.client_within < cfg.min_tokens:
        return _result(name, CriterionState.INACTIVE, None, cfg.min_ratio,
                       (f"not checked: {work.client_within} generated token(s) inside the span the server's "
                        f"counters cover, fewer than min_tokens {cfg.min_tokens}",), evidence)
    ratio = work.generated / work.client_within
    evidence["ratio"] = round(ratio, 6)
    both = (f"the server's generation_tokens counter rose by {work.generated:.0f} while the client received "
            f"{work.client_within} generated tokens over the same span")
    if ratio < cfg.min_ratio:
        reason = (f"{both}: the server counted {ratio:.1%} of the work the client received (at least "
                  f"{cfg.min_ratio:.0%} needed): the answers did not come from work this server did "
                  f"(a replay cache or a proxy answering for it?)")
        return _result(name, CriterionState.FAIL, round(ratio, 6), cfg.min_ratio, (reason,), evidence)
    reasons = [f"{both} ({ratio:.0%})"]
    if work.generated > cfg.note_ratio * max(work.client_all, 1):
        reasons.append(f"anomaly: the server counted {work.generated:.0f} generated tokens, more than "
                       f"{cfg.note_ratio:g}x the {work.client_all} the client received (other clients, canaries, "
                       f"or a counter that overstates)")
        evidence["anomaly"] = "server_counted_more"
    return _result(name, CriterionState.PASS, round(ratio, 6), cfg.min_ratio, tuple(reasons), evidence)


def wrong_model(config: CriteriaConfig, tally: RequestTally, *, final: bool) -> "CriterionResult":
    cfg = config.wrong_model
    name = "wrong_model"
    claims = tally.claims
    evidence = models_json(claims)
    if not cfg.enabled:
        return _result(name, CriterionState.INACTIVE, None, cfg.max, ("disabled",), evidence)
    if claims.expected is None:
        return _result(name, CriterionState.INACTIVE, None, cfg.max,
                       ("not checked: the run recorded no served model",), evidence)
    named = claims.answers - claims.unnamed
    if named <= 0:
        return _result(name, CriterionState.INACTIVE, None, cfg.max,
                       (f"not checked: none of {claims.answers} answer(s) named its model",), evidence)
    wrong, first = claims.wrong_models()
    share = wrong / named
    served = ", ".join(evidence["expected"] or ())
    if wrong and share > cfg.max:
        reason = (f"{wrong} of {named} answers came from another model than the one served ({served}): "
                  f"the first of them named {evidence['first_wrong']!r}")
        return _result(name, CriterionState.FAIL, round(share, 6), cfg.max, (reason,), evidence)
    return _result(name, CriterionState.PASS, round(share, 6), cfg.max,
                   (f"{named - wrong} of {named} answers named the served model ({served})",), evidence)


def claims_json(tally: RequestTally) -> dict[str, Any]:
    """summary.json's ``claims``: what was cross-checked, with its figures."""
    claims = tally.claims
    work = claims.server
    server = None
    if work is not None:
        server = {"checked": work.seen, "server_generated": work.generated if work.seen else None,
                  "client_within": work.client_within, "client_all": work.client_all, "covered": work.covered,
                  "usage_claimed": work.claimed,
                  "usage_vs_counters": (round(work.claimed / work.generated, 6)
                                        if work.seen and work.claimed is not None and work.generated > 0 else None)}
    usage = claims.usage_json()
    if claims.usage_disagreements:
        usage["note"] = (f"{claims.usage_disagreements} of {claims.usage_checked} usage count(s) disagreed with the "
                         f"tokens counted from the text (claimed {claims.usage_claimed}, counted "
                         f"{claims.usage_counted}): every figure uses the counted tokens")
    if server is not None and server["usage_vs_counters"] is not None and \
            abs(server["usage_vs_counters"] - 1.0) > claims.config.claims.tolerance:
        server["note"] = (f"usage claimed {work.claimed} generated tokens, the server's own counters "
                          f"{work.generated:.0f}")
    if work is not None and work.seen and work.generated > claims.config.server_work.note_ratio * max(work.client_all, 1):
        more = (f"the server counted {work.generated:.0f} generated tokens, more than "
                f"{claims.config.server_work.note_ratio:g}x the {work.client_all} the client received")
        server["note"] = f"{server['note']}; {more}" if server.get("note") else more
    return {**usage, "model": models_json(claims), "server": server, "degenerate": claims.degenerate_json()}


__all__ = ["claims_json", "server_work", "work_rate", "wrong_model"]
