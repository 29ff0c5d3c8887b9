"""How the sequential evidence dates progress (issue 37): a client token when it arrived, a
scrape's move at its own time until a later scrape shows the counters still."""

from __future__ import annotations

import math

from hypothesis import given, settings, strategies as st

from soak.detect import DetectorConfig
from soak.detect.signals import SignalTracker
from soak.records import Topology
from soak.samples import ClientSample, ServerSample


def tracker() -> SignalTracker:
    s = SignalTracker(DetectorConfig(), Topology.pipeline(8))
    s.reset(0.0)
    return s


def client(ts, tokens, silence):
    return ClientSample(ts, 2, tokens * 10, tokens, 0, None, 2, token_silence_s=silence)


def server(ts, gen):
    return ServerSample(ts, True, {"generation_tokens": gen, "num_requests_running": 2.0})


def test_a_token_is_dated_when_it_arrived_not_when_the_probe_ran():
    s = tracker()
    s.observe(client(10.0, 5, 0.0))
    s.observe(client(10.5, 9, 0.4))  # the newest token came at 10.1
    assert math.isclose(s.alive_at, 10.1)
    # the window rules keep the probe's time, the one their goals were measured with
    assert s.last_progress_at == 10.5


def test_a_clock_stepped_back_follows_the_clock():
    s = tracker()
    s.observe(client(1000.0, 5, 0.0))
    s.observe(client(1000.5, 9, 0.0))
    s.observe(client(400.0, 12, 0.1))  # NTP stepped the wall clock back ten minutes
    assert s.alive_at <= 400.0  # not stuck in the future until the clock catches up


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.floats(-1e9, 1e9),
                 st.text(max_size=3), st.booleans(), st.lists(st.integers(), max_size=2)))
def test_a_hostile_silence_never_dates_a_token_outside_the_probe_gap(silence):
    s = tracker()
    s.observe(client(10.0, 5, 0.0))
    s.observe(client(10.5, 9, silence))
    assert 10.0 <= s.alive_at <= 10.5


def test_a_stopped_engine_moves_once_then_its_move_dates_to_the_scrape_before():
    s = tracker()
    s.observe(server(10.0, 100.0))
    s.observe(server(11.0, 130.0))  # moving: alive as late as this scrape
    assert s.alive_at == 11.0
    s.observe(server(12.0, 150.0))  # the scrape after a stop carries the last step
    assert s.alive_at == 12.0
    s.observe(server(13.0, 150.0))  # still: the move came some time after 11.0
    assert s.alive_at == 11.0
    s.observe(server(14.0, 151.0))  # moving again
    assert s.alive_at == 14.0


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["generation_tokens", "kv_cache_usage_perc", "prompt_tokens", "num_requests_running"]),
       st.sampled_from([float("nan"), float("inf"), float("-inf"), "x", None, True]))
def test_a_junk_metric_value_is_missing_never_a_move(key, junk):
    """A NaN never equals itself: read as a number it moved every scrape, and a hung server
    looked alive for ever (a review found it: the sequential rule never fired)."""
    s = tracker()
    s.observe(server(10.0, 100.0))
    s.observe(server(11.0, 130.0))
    s.observe(server(12.0, 130.0))  # still: dated at the scrape before the move
    for k in range(3):
        sample = ServerSample(13.0 + k, True, {"generation_tokens": 130.0, "num_requests_running": 2.0, key: junk})
        s.observe(sample)
    assert s.alive_at == 10.0
