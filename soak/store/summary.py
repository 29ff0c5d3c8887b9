"""summary.json, computed only from what the run directory recorded.

The run loop calls ``summarize(run_dir)`` at the end and ``soak report`` calls
it again, so a run cut off by SIGKILL gets the same summary it would have had,
with ``cut_off: true`` (no ``run_ended`` event) and a verdict from what was
recorded: ``fail`` if an incident was recorded, else ``aborted``.

Counting rules:
- ``requests``: every line of requests.jsonl (warm-up included: a warm-up
  failure is still a failure); ``ok`` is outcome ``ok``, ``failed`` the rest.
- ``tokens``: prompt tokens (as the server reported them in usage, else as
  planned) and generated tokens over every request the server accepted
  (``server_accepted``: a request it refused, reset or answered with an HTTP
  error before streaming brings no prompt tokens), warm-up included: what the
  server processed, comparable with its own counters.
- ``latency`` and ``throughput``: warm-up requests excluded.
- ``prefix_cache_hit_ratio``: the server's counters over the run,
  increase(prefix_cache_hits) / increase(prefix_cache_queries), each as
  Prometheus' ``increase()`` reads a counter (``soak.store.counters``: a reset or
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

import math
from pathlib import Path
from array import array
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from soak.criteria.config import CriteriaConfig
from soak.criteria.constraints import judge
from soak.criteria.rules import LoadSpan, RequestTally, cut_cause, record_time
from soak.criteria.rules import generated_tokens as work_tokens
from soak.jsonl import is_bool, is_dict, is_int, is_list, is_number, is_str, is_timestamp, read_json, read_records, typed_fields
from soak.percentiles import percentiles
from soak.records import Verdict
from soak.store.counters import CounterDelta
from soak.store.segments import read_sample_records
from soak.store.store import CONFIG, EVENTS, REQUESTS

_VERDICTS = frozenset(v.value for v in Verdict)

# Server counters the summary derives figures from; a scrape with none of them is stale.
SERVER_KEYS = ("prefix_cache_hits", "prefix_cache_queries", "prompt_tokens", "generation_tokens")
MAX_STALE_SPANS = 20

INCIDENT_FIELDS = ("kind", "rule", "onset_at", "detected_at", "killed_pids", "gpus_released", "evidence")

# The types summarize relies on: a field of another type (a damaged or hostile
# line) reads as absent and is counted in records.wrong_type_fields (soak.jsonl.typed_fields).
EVENT_TYPES = {
    "ts": is_timestamp, "mono": is_number, "type": is_str, "run_id": is_str, "name": is_str, "target": is_str, "model": is_str,
    "duration_s": is_number, "warmup_s": is_number, "number": is_int, "kind": is_str, "rule": is_str,
    "onset_at": is_timestamp, "detected_at": is_timestamp, "killed_pids": is_list, "gpus_released": is_bool,
    "evidence": is_str, "summary": is_str, "gpu_free_s": is_number, "reason": is_str, "exit_code": is_int, "load_cut_short": is_bool,
    "verdict": is_str, "age_s": is_number, "message": is_str, "criteria": is_dict,
}
REQUEST_TYPES = {"started_at": is_timestamp, "ended_at": is_timestamp, "started_mono": is_number, "ended_mono": is_number}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) else None


# A moment of the run as recorded: its wall label and its run-relative monotonic seconds.
Moment = tuple[float | None, float | None]
NOWHEN: Moment = (None, None)


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


def _stats(values: Sequence[float]) -> dict[str, float | None]:
    p50, p90, p99 = percentiles(values, (50, 90, 99))
    return {
        "mean": sum(values) / len(values) if values else None,
        "p50": p50,
        "p90": p90,
        "p99": p99,
        "max": max(values) if values else None,
    }


def server_counter_deltas(samples: Iterable[dict[str, Any]], keys: Iterable[str]) -> dict[str, CounterDelta]:
    deltas = {key: CounterDelta() for key in keys}
    for sample in samples:
        if sample.get("kind") != "server" or not sample.get("ok"):
            continue
        values = sample.get("values") or {}
        for key, delta in deltas.items():
            value = values.get(key)
            if isinstance(value, (int, float)):
                delta.add(float(value))
    return deltas


@dataclass(frozen=True)
class RequestDigest:
    """One pass over requests.jsonl: every figure the summary and the final
    criteria take from it, so a run's end reads the file once however long the
    run (220,000 requests at 24 hours and 256 streams)."""

    criteria: CriteriaConfig
    tally: RequestTally
    warmup: int
    by_outcome: Mapping[str, int]
    prompt_tokens: int
    generated_tokens: int
    cached_tokens: int
    cached_known: int
    measured: int  # measured requests that were not cut by the harness
    measured_generated: int
    first_started: float | None
    last_ended: float | None
    ttft_s: Sequence[float]  # ok, measured requests only
    tpot_s: Sequence[float]
    e2e_s: Sequence[float]
    itl_p50_s: Sequence[float]
    stats: Mapping[str, int]  # unreadable lines, as read_records counts them
    first_started_mono: float | None = None
    last_ended_mono: float | None = None
    last_ended_unmarked: float | None = None  # the latest ended_at of a request without ended_mono
    span: LoadSpan = LoadSpan(None)  # the load's span the work evidence was judged against

    @property
    def ok(self) -> int:
        return self.tally.ok

    @property
    def failed(self) -> int:
        return self.tally.failed

    @property
    def cut(self) -> Mapping[str, int]:
        return self.tally.cut


# Outcomes of a request that never reached a server willing to stream it (no
# HTTP status recorded): the server processed none of its prompt.
REJECTED_BEFORE_STREAM = frozenset({"refused", "reset", "timeout_connect", "error", "malformed_stream", "http_status"})


def server_accepted(record: Mapping[str, Any]) -> bool:
    """Whether the server took the request in (its prompt is in the server's
    counters): a 2xx status; with no status recorded, any outcome but one that
    says the server refused, reset or failed it before answering. The one
    place client token totals are made comparable with the server's."""
    status = record.get("http_status")
    if isinstance(status, int) and not isinstance(status, bool):
        return 200 <= status < 300
    outcome = record.get("outcome")
    return not (isinstance(outcome, str) and outcome in REJECTED_BEFORE_STREAM)


def _count(value: Any) -> int | float:
    """A token count as recorded; anything else in a damaged line counts nothing."""
    return value if type(value) is int or (isinstance(value, (int, float)) and not isinstance(value, bool)) else 0


# run_ended exit codes of a load the harness itself cut short: interrupted, its own fault.
CUT_SHORT_EXITS = (130, 4)


def recorded_cut_short(run_ended: Mapping[str, Any] | None) -> bool:
    """Whether the harness cut the load short itself (it then owes only the time it had),
    as the run loop judged it (``load_cut_short``); older runs: by their exit code."""
    if run_ended is None:
        return False
    said = run_ended.get("load_cut_short")
    return said if isinstance(said, bool) else run_ended.get("exit_code") in CUT_SHORT_EXITS


def load_span(run_dir: Path, *, cut_short: bool | None = None) -> LoadSpan:
    """The load's span as events.jsonl recorded it (``load_started``, ``load_stopped``).
    ``cut_short``: None reads it from ``run_ended`` (the run loop, before writing
    that event, says it)."""
    started = stopped = ended = paused = None
    lives: list[tuple[dict[str, Any] | None, dict[str, Any]]] = []
    for event in read_records(run_dir / EVENTS):
        kind = event.get("type")
        if kind == "load_started" and started is None:
            started = event
        elif kind == "load_stopped":
            stopped = event
        elif kind == "run_ended":
            ended = event
        elif kind == "incident_started":
            paused = event
        elif kind == "restart_done":
            lives.append((paused, event))
    if cut_short is None:
        cut_short = recorded_cut_short(ended)
    return LoadSpan.of_events(started, stopped, cut_short=cut_short, restarts=lives)


def digest_requests(path: Path, criteria: CriteriaConfig, *,
                    on_request: Callable[[dict[str, Any]], None] | None = None,
                    stats: dict[str, int] | None = None, span: LoadSpan | None = None) -> RequestDigest:
    """The digest of a requests.jsonl (empty when it is missing). ``on_request``
    sees every parsed record, so a reader that wants more of them (the report's
    columns) shares this one pass; ``stats`` also gets the unreadable-line counts.
    ``span``: the load's (``load_span``), for the work-evidence criterion."""
    span = span or LoadSpan(None)
    own_stats: dict[str, int] = {}
    by_outcome: dict[str, int] = {}
    finished: list[tuple[float, str, str | None, int]] = []  # (end, outcome, cut cause, generated tokens)
    warmup = measured = measured_generated = 0
    prompt_tokens = generated_tokens = cached_tokens = cached_known = 0
    first_started: float | None = None
    last_ended: float | None = None
    first_mono: float | None = None
    last_mono: float | None = None
    unmarked: float | None = None
    ttft, tpot, e2e, itl_p50 = array("d"), array("d"), array("d"), array("d")
    latencies = (("ttft_s", ttft), ("tpot_s", tpot), ("e2e_s", e2e), ("itl_p50_s", itl_p50))
    for record in read_records(path, stats=own_stats, fields=REQUEST_TYPES):
        if on_request is not None:
            on_request(record)
        get = record.get
        outcome = get("outcome")
        if type(outcome) is not str:
            outcome = str(outcome)  # a hostile line's outcome may be any JSON value, a dict too
        by_outcome[outcome] = by_outcome.get(outcome, 0) + 1
        end = get("ended_at")
        ended = isinstance(end, (int, float))
        cause = cut_cause(record) if outcome == "aborted" else None
        at = record_time(record, offset=span.offset)
        finished.append((at if at is not None else 0.0, outcome, cause, work_tokens(record)))
        if server_accepted(record):
            prompt_tokens += _count(get("prompt_tokens"))
        output_tokens = _count(get("output_tokens"))
        generated_tokens += output_tokens
        cached = get("cached_tokens")
        if cached is not None:
            cached_tokens += _count(cached)
            cached_known += 1
        if ended:
            last_ended = end if last_ended is None else max(last_ended, end)
        start = get("started_at")
        if isinstance(start, (int, float)):
            first_started = start if first_started is None else min(first_started, start)
        mono = _number(get("started_mono"))
        if mono is not None:
            first_mono = mono if first_mono is None else min(first_mono, mono)
        mono = _number(get("ended_mono"))
        if mono is not None:
            last_mono = mono if last_mono is None else max(last_mono, mono)
        elif ended:
            unmarked = end if unmarked is None else max(unmarked, end)
        if get("warmup"):
            warmup += 1
            continue
        if cause is None:
            measured += 1
        measured_generated += output_tokens
        if outcome == "ok":
            for name, into in latencies:
                value = get(name)
                if isinstance(value, (int, float)):
                    into.append(value)
    # The tally folds in the order requests ended (the no-success stretch is a time span).
    finished.sort(key=lambda row: row[0])
    tally = RequestTally.for_config(criteria, span=span)
    for ended_at, outcome, cause, tokens in finished:
        tally.add_finished(outcome, ended_at, cause, tokens=tokens)
    if stats is not None:
        for key, count in own_stats.items():
            stats[key] = stats.get(key, 0) + count
    return RequestDigest(
        criteria=criteria, tally=tally, warmup=warmup, by_outcome=by_outcome, prompt_tokens=prompt_tokens,
        generated_tokens=generated_tokens, cached_tokens=cached_tokens, cached_known=cached_known,
        measured=measured, measured_generated=measured_generated, first_started=first_started,
        last_ended=last_ended, ttft_s=ttft, tpot_s=tpot, e2e_s=e2e, itl_p50_s=itl_p50, stats=own_stats,
        first_started_mono=first_mono, last_ended_mono=last_mono, last_ended_unmarked=unmarked, span=span)


def summarize(run_dir: str | Path, *, requests: RequestDigest | None = None) -> dict[str, Any]:
    """summary.json's content. ``requests``, a digest the caller already read
    (the run loop's end judged the criteria on it, the report built its columns
    in the same pass), is reused when it was made under the run's recorded
    criteria; otherwise requests.jsonl is read here."""
    run_dir = Path(run_dir)
    read_stats: dict[str, int] = {}

    started = load_started = load_stopped = ended = NOWHEN
    last_ts: float | None = None
    last_mono: float | None = None
    unmarked_ts: float | None = None  # the latest label of a record that has no mono
    wall_steps: list[dict[str, Any]] = []
    run_started: dict[str, Any] = {}
    run_ended: dict[str, Any] | None = None
    incidents: list[dict[str, Any]] = []
    restarts = 0
    # GPU source freshness (gpu_source_stale / _fresh events) and the server's version
    gpu_source: dict[str, Any] = {"stale": False, "stale_periods": 0, "max_age_s": None, "messages": []}
    server_version: dict[str, Any] | None = None
    warnings: list[str] = []
    build: dict[str, Any] = {}
    criteria_section: dict[str, Any] | None = None
    load_events: dict[str, dict[str, Any]] = {}
    # (incident_started, restart_done): the load paused, then a new server life
    lives: list[tuple[dict[str, Any] | None, dict[str, Any]]] = []
    paused: dict[str, Any] | None = None
    for event in read_records(run_dir / EVENTS, stats=read_stats, fields=EVENT_TYPES):
        ts = _number(event.get("ts"))
        if ts is not None:
            last_ts = ts if last_ts is None else max(last_ts, ts)
        mono = _number(event.get("mono"))
        if mono is not None:
            last_mono = mono if last_mono is None else max(last_mono, mono)
        elif ts is not None:
            unmarked_ts = ts if unmarked_ts is None else max(unmarked_ts, ts)
        kind = event.get("type")
        if kind == "run_started":
            run_started = event
            started = (ts, mono)
        elif kind == "load_started":
            load_started = (ts, mono)
            load_events.setdefault("started", event)
        elif kind == "load_stopped":
            load_stopped = (ts, mono)
            load_events["stopped"] = event
        elif kind == "run_ended":
            run_ended = event
            ended = (ts, mono)
        elif kind == "wall_clock_step" and len(wall_steps) < 20:
            wall_steps.append({k: event.get(k) for k in ("ts", "mono", "step_s", "wall_before", "wall_after")})
        elif kind == "incident":
            incidents.append({k: event.get(k) for k in (*INCIDENT_FIELDS, "number", "summary", "gpu_free_s", "diagnosis")})
        elif kind == "incident_started":
            paused = event
        elif kind == "restart_done":
            restarts += 1
            lives.append((paused, event))
        elif kind == "gpu_source_stale":
            gpu_source["stale"] = True
            gpu_source["stale_periods"] += 1
            age = event.get("age_s")
            if isinstance(age, (int, float)):
                gpu_source["max_age_s"] = max(age, gpu_source["max_age_s"] or 0.0)
            if event.get("message") and len(gpu_source["messages"]) < 5:
                gpu_source["messages"].append(str(event["message"]))
        elif kind == "criteria_config" and isinstance(event.get("criteria"), dict):
            criteria_section = event["criteria"]
        elif kind == "server_version":
            server_version = {k: event.get(k) for k in ("server_version", "basis", "covered", "covered_versions")}
        elif kind == "warning" and event.get("message") and len(warnings) < 20:
            warnings.append(str(event["message"]))
        elif kind == "build":
            build = {k: v for k, v in event.items() if k not in ("ts", "type")}

    criteria_config, criteria_note = _criteria_config(run_dir, criteria_section)
    span = LoadSpan.of_events(load_events.get("started"), load_events.get("stopped"),
                              cut_short=recorded_cut_short(run_ended),
                              restarts=lives)
    if requests is None or requests.criteria != criteria_config or requests.span != span:
        requests = digest_requests(run_dir / REQUESTS, criteria_config, stats=read_stats, span=span)
    else:
        for key, count in requests.stats.items():
            read_stats[key] = read_stats.get(key, 0) + count
    if requests.last_ended is not None:
        last_ts = requests.last_ended if last_ts is None else max(last_ts, requests.last_ended)
    tally = requests.tally
    server_keys = SERVER_KEYS
    coverage = MetricsCoverage(stale_after_s=_stale_after(run_dir))

    def covered(records: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
        for sample in records:
            coverage.add(sample)
            yield sample

    # Only server samples are parsed; the rest (most of a long run's lines) are counted unparsed.
    scan: dict[str, float] = {}
    deltas = server_counter_deltas(
        covered(read_sample_records(run_dir, stats=read_stats, kinds={"server"}, scan=scan)), server_keys)
    samples = int(scan.get("lines", 0))
    if "last_ts" in scan:
        last_ts = scan["last_ts"] if last_ts is None else max(last_ts, scan["last_ts"])
    for mono in (scan.get("last_mono"), requests.last_ended_mono):
        if mono is not None:
            last_mono = mono if last_mono is None else max(last_mono, mono)
    for ts in (scan.get("last_unmarked_ts"), requests.last_ended_unmarked):
        if ts is not None:
            unmarked_ts = ts if unmarked_ts is None else max(unmarked_ts, ts)
    hits, queries = deltas["prefix_cache_hits"], deltas["prefix_cache_queries"]
    hit_ratio = hits.total / queries.total if hits.seen and queries.seen and queries.total > 0 else None

    cut_off = run_ended is None
    times = run_span(started=started, first_request=(requests.first_started, requests.first_started_mono),
                    load_started=load_started, load_stopped=load_stopped, ended=ended,
                    last_request_end=(requests.last_ended, requests.last_ended_mono),
                    last=(last_ts, last_mono), last_unmarked=unmarked_ts, cut_off=cut_off)
    started_at, ended_at, duration_s = times.started_at, times.ended_at, times.duration_s
    load_begin, load_end = times.load_begin, times.load_end
    warmup_s = float(run_started.get("warmup_s") or 0.0)
    measured_s = max(0.0, duration_s - warmup_s)

    incidents = merge_incidents(incidents, disk_incidents(run_dir))
    decision = judge(criteria_config, tally, final=True)
    recorded = run_ended.get("verdict") if run_ended is not None else None
    if recorded in _VERDICTS:
        verdict = Verdict(recorded)
    else:
        verdict = Verdict.ABORTED if cut_off else Verdict.PASS
    if incidents or not decision.passed:
        verdict = Verdict.FAIL  # whatever the loop believed at its end: the record on disk decides
    reasons = [f"incident {i.get('number', '?')}: {i.get('kind', '?')} (rule {i.get('rule', '?')})" for i in incidents]
    reasons += list(decision.reasons)
    metrics = coverage.report(load_begin, load_end)
    note_counter_resets(metrics, deltas, restarts=restarts)

    summary = {
        "verdict": verdict.value,
        "cut_off": cut_off,
        "run_id": run_started.get("run_id"),
        "target": run_started.get("target"),
        "model": run_started.get("model"),
        "started_at": started_at,
        "ended_at": ended_at,
        "duration_s": duration_s,
        "planned_duration_s": run_started.get("duration_s"),
        "warmup_s": warmup_s,
        "stop_reason": (run_ended or {}).get("reason"),
        "exit_code": (run_ended or {}).get("exit_code"),
        "verdict_reasons": reasons,
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
        "prefix_cache_hit_ratio": hit_ratio,
        "server_metrics": metrics,
        "criteria": {**decision.to_json(), **({"note": criteria_note} if criteria_note else {})},
        # The one error-rate figure: the criterion judges it, thresholds, compare and history read it.
        "error_rate": (tally.failed / tally.finished) if tally.finished else None,
        "throughput": {
            "generated_tokens_per_s": requests.measured_generated / measured_s if measured_s > 0 else None,
            "requests_per_s": requests.measured / measured_s if measured_s > 0 else None,
        },
        "latency": {
            "ttft_s": _stats(requests.ttft_s),
            "tpot_s": _stats(requests.tpot_s),
            "e2e_s": _stats(requests.e2e_s),
            "itl_p50_s": _stats(requests.itl_p50_s),
        },
        "incidents": incidents,
        "restarts": restarts,
        "clock": {"basis": times.basis, "wall_steps": wall_steps},
        "gpu_source": gpu_source,
        "server_version": server_version,
        "warnings": warnings,
        "records": {"samples": samples, **read_stats},
        "build": build or None,
    }
    from soak.thresholds.rundir import summary_thresholds

    summary["thresholds"] = summary_thresholds(run_dir, summary)
    return summary


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


def recorded_criteria(run_dir: str | Path) -> CriteriaConfig:
    """The failure criteria the run was judged under, as summarize() reads them."""
    run_dir = Path(run_dir)
    section = None
    for event in read_records(run_dir / EVENTS):
        if event.get("type") == "criteria_config" and isinstance(event.get("criteria"), dict):
            section = event["criteria"]
    return _criteria_config(run_dir, section)[0]


def _read_config(run_dir: Path) -> dict[str, Any]:
    from soak.configbase import read_recorded_yaml

    # No retry with bare *** quoted: a config.yaml that does not parse is said so (the criteria note).
    return read_recorded_yaml(run_dir / CONFIG, retry_redacted=False) or {}


def _criteria_config(run_dir: Path, recorded: dict[str, Any] | None = None) -> tuple[CriteriaConfig, str | None]:
    """The run's own ``criteria:`` settings: the ``criteria_config`` event the run
    loop writes at start (JSON, so a config.yaml a redactor or a hand made
    unparsable cannot silently swap in the defaults), else config.yaml's section,
    else the defaults (said so when config.yaml cannot be read)."""
    if recorded is not None:
        try:
            return CriteriaConfig.model_validate(recorded), None
        except Exception as exc:
            return CriteriaConfig(), f"recorded criteria unreadable ({type(exc).__name__}), defaults used"
    config = _read_config(run_dir)
    section = config.get("criteria")
    if section is None:
        if not config and (run_dir / CONFIG).exists():
            return CriteriaConfig(), "config.yaml unreadable: the failure criteria were judged with their defaults"
        return CriteriaConfig(), None
    try:
        return CriteriaConfig.model_validate(section), None
    except Exception as exc:  # a hand-edited config.yaml: judge with the defaults, say so
        return CriteriaConfig(), f"config.yaml criteria unreadable ({type(exc).__name__}), defaults used"


def _stale_after(run_dir: Path) -> float:
    """Seconds without a fresh /metrics scrape that make the server figures stale:
    three scrape intervals, at least 5 s."""
    probes = _read_config(run_dir).get("probes")
    interval = probes.get("metrics_interval") if isinstance(probes, dict) else None
    interval = float(interval) if isinstance(interval, (int, float)) and interval > 0 else 1.0
    return max(5.0, 3.0 * interval)


class MetricsCoverage:
    """Which span of the run the server's own figures (token counters, prefix
    cache) cover: fresh scrapes are ``ok`` with at least one of SERVER_KEYS; a
    failed or empty scrape, or a gap past ``stale_after_s``, opens a stale span
    that the next fresh scrape closes."""

    def __init__(self, *, stale_after_s: float) -> None:
        self.stale_after_s = stale_after_s
        self.ok = 0
        self.failed = 0
        self.first_fresh: float | None = None
        self.last_fresh: float | None = None
        self.spans: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self.last_error: str | None = None

    def add(self, sample: dict[str, Any]) -> None:
        ts = sample.get("ts")
        if not isinstance(ts, (int, float)):
            return
        values = sample.get("values") or {}
        fresh = bool(sample.get("ok")) and any(isinstance(values.get(k), (int, float)) for k in SERVER_KEYS)
        if not fresh:
            self.failed += 1
            error = sample.get("error") or ("scrape lacks every server counter" if sample.get("ok") else "failed")
            self.last_error = str(error)[:200]
            if self._open is None:
                self._open = {"from": self.last_fresh, "first_failure": ts, "to": None, "error": self.last_error}
            return
        self.ok += 1
        if self._open is None and self.last_fresh is not None and ts - self.last_fresh > self.stale_after_s:
            self._open = {"from": self.last_fresh, "first_failure": None, "to": None, "error": "no scrape answered"}
        if self._open is not None:
            self._close(ts)
        if self.first_fresh is None:
            self.first_fresh = ts
        self.last_fresh = ts

    def _close(self, ts: float | None) -> None:
        span = self._open
        self._open = None
        if span is None:
            return
        start = span["from"] if span["from"] is not None else span["first_failure"]
        span["to"] = ts
        span["length_s"] = None if ts is None or start is None else round(ts - start, 3)
        if len(self.spans) < MAX_STALE_SPANS:
            self.spans.append(span)

    def report(self, load_begin: float | None, load_end: float | None) -> dict[str, Any]:
        stale_tail = None
        if self._open is not None:
            stale_tail = self._open
            self._close(None)
        elif self.last_fresh is not None and load_end is not None and load_end - self.last_fresh > self.stale_after_s:
            stale_tail = {"from": self.last_fresh}
        complete = not self.spans and stale_tail is None and self.first_fresh is not None
        note = None
        if self.first_fresh is None:
            note = (f"no /metrics scrape answered with server counters ({self.failed} failed"
                    + (f": {self.last_error}" if self.last_error else "") + "): server token totals and the "
                    "prefix-cache hit ratio are unknown")
        elif not complete:
            def rel(t: float | None) -> str:
                return "?" if t is None or load_begin is None else f"+{t - load_begin:.0f}s"

            note = f"server token totals and the prefix-cache hit ratio cover {rel(self.first_fresh)} to {rel(self.last_fresh)}"
            if stale_tail is not None:
                note += f"; /metrics stale after {rel(self.last_fresh)}"
                if load_end is not None and self.last_fresh is not None:
                    note += f" ({load_end - self.last_fresh:.0f}s before the load ended)"
            gaps = [sp for sp in self.spans if sp.get("to") is not None]
            if gaps:
                note += f"; {len(gaps)} stale span(s) in between (counters bridge them, rates inside them are unknown)"
            if self.last_error:
                note += f"; last error: {self.last_error}"
        return {
            "scrapes": {"fresh": self.ok, "failed_or_empty": self.failed},
            "covered_from": self.first_fresh,
            "covered_to": self.last_fresh,
            "stale_after": stale_tail.get("from") if stale_tail is not None else None,
            "stale_spans": self.spans,
            "complete": complete,
            "stale_after_s": self.stale_after_s,
            "note": note,
        }


def disk_incidents(run_dir: Path) -> list[dict[str, Any]]:
    """The responder's ``incidents/N/incident.json`` as summary entries: the final
    record once the response finished, else what the decision said (a response
    still under way, or cut off with the harness)."""
    root = run_dir / "incidents"
    out: list[dict[str, Any]] = []
    if not root.is_dir():
        return out
    for child in root.iterdir():
        if not child.is_dir() or not child.name.isdigit():
            continue
        obj = read_json(child / "incident.json")
        number = int(child.name)
        entry: dict[str, Any] = {"number": number, "evidence": f"incidents/{child.name}"}
        if isinstance(obj, dict):
            record = obj.get("record")
            record = typed_fields(record, EVENT_TYPES) if isinstance(record, dict) else record
            decision = obj.get("decision") if isinstance(obj.get("decision"), dict) else {}
            decision = typed_fields(decision, {**EVENT_TYPES, "decided_at": is_timestamp})
            if isinstance(record, dict):
                entry.update({k: record.get(k) for k in (*INCIDENT_FIELDS, "summary", "gpu_free_s", "diagnosis")})
            else:
                entry.update({
                    "kind": decision.get("kind"), "rule": decision.get("rule"),
                    "onset_at": decision.get("onset_at"), "detected_at": decision.get("decided_at"),
                    "killed_pids": [], "gpus_released": False, "gpu_free_s": None,
                    "summary": f"response not finished (status {obj.get('status', 'unknown')})",
                })
        else:
            entry.update({"kind": None, "rule": None, "summary": "incident.json missing or unreadable"})
        entry["number"] = number
        entry["evidence"] = entry.get("evidence") or f"incidents/{child.name}"
        out.append(entry)
    return out


def merge_incidents(from_events: list[dict[str, Any]], from_disk: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per incident number: the event's (the record the run loop got),
    else the disk's; sorted by number."""
    by_number: dict[Any, dict[str, Any]] = {}
    for entry in from_disk:
        by_number[entry.get("number")] = entry
    for entry in from_events:
        number = entry.get("number")
        disk = by_number.get(number)
        by_number[number] = {**(disk or {}), **{k: v for k, v in entry.items() if v is not None or disk is None}}
    return sorted(by_number.values(), key=lambda e: e.get("number") if isinstance(e.get("number"), int) else 0)
