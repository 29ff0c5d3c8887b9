"""``pp_tail_stall`` from GPU readings, decided by sequential evidence (issue 37).

The tracker folds each fresh GPU reading into a CUSUM of log-likelihood ratios
(soak.detect.evidence); this rule reads it against the bound for the configured
ARL0. Strong evidence (the tail dark beside a spinning upstream, no progress)
decides in a few readings; a weak or ambiguous pattern has to keep adding up.
Stage-CPU readings keep their window (rules.pp_tail_stall), as their real-vLLM
goals were measured with it.
"""

from __future__ import annotations

import math

from soak.detect import evidence as ev
from soak.detect.config import DetectorConfig
from soak.detect.evidence_table import TABLE
from soak.detect.signals import SignalTracker
from soak.records import IncidentKind, RuleState, RuleStatus

NAME = "pp_tail_stall"

_SAY = {
    ev.TAIL: "last stage GPU dark while upstream GPUs spin",
    ev.PROGRESS: "no progress signal moving",
}


def pp_tail_sequential(s: SignalTracker, config: DetectorConfig, now: float) -> RuleStatus:
    cfg = config.pp_tail_stall
    seq = cfg.sequential
    bound = ev.bound_for_arl0(seq.arl0_hours * 3600.0, TABLE.period_s)
    state = s.evidence
    fraction = state.fraction(bound)
    thresholds = {"bound": round(bound, 3), "arl0_hours": seq.arl0_hours, "reading_period_s": TABLE.period_s,
                  "low_pct": cfg.low_pct, "high_pct": cfg.high_pct}
    if not s.in_flight:
        return RuleStatus(NAME, RuleState.CLEAR, elapsed_s=round(state.total, 3), threshold_s=round(bound, 3),
                          reasons=("no requests in flight",),
                          evidence={"thresholds": thresholds, "suspect": round(fraction, 3)})
    if state.since is None or fraction < seq.suspect_fraction:
        return RuleStatus(NAME, RuleState.CLEAR, elapsed_s=round(state.total, 3), threshold_s=round(bound, 3),
                          evidence={"thresholds": thresholds, "suspect": round(fraction, 3)})
    earliest, latest = ev.onset_interval(state)
    if latest is not None and math.isfinite(s.started_at) and s.started_at <= latest:
        # The hang began after the detector's last reset (when a server the harness
        # launched answered ready, first or after a restart): a tail never read working
        # since is dated from it, and a working reading whose span reaches back before
        # it (warm-up) is cut there. An attached server's detector is never reset.
        earliest = s.started_at if earliest is None else max(earliest, s.started_at)
    onset = latest if latest is not None else state.since
    tail = ",".join(str(i) for i in s.topology.last_stage)
    parts = "; ".join(f"{_SAY.get(k, k)} {v:+.1f}" for k, v in sorted(state.contributions.items(),
                                                                          key=lambda kv: -kv[1]))
    reasons = (
        f"evidence {state.total:.1f} of the bound {bound:.1f} ({fraction:.0%}; one false alarm per "
        f"{seq.arl0_hours:g} h of healthy load) over {state.points} GPU readings since the excursion began",
        f"each signal's contribution: {parts}",
        ("no progress signal moved since the excursion began" if s.last_progress_at is None
         else f"last progress seen {max(0.0, now - s.last_progress_at):.1f}s ago"),
        f"last stage GPU {tail} at {s.gpu_levels.get(s.topology.last_stage[0], float('nan')):g}%; "
        f"requests running: {s.running if s.running is not None else 'unknown'}; "
        f"client in flight: {s.client.in_flight if s.client else 'unknown'}",
    )
    evidence = {
        "signals": {
            "gpu_util_pct": {str(k): v for k, v in sorted(s.gpu_levels.items())},
            "source": s.gpu_source.value if s.gpu_source else None,
            "tail_gpus": list(s.topology.last_stage),
            "upstream_gpus": list(s.topology.upstream),
            "points": state.points,
            "running": s.running,
            "last_progress_at": s.last_progress_at,
            "contributions": {k: round(v, 3) for k, v in sorted(state.contributions.items())},
        },
        "since": state.since,
        "suspect": round(fraction, 3),
        "onset_interval": {"earliest": earliest, "latest": latest},
        "thresholds": thresholds,
    }
    fired = state.total >= bound
    return RuleStatus(NAME, RuleState.FIRED if fired else RuleState.PENDING, IncidentKind.HANG, onset,
                      round(state.total, 3), round(bound, 3), reasons, evidence)


__all__ = ["NAME", "pp_tail_sequential"]
