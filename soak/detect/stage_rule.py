"""``stage_cpu_stall``: a stuck pipeline read through the stage-CPU source (no GPUs).

The shapes are soak.detect.stage_shapes'. The rule fires when one has held for
``window`` with the client's requests in flight and no progress signal moving,
once the server life has generated a token. What keeps a short window safe is the
shape itself: a healthy CPU worker reads 40-100% of a core while it works (its
OpenMP threads spin-wait between regions), so every stage asleep with requests in
flight is a pipeline that does nothing, and a healthy cold prefill keeps the stages
taking turns. Measured margins are in docs/detection.md.
"""

from __future__ import annotations

from soak.detect.config import DetectorConfig
from soak.detect.signals import SignalTracker
from soak.detect.stage_shapes import ShapeRun, StageShape
from soak.records import IncidentKind, RuleState, RuleStatus
from soak.samples import GpuSource

NAME = "stage_cpu_stall"


def stage_cpu_stall(s: SignalTracker, config: DetectorConfig, now: float) -> RuleStatus:
    cfg = config.stage_cpu_stall
    thresholds = {"asleep_pct": cfg.asleep_pct, "spin_pct": cfg.spin_pct, "window_s": cfg.window}
    if not cfg.enabled:
        return RuleStatus(NAME, RuleState.INACTIVE, reasons=("disabled",))
    if s.gpu_source is not GpuSource.STAGE_CPU:
        return RuleStatus(NAME, RuleState.INACTIVE, reasons=("reads stage CPU only (GPUs: pp_tail_stall)",))
    if len(s.topology.stages) < 2:
        return RuleStatus(NAME, RuleState.INACTIVE, reasons=("one pipeline stage: no pipeline to stall",))
    run = s.stage_run

    def clear(*reasons: str, elapsed: float | None = None) -> RuleStatus:
        return RuleStatus(NAME, RuleState.CLEAR, elapsed_s=elapsed, threshold_s=cfg.window, reasons=reasons,
                          evidence={"thresholds": thresholds})

    if run is None:
        return clear()
    if not s.generated_since_start:
        # Start-up and torch.compile run before any request; the first requests'
        # prefills and lazy compiles before the first token: the start-up grace's time.
        return clear("before this server life's first token")
    in_flight = s.requests_in_flight or 0
    if in_flight <= 0:
        return clear("no requests in flight")
    last_progress = s.last_progress_at
    start = run.since if last_progress is None else max(run.since, last_progress)
    elapsed = max(0.0, run.last - start)
    if elapsed < cfg.window * cfg.suspect_fraction:
        return clear(elapsed=round(elapsed, 3))
    # Progress stopped at the last progress seen, or when the requests came (after an idle gap).
    known = [t for t in (last_progress, s.busy_since) if t is not None]
    onset = min(start, max(known)) if known else run.since
    state = RuleState.FIRED if elapsed >= cfg.window else RuleState.PENDING
    return RuleStatus(NAME, state, IncidentKind.HANG, onset, round(elapsed, 3), cfg.window,
                      _reasons(s, cfg, run, in_flight, elapsed), _evidence(s, run, in_flight, start, thresholds))


def _levels(run: ShapeRun) -> str:
    return ", ".join(f"stage {i} {v:g}%" for i, v in enumerate(run.levels))


def _reasons(s: SignalTracker, cfg, run: ShapeRun, in_flight: int, elapsed: float) -> tuple[str, ...]:
    token_at = s.last_bytes_change
    no_token = (f"no token for {run.last - token_at:.1f}s" if token_at is not None and token_at <= run.last
                else "no token since the shape began")
    requests = f"{in_flight} request{'s' if in_flight != 1 else ''} in flight"
    if run.shape is StageShape.ASLEEP:
        who = ("all stages asleep" if all(v <= cfg.asleep_pct for v in run.levels)
               else f"last stage {run.stage} asleep and no stage spinning")
        what = (f"{who} with {requests} and {no_token} "
                f"(stage CPU, % of a core: {_levels(run)}; asleep <= {cfg.asleep_pct:g}%, "
                f"spinning >= {cfg.spin_pct:g}%)")
        why = (f"the engine waits for last stage {run.stage}'s output and no stage works on it: a send "
               f"skipped or paired with the wrong step (gloo's receive sleeps), or a stopped stage")
    else:
        what = (f"stage {run.stage} spins alone with {requests} and {no_token} "
                f"(stage CPU, % of a core: {_levels(run)}; spinning >= {cfg.spin_pct:g}%, "
                f"no other stage there)")
        why = (f"stage {run.stage} is busy in a loop that yields no output while the stages beside it "
               f"wait for it")
    held = f"shape held for {run.last - run.since:.1f}s over {run.points} readings; no progress signal " \
           f"moved for {elapsed:.1f}s (window {cfg.window:g}s)"
    return what, why, held


def _evidence(s: SignalTracker, run: ShapeRun, in_flight: int, start: float, thresholds: dict) -> dict:
    return {
        "source": GpuSource.STAGE_CPU.value,
        "shape": run.shape.value,
        "stage": run.stage,
        "signals": {
            "stage_cpu_pct": {str(i): v for i, v in enumerate(run.levels)},
            "in_flight": in_flight,
            "streaming": s.client.streaming if s.client else None,
            "running": s.running,
            "points": run.points,
            "shape_since": run.since,
            "last_progress_at": s.last_progress_at,
            "last_token_at": s.last_bytes_change,
        },
        "since": start,
        "thresholds": thresholds,
    }


__all__ = ["NAME", "stage_cpu_stall"]
