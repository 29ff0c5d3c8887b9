"""The recorders' digests of a run directory: what the judge (soak.judge) reads
of requests.jsonl, the server samples and incidents/, each in one pass.

- ``digest_requests`` / ``fold_requests``: one pass over requests.jsonl gives
  every figure summary.json and the final failure criteria take from it.
- ``server_counter_deltas`` and ``MetricsCoverage``: the server's counters as
  Prometheus' ``increase()`` reads them, and which span of the run they cover.
- ``disk_incidents`` and ``merge_incidents``: the incidents the responder wrote
  under incidents/N, merged with the ``incident`` events.

Judging the run from these (the verdict, the thresholds, summary.json) is the
judge's, above this floor: nothing here imports soak.thresholds.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from array import array
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from soak.criteria.config import CriteriaConfig
from soak.criteria.rules import LoadSpan, RequestTally, cut_cause, record_time
from soak.criteria.rules import generated_tokens as work_tokens
from soak.events import EventType
from soak.jsonl import is_bool, is_dict, is_int, is_list, is_number, is_str, is_timestamp, read_json, read_records, typed_fields
from soak.counters import CounterDelta
from soak.records import detection_latency
from soak.redact import clip
from soak.samples import server_accepted
from soak.store.rundir import RunDir
from soak.store.store import EVENTS

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
    "verdict": is_str, "age_s": is_number, "message": is_str, "criteria": is_dict, "plan": is_dict,
    # run_ended: what the run knew at its end (soak.judge.ending.Ending)
    "problem": is_str, "interrupted": is_bool, "harness_fault": is_str, "failed_live": is_bool,
}
REQUEST_TYPES = {"started_at": is_timestamp, "ended_at": is_timestamp, "started_mono": is_number, "ended_mono": is_number,
                 # the work claims' (soak.criteria.claims): a claim of the wrong type is no claim
                 "model": is_str, "usage_output_tokens": is_int, "degenerate": is_str}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def server_values(sample: Mapping[str, Any]) -> dict[str, float] | None:
    """A server sample's counters when the scrape succeeded (``ok`` is true, the
    boolean): its finite numeric values only; None for a failed or damaged one
    (a sample line is outside input: ``values`` may be anything)."""
    values = sample.get("values")
    if sample.get("ok") is not True or not isinstance(values, Mapping):
        return None
    return {str(k): v for k, v in ((k, _number(v)) for k, v in values.items()) if v is not None}


def server_counter_deltas(samples: Iterable[dict[str, Any]], keys: Iterable[str]) -> dict[str, CounterDelta]:
    deltas = {key: CounterDelta() for key in keys}
    for sample in samples:
        if sample.get("kind") != "server":
            continue
        values = server_values(sample)
        if values is None:
            continue
        for key, delta in deltas.items():
            value = values.get(key)
            if value is not None:
                delta.add(value)
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
    # The productive requests' ends on the run's time line, in order: the evidence of
    # work the time at risk is counted by (soak.exposure.intervals_of's work_at).
    work_at: Sequence[float] = ()

    @property
    def ok(self) -> int:
        return self.tally.ok

    @property
    def failed(self) -> int:
        return self.tally.failed

    @property
    def cut(self) -> Mapping[str, int]:
        return self.tally.cut


# The fields of a request the work claims read (soak.criteria.claims.ClaimsTally.add), in order.
CLAIM_FIELDS = ("outcome", "warmup", "output_tokens", "usage_output_tokens", "model", "degenerate", "started_at",
                "ended_at")
_CLAIM_INDEX = {name: i for i, name in enumerate(CLAIM_FIELDS)}


def _claim_getter(row: tuple[Any, ...]) -> Any:
    def get(key: str, default: Any = None) -> Any:
        i = _CLAIM_INDEX.get(key)
        return default if i is None else row[i]
    return get


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
        if kind == EventType.LOAD_STARTED and started is None:
            started = event
        elif kind == EventType.LOAD_STOPPED:
            stopped = event
        elif kind == EventType.RUN_ENDED:
            ended = event
        elif kind == EventType.INCIDENT_STARTED:
            paused = event
        elif kind == EventType.RESTART_DONE:
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
    own_stats: dict[str, int] = {}
    return fold_requests(read_records(path, stats=own_stats, fields=REQUEST_TYPES), criteria, read_stats=own_stats,
                         on_request=on_request, stats=stats, span=span)


def fold_requests(records: Iterable[dict[str, Any]], criteria: CriteriaConfig, *, read_stats: dict[str, int],
                  on_request: Callable[[dict[str, Any]], None] | None = None,
                  stats: dict[str, int] | None = None, span: LoadSpan | None = None) -> RequestDigest:
    """``digest_requests`` over records already being read (read with
    ``fields=REQUEST_TYPES``); ``read_stats`` is the dict that read counts its
    unreadable lines in, filled by the time the records run out."""
    span = span or LoadSpan(None)
    own_stats = read_stats
    by_outcome: dict[str, int] = {}
    # (end, outcome, cut cause, generated tokens, what the work claims read: CLAIM_FIELDS and server_accepted)
    finished: list[tuple[float, str, str | None, int, tuple[Any, ...]]] = []
    work_at: list[float] = []
    warmup = measured = measured_generated = 0
    prompt_tokens = generated_tokens = cached_tokens = cached_known = 0
    first_started: float | None = None
    last_ended: float | None = None
    first_mono: float | None = None
    last_mono: float | None = None
    unmarked: float | None = None
    ttft, tpot, e2e, itl_p50 = array("d"), array("d"), array("d"), array("d")
    latencies = (("ttft_s", ttft), ("tpot_s", tpot), ("e2e_s", e2e), ("itl_p50_s", itl_p50))
    for record in records:
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
        accepted = server_accepted(record)
        model = get("model")
        claims = (outcome, get("warmup"), get("output_tokens"), get("usage_output_tokens"),
                  sys.intern(model[:200]) if type(model) is str else model, get("degenerate"),
                  get("started_at"), end, accepted)
        tokens = work_tokens(record)
        finished.append((at if at is not None else 0.0, outcome, cause, tokens, claims))
        if tokens > 0 and at is not None:
            work_at.append(at)
        if accepted:
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
    for ended_at, outcome, cause, tokens, claims in finished:
        tally.add_finished(outcome, ended_at, cause, tokens=tokens, record=_claim_getter(claims),
                           accepted=claims[-1])
    if stats is not None:
        for key, count in own_stats.items():
            stats[key] = stats.get(key, 0) + count
    return RequestDigest(
        criteria=criteria, tally=tally, warmup=warmup, by_outcome=by_outcome, prompt_tokens=prompt_tokens,
        generated_tokens=generated_tokens, cached_tokens=cached_tokens, cached_known=cached_known,
        measured=measured, measured_generated=measured_generated, first_started=first_started,
        last_ended=last_ended, ttft_s=ttft, tpot_s=tpot, e2e_s=e2e, itl_p50_s=itl_p50, stats=own_stats,
        first_started_mono=first_mono, last_ended_mono=last_mono, last_ended_unmarked=unmarked, span=span,
        work_at=array("d", sorted(work_at)))


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
        values = server_values(sample)
        fresh = values is not None and any(k in values for k in SERVER_KEYS)
        if not fresh:
            self.failed += 1
            error = sample.get("error") or ("scrape lacks every server counter" if sample.get("ok") is True else "failed")
            self.last_error = clip(str(error), 200)
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
        if span is not None and len(self.spans) < MAX_STALE_SPANS:
            self.spans.append(self._closed(span, ts))

    @staticmethod
    def _closed(span: dict[str, Any], ts: float | None) -> dict[str, Any]:
        start = span["from"] if span["from"] is not None else span["first_failure"]
        span["to"] = ts
        span["length_s"] = None if ts is None or start is None else round(ts - start, 3)
        return span

    def report(self, load_begin: float | None, load_end: float | None) -> dict[str, Any]:
        """The coverage as summary.json's ``server_metrics`` says it; reading it
        changes nothing (a span still open is closed in the copy reported)."""
        spans = [dict(span) for span in self.spans]
        stale_tail = None
        if self._open is not None:
            stale_tail = dict(self._open)
            closed = self._closed(stale_tail, None)
            if len(spans) < MAX_STALE_SPANS:
                spans.append(closed)
        elif self.last_fresh is not None and load_end is not None and load_end - self.last_fresh > self.stale_after_s:
            stale_tail = {"from": self.last_fresh}
        complete = not spans and stale_tail is None and self.first_fresh is not None
        note = None
        if self.first_fresh is None:
            note = (f"no /metrics scrape answered with server counters ({self.failed} failed"
                    + (f": {self.last_error}" if self.last_error else "") + "): server token totals and the "
                    "prefix-cache hit ratio are unknown")
        elif not complete:
            def rel(t: float | None) -> str:
                # a first scrape a moment before the load began is its start, not "+-0s"
                return "?" if t is None or load_begin is None else f"+{max(0.0, t - load_begin):.0f}s"

            note = f"server token totals and the prefix-cache hit ratio cover {rel(self.first_fresh)} to {rel(self.last_fresh)}"
            if stale_tail is not None:
                note += f"; /metrics stale after {rel(self.last_fresh)}"
                if load_end is not None and self.last_fresh is not None:
                    note += f" ({load_end - self.last_fresh:.0f}s before the load ended)"
            gaps = [sp for sp in spans if sp.get("to") is not None]
            if gaps:
                note += f"; {len(gaps)} stale span(s) in between (counters bridge them, rates inside them are unknown)"
            if self.last_error:
                note += f"; last error: {self.last_error}"
        return {
            "scrapes": {"fresh": self.ok, "failed_or_empty": self.failed},
            "covered_from": self.first_fresh,
            "covered_to": self.last_fresh,
            "stale_after": stale_tail.get("from") if stale_tail is not None else None,
            "stale_spans": spans,
            "complete": complete,
            "stale_after_s": self.stale_after_s,
            "note": note,
        }


# incident.json's record: the event's fields, and those only the record carries
INCIDENT_RECORD_TYPES = {**EVENT_TYPES, "diagnosis": is_str, "onset_earliest_at": is_timestamp,
                         "onset_latest_at": is_timestamp}


def _status(value: Any) -> str:
    return value[:40] if isinstance(value, str) else "unknown"


def disk_incidents(run_dir: Path) -> list[dict[str, Any]]:
    """The responder's ``incidents/N/incident.json`` as summary entries: the final
    record once the response finished, else what the decision said (a response
    still under way, or cut off with the harness)."""
    out: list[dict[str, Any]] = []
    for child in RunDir(run_dir).incident_dirs():
        obj = read_json(child / "incident.json")
        number = int(child.name)
        entry: dict[str, Any] = {"number": number, "evidence": f"incidents/{child.name}"}
        if isinstance(obj, dict):
            record = obj.get("record")
            record = typed_fields(record, INCIDENT_RECORD_TYPES) if isinstance(record, dict) else record
            decision = obj.get("decision") if isinstance(obj.get("decision"), dict) else {}
            decision = typed_fields(decision, {**EVENT_TYPES, "decided_at": is_timestamp})
            if isinstance(record, dict):
                entry.update({k: record.get(k) for k in (*INCIDENT_FIELDS, "summary", "gpu_free_s", "diagnosis",
                                                  "onset_earliest_at", "onset_latest_at")})
            else:
                entry.update({
                    "kind": decision.get("kind"), "rule": decision.get("rule"),
                    "onset_at": decision.get("onset_at"), "detected_at": decision.get("decided_at"),
                    "killed_pids": [], "gpus_released": False, "gpu_free_s": None,
                    "summary": f"response not finished (status {_status(obj.get('status'))})",
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
    for merged in by_number.values():
        merged["detection_latency_s"] = latency_json(merged)
    return sorted(by_number.values(), key=lambda e: e.get("number") if isinstance(e.get("number"), int) else 0)


def latency_json(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """summary.json's ``detection_latency_s`` of one incident (docs/detection.md):
    {min, max, point}, from the onset interval where the rule gave one, else the
    one onset estimate (point true); null with no onset or detection time."""
    latency = detection_latency(detected_at=entry.get("detected_at"), onset_at=entry.get("onset_at"),
                                onset_earliest_at=entry.get("onset_earliest_at"),
                                onset_latest_at=entry.get("onset_latest_at"))
    return None if latency is None else latency.to_json()
