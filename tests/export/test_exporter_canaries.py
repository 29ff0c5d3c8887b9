"""The oracle's canaries on the exporter, scraped over real HTTP on loopback: one counter
series a verdict (there at 0 from the start, so increase() sees the first corrupt canary),
the measured share of server time, and a corruption incident under its own kind."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from soak.clock import ManualClock
from soak.export.config import ExporterConfig
from soak.export.exporter import Exporter
from soak.records import IncidentKind, IncidentRecord
from soak.samples import CanarySample, CanaryVerdict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_exporter import T0, make_exporter, scrape, value  # noqa: E402,F401 (the fixture and the scrape)


def canary(verdict: str, *, share: float | None = 0.004, ts: float = T0) -> CanarySample:
    return CanarySample(ts=ts, canary_id="c2", verdict=verdict, share=share)


def test_canaries_by_verdict_and_their_share(make_exporter):
    exporter = make_exporter()
    scraped = scrape(exporter)
    assert all(value(scraped, "soak_canaries_total", verdict=v.value) == 0 for v in CanaryVerdict)
    for verdict, share in (("match", 0.003), ("match", 0.004), ("explained", 0.005), ("corrupt", 0.006)):
        exporter.on_sample(canary(verdict, share=share))
    exporter.on_incident(IncidentRecord(number=1, kind=IncidentKind.CORRUPTION, rule="corruption", onset_at=T0 - 20,
                                        detected_at=T0, killed_pids=(), gpus_released=None, gpu_free_s=None,
                                        evidence="incidents/1", summary="canary c2 diverged", reasons=()))
    scraped = scrape(exporter)
    assert value(scraped, "soak_canaries_total", verdict="match") == 2
    assert value(scraped, "soak_canaries_total", verdict="explained") == 1
    assert value(scraped, "soak_canaries_total", verdict="corrupt") == 1
    assert value(scraped, "soak_canary_share_ratio") == 0.006
    assert value(scraped, "soak_incidents_total", kind="corruption", rule="corruption") == 1


@settings(max_examples=60, deadline=None)
@given(verdicts=st.lists(st.sampled_from([v.value for v in CanaryVerdict]) | st.text(max_size=10), max_size=20),
       share=st.none() | st.floats(allow_nan=True, allow_infinity=True))
def test_any_canary_counts_once_under_a_known_verdict(verdicts, share):
    exporter = Exporter(ExporterConfig(port=0), registry=CollectorRegistry(), clock=ManualClock(T0))
    for v in verdicts:
        exporter.on_sample(canary(v, share=share))
    registry = exporter._registry
    known = {v.value for v in CanaryVerdict}
    counted = {v: registry.get_sample_value("soak_canaries_total", {"verdict": v}) for v in known}
    assert sum(counted.values()) == len(verdicts)  # an unknown verdict is counted as unjudged, never a new series
    assert counted["unjudged"] == sum(1 for v in verdicts if v not in known or v == "unjudged")
    got = registry.get_sample_value("soak_canary_share_ratio")
    assert got == (share if share is not None and 0 <= share <= 1 and verdicts else 0.0)
