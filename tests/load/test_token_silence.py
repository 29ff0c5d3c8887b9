"""The client sample dates the newest generated token (issue 37): the detector times a stop
from it, not from the next half-second probe."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from soak.load.progress import ProgressTracker


def test_no_token_yet_says_none_and_keep_alives_do_not_count():
    tracker = ProgressTracker()
    _, stream = tracker.open(10.0)
    stream.received(10.5, 20)  # a role chunk or ": ping": bytes, not a token
    assert tracker.snapshot(1000.0, 11.0).token_silence_s is None


def test_the_newest_token_of_any_stream_counts_even_one_that_ended():
    tracker = ProgressTracker()
    a_id, a = tracker.open(0.0)
    _, b = tracker.open(0.0)
    a.generated(2.0, 1)
    b.generated(1.0, 1)
    tracker.close(a_id)  # its last token (2.0) is still the newest
    sample = tracker.snapshot(1000.0, 2.75)
    assert sample.token_silence_s == 0.75
    b.generated(2.5, 1)
    assert tracker.snapshot(1000.0, 2.75).token_silence_s == 0.25


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0.0, 100.0)), min_size=1, max_size=30))
def test_silence_is_the_time_since_the_newest_token(events):
    tracker = ProgressTracker()
    streams = [tracker.open(0.0) for _ in range(4)]
    for which, at in sorted(events, key=lambda e: e[1]):  # a stream's clock runs forward
        streams[which][1].generated(at, 1)
    newest = max(at for _, at in events)
    tracker.close(streams[0][0])
    assert tracker.snapshot(0.0, 200.0).token_silence_s == 200.0 - newest
