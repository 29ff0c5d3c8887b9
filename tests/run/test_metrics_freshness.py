"""The /metrics freshness warning: said once when the server's counters stop
coming (three scrape intervals, 5 s at least), cleared once they are back."""

from __future__ import annotations

from soak.events import EventType
from soak.run.freshness import MetricsFreshness
from soak.samples import ServerSample

KEYS = ("prompt_tokens", "generation_tokens")


def _good(ts: float) -> ServerSample:
    return ServerSample(ts=ts, ok=True, values={"prompt_tokens": 1.0})


def _bad(ts: float, error: str | None = "connection refused") -> ServerSample:
    return ServerSample(ts=ts, ok=False, error=error)


def _said(samples, interval=1.0):
    watch = MetricsFreshness(metrics_interval_s=interval, server_keys=KEYS)
    return [(s.ts, change[0], change[1]) for s in samples if (change := watch.observe(s)) is not None]


def test_a_short_gap_is_not_stale():
    assert _said([_good(0), _bad(1), _bad(4.9), _good(5)]) == []


def test_stale_once_then_fresh_once():
    said = _said([_good(0), _bad(2), _bad(5), _bad(6), _bad(9), _good(10), _good(11)])
    assert [(ts, t) for ts, t, _ in said] == [(5, EventType.METRICS_STALE), (10, EventType.METRICS_FRESH)]
    assert said[0][2]["since"] == 0 and said[0][2]["error"] == "connection refused"
    assert said[1][2] == {"stale_since": 0, "stale_s": 10}


def test_a_scrape_without_the_counters_counts_as_missing():
    empty = ServerSample(ts=0, ok=True, values={"unrelated": 1.0})
    said = _said([empty])
    assert said[0][1] is EventType.METRICS_STALE and said[0][2]["since"] is None  # never fresh: stale from the start
    assert said[0][2]["error"] == "the scrape has none of the server counters"


def test_a_slow_scrape_interval_waits_three_intervals():
    assert _said([_good(0), _bad(20)], interval=10.0) == []
    assert _said([_good(0), _bad(30)], interval=10.0)[0][1] is EventType.METRICS_STALE
