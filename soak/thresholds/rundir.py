"""Thresholds over a recorded run directory: the adapter between the files and
the pure evaluation. The run loop (for its exit status), summarize() (for
summary.json) and ``soak report`` all call ``run_thresholds``, so a run judged
live and re-rendered later reads the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping


from soak.jsonl import read_records
from soak.store.segments import read_sample_records
from soak.store.store import CONFIG, EVENTS, REQUESTS
from soak.thresholds.evaluate import (
    ThresholdConfigError, ThresholdResult, compile_thresholds, evaluate_run, evaluate_windows, thresholds_entry,
)

# What a window's figures read of a request (soak.thresholds.metrics.window_values);
# a whole record is several times the size, and a 24-hour run has a few hundred thousand.
WINDOW_FIELDS = ("ended_at", "outcome", "warmup", "output_tokens", "ttft_s", "tpot_s", "e2e_s", "itl_p50_s")


def recorded_thresholds_section(run_dir: Path) -> Mapping[str, Any] | None:
    from soak.configbase import read_recorded_yaml

    config = read_recorded_yaml(Path(run_dir) / CONFIG)
    section = config.get("thresholds") if isinstance(config, dict) else None
    return section if isinstance(section, dict) and section else None


def run_thresholds(run_dir: str | Path, summary: Mapping[str, Any],
                   section: Mapping[str, Any] | None = None) -> list[ThresholdResult] | None:
    """Every threshold's result, or None when the run configured none.
    ``section`` defaults to the one in the run's config.yaml."""
    run_dir = Path(run_dir)
    section = section if section is not None else recorded_thresholds_section(run_dir)
    if not section:
        return None
    thresholds = compile_thresholds(section)
    results = evaluate_run(thresholds, summary)
    if any(t.window_s is not None for t in thresholds):
        start = end = None
        for event in read_records(run_dir / EVENTS):
            if event.get("type") == "load_started" and start is None:
                start = event.get("ts")
            elif event.get("type") == "load_stopped":
                end = event.get("ts")
        requests = [{k: r.get(k) for k in WINDOW_FIELDS} for r in read_records(run_dir / REQUESTS)]
        # every segment, rolled ones included (samples.jsonl alone is only the open tail of a long run)
        server = [(s["ts"], s.get("values") or {}) for s in read_sample_records(run_dir, kinds={"server"})
                  if s.get("ok") and isinstance(s.get("ts"), (int, float))]
        if end is None:  # cut off: up to the last thing recorded
            ends = [r.get("ended_at") for r in requests if isinstance(r.get("ended_at"), (int, float))]
            end = max(ends, default=None)
        results += evaluate_windows(thresholds, requests, server, start=start, end=end)
    return results


def summary_thresholds(run_dir: str | Path, summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """summary.json's ``thresholds`` entry (None without thresholds); a recorded
    config that no longer compiles is reported, never raised."""
    try:
        results = run_thresholds(run_dir, summary)
    except ThresholdConfigError as exc:
        return {"passed": False, "breached": [], "results": [], "error": f"{exc.field}: {exc.message}"}
    if results is None:
        return None
    entry = thresholds_entry(results)
    for event in read_records(Path(run_dir) / EVENTS):
        if event.get("type") == "threshold_breached":  # a live abort_on_fail stop
            entry["aborted_by"] = {k: event.get(k) for k in ("ts", "threshold", "observed", "reason")}
            entry["passed"] = False
            if event.get("threshold") not in entry["breached"]:
                entry["breached"].insert(0, event.get("threshold"))
    return entry
