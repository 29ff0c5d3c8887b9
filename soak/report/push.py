"""Results pushed to a Prometheus Pushgateway: the night at the end of a run
(``push_run``), each build's pooled figures from ``soak history`` (``push_history``).

Each push builds its gauges in a ``CollectorRegistry`` of its own (never the
global one, never the live exporter's) from the names in
``soak.export.names.PUSHED_METRICS``, and replaces its group (prometheus_client's
``push_to_gateway``: HTTP PUT), so a night that is pushed again reads the same.
The grouping key is the configured labels plus ``build``: one group per box and
build keeps every build's last night beside the others.

A night's exposure, hangs and MTBF bound are its time at risk (``soak.exposure``,
read from its events), the one definition report.html and ``soak history`` use:
the nights dashboard's hangs per hour of exposure then agrees with both, where
the seconds of load (``duration_s``) counted the time a hung server sat waiting
for its kill and restart as time at risk.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from prometheus_client import CollectorRegistry, Gauge, Info
from prometheus_client.exposition import push_to_gateway

from soak.exposure import at_risk
from soak.export.names import PUSHED_METRICS, Kind
from soak.net import push_handler  # a 3xx is RedirectRefused, never followed; the whole call bounded
from soak.records import IncidentKind, Verdict
from soak.standing import pushed_fixed
from soak.summary_file import RunSummary
from soak.thresholds.metrics import run_value

# Keys are str enums: summary.json's "pass" finds Verdict.PASS.
VERDICT_VALUES = {Verdict.PASS: 0, Verdict.FAIL: 1, Verdict.ABORTED: 2}


class _Families:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._made: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._made:
            spec = PUSHED_METRICS[name]
            if spec.kind is Kind.INFO:  # its "labels" are the info's keys, set by .info()
                self._made[name] = Info(name, spec.help, registry=self.registry)
            else:
                self._made[name] = Gauge(name, spec.help, spec.labels, registry=self.registry)
        return self._made[name]

    def set(self, name: str, value: Any, **labels: str) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            return  # unknown or unbounded: absent, never a fake number
        family = self[name]
        (family.labels(**labels) if labels else family).set(float(value))


def night_families(summary: RunSummary, *, exit_code: int | None, confidence: float,
                   events: Sequence[Mapping[str, Any]] | None = None) -> _Families:
    """The night's gauges; ``events``: its events.jsonl, for its time at risk.
    Without them (None or none read) the summary stands in: its seconds of load
    (``soak.exposure``) and its hang incidents, never a silent 0 hangs.

    ``soak_night_hangs`` is the MTBF's count: hangs that ended a stretch of time
    at risk, as report.html and ``soak history`` count them.
    ``soak_night_incidents{kind="hang"}`` is every hang the summary records; the
    two differ only where a second hang was decided while the first was being
    handled (no restart between: no time at risk to end), so hangs <= incidents."""
    from soak.report.stats import mtbf_estimate

    f = _Families()
    build = summary.build_entry
    verdict = summary.verdict.value if summary.verdict is not None else "None"
    f["soak_night"].info({"run": summary.run_id or "", "build_label": (build and build.label) or "",
                          "vllm_version": (build and build.vllm_version) or "",
                          "launch_digest": (build and build.launch_digest) or "", "verdict": verdict})
    f.set("soak_night_verdict", VERDICT_VALUES.get(summary.verdict, 2))
    f.set("soak_night_exit_code", exit_code if exit_code is not None else summary.exit_code)
    f.set("soak_night_start_time_seconds", summary.started_at)
    risk = at_risk(events or (), summary)
    f.set("soak_night_exposure_seconds", risk.exposure_s)
    incidents = summary.incidents
    for kind in (*(k.value for k in IncidentKind), *{str(i.kind) for i in incidents}):
        f.set("soak_night_incidents", sum(1 for i in incidents if i.kind == kind), kind=kind)
    # No events: at_risk sees one clean stretch of load, so the summary counts the hangs.
    hangs = risk.hangs if events else sum(1 for i in incidents if i.kind == IncidentKind.HANG.value)
    f.set("soak_night_hangs", hangs)
    if risk.exposure_s > 0:
        f.set("soak_night_mtbf_lower_bound_seconds",
              mtbf_estimate(hangs, risk.exposure_s, confidence=confidence).one_sided_lower_s)
    f.set("soak_night_output_tokens_per_second", run_value("output_tokens_per_s", summary))
    for q in ("p50", "p99"):
        quantile = "0.5" if q == "p50" else "0.99"
        f.set("soak_night_ttft_seconds", run_value(f"ttft_{q}", summary), quantile=quantile)
        f.set("soak_night_tpot_seconds", run_value(f"tpot_{q}", summary), quantile=quantile)
    f.set("soak_night_prefix_hit_ratio", run_value("prefix_hit_ratio", summary))
    if summary.thresholds is not None:
        f.set("soak_night_thresholds_breached", len(summary.thresholds.breached))
    return f


def _grouping(grouping: Mapping[str, str], build: str | None, add_build: bool) -> dict[str, str]:
    out = dict(grouping)
    if add_build and build and "build" not in out:
        out["build"] = build
    return out


def push_run(config: Any, summary: RunSummary | Mapping[str, Any], *, exit_code: int | None = None,
             run_dir: str | Path | None = None) -> dict[str, Any]:
    """Push the night (config: a PushgatewayConfig with a url). Returns what was
    pushed where, for the ``pushed`` event; raises what the push raised.
    ``summary``: the typed record, or summary.json as parsed (read through it);
    ``run_dir``: the run directory, whose events give the time at risk."""
    from soak.store.rundir import RunDir

    summary = RunSummary.of(summary)
    build = summary.build_entry
    grouping = _grouping(config.grouping, build.key if build is not None else None, config.build_label)
    events = list(RunDir(Path(run_dir)).events()) if run_dir is not None else None
    families = night_families(summary, exit_code=exit_code, confidence=config.confidence, events=events)
    push_to_gateway(config.url, job=config.job, registry=families.registry, grouping_key=grouping,
                    timeout=config.timeout, handler=push_handler(config.timeout))
    return {"job": config.job, "grouping": grouping}


def build_families(history: Any) -> list[tuple[str, _Families]]:
    """Each build's gauges, in the history's order: pooled exposure, hangs, MTBF, and its one
    verdict (soak.history.verdict, as the terminal and history.html say it): the standing as
    ``soak_build_fixed`` and the sentence as ``soak_build_verdict_info``. ``history`` is a
    ``soak.history.model.History`` (not imported: history imports this module)."""
    tests = {t.b: t for t in history.rate_tests}
    out = []
    for b in history.builds:
        f = _Families()
        f.set("soak_build_runs", b.runs)
        f.set("soak_build_exposure_seconds", b.exposure_s)
        f.set("soak_build_hangs", b.hangs)
        if b.mtbf is not None:
            f.set("soak_build_mtbf_seconds", b.mtbf.point_s)
            f.set("soak_build_mtbf_lower_bound_seconds", b.mtbf.one_sided_lower_s)
            f.set("soak_build_mtbf_interval_seconds", b.mtbf.lower_s, bound="lower")
            f.set("soak_build_mtbf_interval_seconds", b.mtbf.upper_s, bound="upper")
        f.set("soak_build_fixed", pushed_fixed(b.standing))  # absent for the baseline and an unjudged build
        if b.verdict:
            f["soak_build_verdict"].info({"standing": b.standing, "sentence": b.verdict})
        if b.build in tests:
            f.set("soak_build_better_confidence", 1.0 - tests[b.build].p_b_lower)
        out.append((b.build, f))
    return out


def push_history(history: Any, *, url: str, job: str, grouping: Mapping[str, str], timeout: float = 10.0) -> None:
    """One group per build (``build`` added to ``grouping``): ``build_families``."""
    for build, f in build_families(history):
        push_to_gateway(url, job=job, registry=f.registry, grouping_key=_grouping(grouping, build, True),
                        timeout=timeout, handler=push_handler(timeout))
