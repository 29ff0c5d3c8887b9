"""summary.json's figures, computed only from what the run directory recorded
(``soak.judge.recorded.Recorded``), pure.

The run's end (``soak.judge.entry.conclude``) and ``soak report`` (``rejudge``)
both serialize the judgement through here, so a run cut off by SIGKILL gets the
same summary it would have had, with ``cut_off: true`` (no ``run_ended`` event)
and a verdict from what was recorded: ``fail`` if an incident was recorded,
else ``aborted``.

Counting rules:
- ``requests``: every line of requests.jsonl (warm-up included: a warm-up
  failure is still a failure); ``ok`` is outcome ``ok``, ``failed`` the rest.
- ``tokens``: prompt tokens (as the server reported them in usage, else as
  planned) and generated tokens over every request the server accepted
  (``soak.samples.server_accepted``: a request it refused, reset or answered with an HTTP
  error before streaming brings no prompt tokens), warm-up included: what the
  server processed, comparable with its own counters.
- ``latency`` and ``throughput``: warm-up requests excluded. Every token figure
  (``tokens``, throughput, TPOT) is ``output_tokens``, what was counted from the
  text streamed; the server's usage claim (``usage_output_tokens``) enters only
  ``claims``, where a disagreement past the tolerance is counted and noted.
- ``prefix_cache_hit_ratio``: the server's counters over the run,
  increase(prefix_cache_hits) / increase(prefix_cache_queries), each as
  Prometheus' ``increase()`` reads a counter (``soak.counters``: a reset or
  any decrease splits the span and the new reading counts from zero). Never
  hits / prompt_tokens. ``server_metrics.counter_resets`` counts the splits per
  counter; more than the target's restarts explain mark the server figures
  incomplete, with a note.
- Time (CONTRACTS.md, "Time is monotonic"): ``duration_s``, throughput and
  ``ended_at`` come from the ``mono`` fields (run-relative monotonic seconds)
  the run store writes on every event and sample and the client on every
  request. ``ended_at`` is a label: ``started_at`` + the monotonic seconds
  from ``run_started`` to the run's end, so ``ended_at >= started_at`` always.
  ``clock.wall_steps`` lists the ``wall_clock_step`` events. A run recorded
  before ``mono`` existed is read from ``ts`` as it was.
- ``requests.failed`` leaves out requests the harness cut short (outcome
  ``aborted``): they are ``cut_by_drain``, ``cut_by_incident`` and
  ``cut_by_interrupt``, and count neither way in the failure criteria.

What the verdict rests on is read from disk, not from what the run loop
remembered: incidents are the union of the ``incident`` events and the
responder's ``incidents/N/incident.json`` (an incident racing the end of the
duration is in the summary even when its event never got written), and the
failure criteria (``soak.criteria``) are judged on requests.jsonl with the
run's own ``criteria:`` settings from config.yaml. ``server_metrics`` says
which span the server-side figures cover when /metrics stalled or stopped
parsing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from soak.criteria.claim_checks import claims_json
from soak.judge.recorded import NOWHEN, Moment, Recorded
from soak.counters import CounterDelta


@dataclass(frozen=True)
class RunSpan:
    started_at: float | None
    ended_at: float | None
    load_begin: float | None  # labels, for the coverage note
    load_end: float | None
    duration_s: float
    basis: str  # "monotonic" | "wall" (a run recorded before mono existed)


def run_span(*, started: Moment, first_request: Moment, load_started: Moment, load_stopped: Moment,
             ended: Moment, last_request_end: Moment, last: Moment, cut_off: bool,
             last_unmarked: float | None = None) -> RunSpan:
    """The run's figures of time from what it recorded (pure). On the monotonic
    basis every length is a difference of ``mono`` values and every label is the
    start's label plus one; the wall basis is the old reading of ``ts`` alone.
    ``last`` is (the latest label of any record, the latest mono); ``last_unmarked``
    the latest label among records without mono (placed by their label)."""
    base = started if started[1] is not None and started[0] is not None else first_request
    if base[0] is not None and base[1] is not None:
        base_ts, base_m = base

        def label(m: float | None) -> float | None:
            return None if m is None else base_ts + (m - base_m)

        def mono(moment: Moment) -> float | None:
            # A record without ``mono`` (written by hand, or by an older client) is
            # placed by its label: the run's labels are on the monotonic line.
            ts, m = moment
            return m if m is not None else (None if ts is None else base_m + (ts - base_ts))

        begin_m = mono(load_started) if load_started != NOWHEN else mono(first_request)
        end_m = mono(load_stopped) if load_stopped != NOWHEN else mono(last_request_end if cut_off else ended)
        duration = max(0.0, end_m - begin_m) if begin_m is not None and end_m is not None else 0.0
        if ended != NOWHEN:
            final_m = mono(ended)
        else:  # cut off: the last thing recorded, by its mono or by its label where it has none
            found = [m for m in (last[1], mono((last_unmarked, None))) if m is not None]
            final_m = max(found) if found else None
        ended_at = label(max(final_m, base_m)) if final_m is not None else base_ts
        return RunSpan(base_ts, ended_at, label(begin_m), label(end_m), duration, "monotonic")
    started_at = started[0] if started[0] is not None else first_request[0]
    ended_at = ended[0] if ended[0] is not None else last[0]
    begin = load_started[0] if load_started[0] is not None else first_request[0]
    end = load_stopped[0] if load_stopped[0] is not None else (last_request_end[0] if cut_off else ended_at)
    duration = max(0.0, end - begin) if begin is not None and end is not None else 0.0
    return RunSpan(started_at, ended_at, begin, end, duration, "wall")


def note_counter_resets(metrics: dict[str, Any], deltas: Mapping[str, CounterDelta], *, restarts: int) -> None:
    """``server_metrics.counter_resets``: how often each server counter split
    (a reset or a decrease). A split the target's restarts do not explain means
    the counters went backwards on a live server: the server figures then rest on
    reading each drop as a restart from zero, and are not complete."""
    resets = {key: delta.resets for key, delta in deltas.items()}
    metrics["counter_resets"] = resets
    unexplained = {key: n for key, n in resets.items() if n > restarts}
    if not unexplained:
        return
    metrics["complete"] = False
    which = ", ".join(f"{key} {n}x" for key, n in unexplained.items())
    note = (f"server counters went backwards with {restarts} restart(s) of the target ({which}): each drop is "
            "read as a restart from zero (Prometheus increase()), so the server token totals and the hit ratio "
            "may overstate what was served")
    metrics["note"] = f"{metrics['note']}; {note}" if metrics.get("note") else note


def figures(recorded: Recorded) -> dict[str, Any]:
    """summary.json without what the judgement decides (verdict, reasons, stop
    reason, exit code, criteria, thresholds), in summary.json's key order, with
    those keys present as None."""
    ev, requests, samples = recorded.events, recorded.requests, recorded.samples
    last_ts = ev.last_ts
    for ts in (requests.last_ended, samples.last_ts):
        if ts is not None:
            last_ts = ts if last_ts is None else max(last_ts, ts)
    last_mono, unmarked_ts = ev.last_mono, ev.unmarked_ts
    for mono in (samples.last_mono, requests.last_ended_mono):
        if mono is not None:
            last_mono = mono if last_mono is None else max(last_mono, mono)
    for ts in (samples.last_unmarked_ts, requests.last_ended_unmarked):
        if ts is not None:
            unmarked_ts = ts if unmarked_ts is None else max(unmarked_ts, ts)
    deltas = samples.deltas
    hits, queries = deltas["prefix_cache_hits"], deltas["prefix_cache_queries"]
    hit_ratio = hits.total / queries.total if hits.seen and queries.seen and queries.total > 0 else None

    cut_off = ev.run_ended is None
    times = run_span(started=ev.started, first_request=(requests.first_started, requests.first_started_mono),
                     load_started=ev.load_started, load_stopped=ev.load_stopped, ended=ev.ended,
                     last_request_end=(requests.last_ended, requests.last_ended_mono),
                     last=(last_ts, last_mono), last_unmarked=unmarked_ts, cut_off=cut_off)
    warmup_s = float(ev.run_started.get("warmup_s") or 0.0)
    measured_s = max(0.0, times.duration_s - warmup_s)
    metrics = samples.coverage.report(times.load_begin, times.load_end)
    note_counter_resets(metrics, deltas, restarts=ev.restarts)
    tally = requests.tally
    claims = claims_json(tally)
    # A claim not borne out is said where a person looks first, beside its figures in ``claims``.
    noted = [note for note in (claims.get("note"), (claims.get("server") or {}).get("note")) if note]
    return {
        "verdict": None,
        "cut_off": cut_off,
        "run_id": ev.run_started.get("run_id"),
        "target": ev.run_started.get("target"),
        "model": ev.run_started.get("model"),
        "started_at": times.started_at,
        "ended_at": times.ended_at,
        "duration_s": times.duration_s,
        "planned_duration_s": ev.run_started.get("duration_s"),
        "warmup_s": warmup_s,
        "stop_reason": None,
        "exit_code": None,
        "verdict_reasons": None,
        "requests": {"ok": requests.ok, "failed": requests.failed, "warmup": requests.warmup,
                     "by_outcome": dict(requests.by_outcome),
                     **{f"cut_by_{cause}": count for cause, count in requests.cut.items()}},
        "tokens": {
            "prompt": requests.prompt_tokens,
            "generated": requests.generated_tokens,
            "cached": requests.cached_tokens if requests.cached_known else None,
        },
        "server_tokens": {
            "prompt": deltas["prompt_tokens"].total if deltas["prompt_tokens"].seen else None,
            "generated": deltas["generation_tokens"].total if deltas["generation_tokens"].seen else None,
        },
        # The work claims cross-checked (usage, model, the server's counters, degenerate answers):
        # noted here, never a figure (tokens, throughput and TPOT are counted from the text).
        "claims": claims,
        "prefix_cache_hit_ratio": hit_ratio,
        "server_metrics": metrics,
        "criteria": None,
        # The one error-rate figure: the criterion judges it, thresholds, compare and history read it.
        "error_rate": (tally.failed / tally.finished) if tally.finished else None,
        "throughput": {
            "generated_tokens_per_s": requests.measured_generated / measured_s if measured_s > 0 else None,
            "requests_per_s": requests.measured / measured_s if measured_s > 0 else None,
        },
        "latency": {name: dict(stats) for name, stats in recorded.latency.items()},
        "incidents": [dict(i) for i in recorded.incidents],
        "restarts": ev.restarts,
        "clock": {"basis": times.basis, "wall_steps": [dict(s) for s in ev.wall_steps]},
        "gpu_source": {**ev.gpu_source, "messages": list(ev.gpu_source.get("messages", []))},
        "server_version": dict(ev.server_version) if ev.server_version is not None else None,
        "warnings": [*ev.warnings, *noted],
        "records": {"samples": samples.lines, **recorded.read_stats},
        "build": dict(ev.build) or None,
        "thresholds": None,
    }


__all__ = ["RunSpan", "figures", "note_counter_resets", "run_span"]
