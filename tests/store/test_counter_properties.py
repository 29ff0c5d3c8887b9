"""Counters like Prometheus (CONTRACTS.md): generated counter series with
arbitrary resets and decreases, generated mixes of accepted and rejected
requests, generated response orders for the cached-token flag."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soak.samples import RequestRecord
from soak.counters import CounterDelta, counter_increase, increases
from soak.judge import summarize
from soak.samples import server_accepted
from soak.thresholds.metrics import window_values
from soak.versions import CachedTokensReader, profile_for

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

readings = st.lists(st.integers(min_value=0, max_value=10**9), min_size=0, max_size=40)


def prometheus_increase(values: list[float]) -> float:
    """Prometheus' own formulation (promql extrapolatedRate, no extrapolation):
    last - first, plus the reading before every drop."""
    if len(values) < 2:
        return 0.0
    total = values[-1] - values[0]
    for prev, cur in zip(values, values[1:]):
        if cur < prev:
            total += prev
    return total


@SETTINGS
@given(readings)
def test_the_increase_is_prometheus_increase(values) -> None:
    delta = counter_increase(values)
    assert delta.total == pytest.approx(prometheus_increase(values))
    assert delta.resets == sum(1 for a, b in zip(values, values[1:]) if b < a)
    assert delta.total >= 0
    # never more than a monotone reconstruction allows: each span split at a drop
    # counted from 0 (after the first) up to its last reading
    spans, bound, start = [], 0.0, values[0] if values else 0
    for prev, cur in zip(values, values[1:]):
        if cur < prev:
            spans.append(prev)
    bound = (values[-1] if values else 0) + sum(spans) - start
    assert delta.total <= bound + 1e-6
    assert sum(increases(values)) == pytest.approx(delta.total)


@SETTINGS
@given(st.lists(st.tuples(st.integers(min_value=0, max_value=10**6), st.booleans()), min_size=1, max_size=40),
       st.integers(min_value=0, max_value=10**6))
def test_a_counter_that_restarts_is_reconstructed_exactly(steps, before) -> None:
    """A real counter: it gains ``gain`` between scrapes, and restarts from 0 right
    after a scrape when ``restart``. The reconstruction never overstates what it
    gained, and equals it when every restart shows (reads below the reading before;
    a restart that climbed back past the old value by the next scrape is invisible
    to any reader)."""
    value, seen, visible = before, [before], True
    for gain, restart in steps:
        previous = value
        if restart:
            value = 0
        value += gain
        if restart and value >= previous:
            visible = False
        seen.append(value)
    delta = counter_increase(seen)
    gained = sum(gain for gain, _ in steps)
    assert delta.total <= gained
    if visible:
        assert delta.total == gained
        assert delta.resets == sum(1 for _, restart in steps if restart)


@SETTINGS
@given(st.lists(st.one_of(st.integers(min_value=0, max_value=1000), st.just(float("nan")), st.just(-5.0),
                          st.just(float("inf")), st.just(True), st.just("12"), st.none()), max_size=30))
def test_what_is_no_reading_is_skipped(values) -> None:
    delta = counter_increase(values)
    valid = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    assert delta.total == pytest.approx(prometheus_increase(valid))
    assert math.isfinite(delta.total)


@SETTINGS
@given(st.lists(st.tuples(st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=10**6)),
                max_size=30))
def test_the_windowed_hit_ratio_reads_counters_the_same_way(pairs) -> None:
    server = [(float(i), {"prefix_cache_hits": h, "prefix_cache_queries": q}) for i, (h, q) in enumerate(pairs)]
    hits = counter_increase([h for h, _ in pairs]).total
    queries = counter_increase([q for _, q in pairs]).total
    ratio = window_values([], server, span_s=1.0)["prefix_hit_ratio"]
    assert ratio == (pytest.approx(hits / queries) if queries > 0 else None)


# -- client tokens count only what the server accepted -------------------------

ACCEPTED_SHAPES = [("ok", 200), ("timeout_stall", 200), ("reset", 200), ("malformed_stream", 200),
                   ("aborted", 200), ("timeout_first_token", None), ("aborted", None)]
REJECTED_SHAPES = [("http_status", 503), ("http_status", 400), ("http_status", 429), ("refused", None),
                   ("reset", None), ("timeout_connect", None), ("http_status", 307)]


@st.composite
def request_mix(draw):
    out = []
    for i in range(draw(st.integers(min_value=0, max_value=30))):
        accepted = draw(st.booleans())
        outcome, status = draw(st.sampled_from(ACCEPTED_SHAPES if accepted else REJECTED_SHAPES))
        prompt = draw(st.integers(min_value=0, max_value=10**6))
        out.append((accepted, RequestRecord(
            request_id=f"r{i}", session=None, turn=None, started_at=100.0 + i, ended_at=101.0 + i, outcome=outcome,
            prompt_tokens=prompt, planned_prompt_tokens=prompt, output_tokens=3 if accepted else 0,
            http_status=status, warmup=draw(st.booleans()))))
    return out


@SETTINGS
@given(request_mix())
def test_prompt_tokens_are_those_the_server_accepted(tmp_path_factory, mix) -> None:
    run = tmp_path_factory.mktemp("run")
    (run / "requests.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for _, r in mix))
    summary = summarize(run)
    assert summary["tokens"]["prompt"] == sum(r.prompt_tokens for accepted, r in mix if accepted)
    assert all(server_accepted(r.to_json()) is accepted for accepted, r in mix)


# -- prompt_tokens_details: learned per server life ----------------------------

@SETTINGS
@given(st.lists(st.one_of(st.none(), st.integers(min_value=0, max_value=1000), st.just("restart")), max_size=30),
       st.sampled_from([None, False]))
def test_a_server_that_sent_details_this_life_has_the_flag_on(responses, configured) -> None:
    """Each response: None (details left out), N (details with N cached) or a restart."""
    reader = CachedTokensReader(profile=profile_for("0.11.2"), details_enabled=configured)
    seen = False
    for response in responses:
        if response == "restart":
            reader.restarted()
            seen = False
            continue
        usage = {"prompt_tokens": 10}
        if response is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": response}
        got = reader(usage)
        if response is not None:
            seen = True
            assert got == response
        else:
            assert got == (0 if seen else None)


def test_the_configured_flag_holds_without_learning() -> None:
    reader = CachedTokensReader(profile=profile_for("0.11.2"), details_enabled=True)
    assert reader({"prompt_tokens": 5}) == 0
    reader.restarted()
    assert reader({"prompt_tokens": 5}) == 0


def test_a_delta_counts_its_splits() -> None:
    delta = CounterDelta()
    for v in (10, 20, 5, 7, 7, 3):
        delta.add(v)
    assert (delta.total, delta.resets) == (10 + 5 + 2 + 3, 2)
