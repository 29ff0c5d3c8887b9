"""``format_latency``: one formatter for every latency a person reads (compare,
the report, the end of a run): us under a millisecond, ms under a second, else s,
three significant digits, trailing zeros dropped; never ``0.000651 s``."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.durations import format_latency
from soak.thresholds.expr import parse_condition

latencies = st.floats(min_value=1e-7, max_value=1e5, allow_nan=False, allow_infinity=False)
SHAPE = re.compile(r"^-?(\d+(\.\d+)?) (us|ms|s)$")


def parsed(text: str) -> float:
    """The formatted latency read back by the threshold parser (``< 651 us``)."""
    return parse_condition("ttft_p99", f"< {text}").value


@pytest.mark.parametrize("seconds, text", [
    (0.000651, "651 us"),
    (0.0000651, "65.1 us"),
    (0.00065, "650 us"),
    (0.0123, "12.3 ms"),
    (0.65, "650 ms"),
    (0.035, "35 ms"),
    (1.2, "1.2 s"),
    (0.0101, "10.1 ms"),
    (7.46, "7.46 s"),
    (65.2, "65.2 s"),
    (3600, "3600 s"),
    (0.00099996, "1 ms"),  # rounds up into the next unit, never "1000 us"
    (0.99996, "1 s"),
    (0, "0 s"),
    (-0.0123, "-12.3 ms"),
    (None, "\u2014"),
    (float("nan"), "\u2014"),
])
def test_table(seconds, text):
    assert format_latency(seconds) == text


@settings(max_examples=100, deadline=None)
@given(st.floats(min_value=1e-6, max_value=1e5))
def test_shape_unit_and_digits(seconds):
    text = format_latency(seconds)
    m = SHAPE.match(text)
    assert m, text
    number, unit = float(m.group(1)), m.group(3)
    assert "e" not in text and not text.startswith("0.0")
    # the unit is the largest the value reaches, so the number is under 1000 in us and ms
    if unit in ("us", "ms"):
        assert number < 1000
    if unit in ("ms", "s"):
        assert number >= 1 or seconds < 1e-3
    assert not (("." in m.group(1)) and m.group(1).endswith("0")), text


@settings(max_examples=100, deadline=None)
@given(latencies)
def test_round_trips_within_half_a_percent(seconds):
    assert parsed(format_latency(seconds)) == pytest.approx(seconds, rel=0.005, abs=5e-9)


@settings(max_examples=100, deadline=None)
@given(latencies, latencies)
def test_monotone_in_value(a, b):
    lo, hi = sorted((a, b))
    assert parsed(format_latency(lo)) <= parsed(format_latency(hi))
    same_unit = format_latency(lo).split()[1] == format_latency(hi).split()[1]
    if same_unit:
        assert float(format_latency(lo).split()[0]) <= float(format_latency(hi).split()[0])


def test_sub_millisecond_is_never_printed_in_seconds():
    assert format_latency(0.000651) != "0.000651 s" and format_latency(0.000651).endswith(" us")
