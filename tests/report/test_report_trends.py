"""Trends in report.html as a person reads them: a value per window (a p99, a
rate) is drawn across its window, never as a slope from one window to the next
(two windows of a short run read as a long diagonal "trend"); where the server
was not read (killed and restarting, a probe that missed readings) the line
breaks; the bin a run ends in reads the rate, not a fall to the floor. Read off
the lines matplotlib was given (soak.report.plots) and off the pure series
functions (soak.report.series)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.report.plots import token_rates_figure, ttft_figure
from soak.report.rundir import RequestColumnsBuilder
from soak.report.series import bin_edges, broken, counter_rate, steps

START = 1_800_000_000.0


def _segments(x: np.ndarray, y: np.ndarray) -> list[tuple[float, float, float, float]]:
    """The drawn segments: consecutive points that are both finite."""
    return [(x[i], y[i], x[i + 1], y[i + 1]) for i in range(len(x) - 1)
            if np.isfinite([x[i], y[i], x[i + 1], y[i + 1]]).all()]


def _sloped(x: np.ndarray, y: np.ndarray) -> list[tuple[float, float, float, float]]:
    return [s for s in _segments(x, y) if s[0] != s[2] and s[1] != s[3]]


def _line(fig, label: str) -> tuple[np.ndarray, np.ndarray]:
    (line,) = [ln for ln in fig.axes[0].lines if ln.get_label() == label]
    data = np.asarray(line.get_xydata(), dtype=float)
    return data[:, 0], data[:, 1]


def _requests(ended: np.ndarray, ttft: np.ndarray):
    builder = RequestColumnsBuilder()
    for t, v in zip(ended, ttft):
        builder.add({"outcome": "ok", "started_at": t - v - 0.01, "ended_at": t, "ttft_s": v})
    return builder.build()


def test_a_45_second_run_draws_its_two_ttft_windows_as_two_levels_not_a_diagonal() -> None:
    rng = np.random.default_rng(3)
    ended = START + np.sort(rng.uniform(0, 45, 900))
    ttft = np.where(ended < START + 30, 0.055, 0.048) * rng.uniform(0.2, 1.0, ended.size)
    fig = ttft_figure(_requests(ended, ttft), start=START, end=START + 45)
    x, y = _line(fig, "p99")
    assert not _sloped(x, y), "a p99 drawn as a slope between two windows"
    # each level spans its window (minutes), the last one ending with the run
    levels = sorted({round(v, 6) for v in y[np.isfinite(y)]})
    assert len(levels) == 2
    assert np.nanmin(x) == 0.0 and np.nanmax(x) == 0.75


def test_a_ttft_window_nobody_finished_in_is_a_break_in_the_line() -> None:
    ended = START + np.concatenate([np.linspace(1, 55, 300), np.linspace(125, 175, 300)])  # nothing in 60-120 s
    fig = ttft_figure(_requests(ended, np.full(ended.size, 0.02)), start=START, end=START + 180)
    x, y = _line(fig, "p50")
    drawn = [s for s in _segments(x, y)]
    assert drawn and not any(a < 2.0 and b > 1.0 for a, _, b, _ in drawn), "a line across two empty windows"
    assert np.isnan(x).any()


def _restart_night(rate: float, period: float, down: tuple[float, float], end: float):
    """A counter at ``rate`` tokens/s, read every ``period``, not read while the
    server was down, counting from zero again after the restart."""
    ts = np.arange(0, end + 1e-9, period)
    ts = ts[(ts < down[0]) | (ts > down[1])]
    values = np.where(ts < down[0], rate * ts, rate * (ts - down[1]))
    return START + ts, values


def test_a_restart_is_a_gap_in_the_servers_token_rate_and_the_last_bin_does_not_fall() -> None:
    down = (60.0, 80.0)
    server_ts, server_tokens = _restart_night(480.0, 1.0, down, 162.0)
    client_ts = START + np.arange(0, 162.01, 0.5)
    client_tokens = 480.0 * np.minimum(client_ts - START, down[0]) + 480.0 * np.clip(client_ts - START - down[1], 0, None)
    fig = token_rates_figure(server_ts, server_tokens, client_ts, client_tokens, start=START,
                             down=[(START + down[0], START + down[1])])
    x, y = _line(fig, "server: vllm:generation_tokens")
    assert not _sloped(x, y)
    lo, hi = down[0] / 60 + 0.1, down[1] / 60 - 0.1  # minutes, well inside the downtime
    assert not any(a < hi and b > lo for a, _, b, _ in _segments(x, y)), "the server drawn while it was down"
    finite = y[np.isfinite(y)]
    assert np.allclose(finite, 480.0, rtol=1e-6), "a bin read as less than the server made: a fake drop"
    assert np.nanmax(x) >= 162 / 60 - 1e-9  # drawn to the end, at the rate
    _, cy = _line(fig, "client: tokens received")
    assert np.nanmin(cy) == 0.0  # the client counted on: nothing arrived while the server was down


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(0, 1e6)), min_size=1, max_size=60),
       st.lists(st.tuples(st.floats(0, 300), st.floats(0.5, 60)), max_size=3))
def test_steps_hold_each_value_across_its_bin_and_break_at_every_empty_bin_and_restart(
        raw: list[float | None], spans: list[tuple[float, float]]) -> None:
    values = np.array([np.nan if v is None else v for v in raw])
    edges = np.arange(len(values) + 1, dtype=float) * 5.0
    cut = [(a, a + length) for a, length in spans]
    x, y = steps(edges, values, cut=cut)
    assert not _sloped(x, y)
    segments = _segments(x, y)
    for a, b in cut:
        assert not [s for s in segments if s[0] < b and s[2] > a and s[1] == s[3]], "a line across a restart"
    for i, v in enumerate(values):
        inside = [s for s in segments if s[0] < edges[i + 1] and s[2] > edges[i]]
        if np.isnan(v):
            assert not inside, f"a line through empty bin {i}"
        # every stretch of the bin no restart took is drawn at the bin's value
        for x0 in np.linspace(edges[i], edges[i + 1], 7)[1:-1]:
            if np.isfinite(v) and not any(a <= x0 <= b for a, b in cut):
                assert any(s[0] <= x0 <= s[2] and s[1] == s[3] == v for s in inside)


@settings(max_examples=100, deadline=None)
@given(rate=st.floats(1.0, 1e5), period=st.sampled_from([0.5, 1.0, 2.0]),
       down_at=st.floats(10.0, 200.0), down_for=st.floats(1.0, 120.0), end_extra=st.floats(5.0, 300.0),
       width=st.sampled_from([5.0, 10.0, 30.0, 60.0]))
def test_a_counter_rate_is_the_rate_wherever_it_is_drawn_and_absent_where_the_server_was_not_read(
        rate: float, period: float, down_at: float, down_for: float, end_extra: float, width: float) -> None:
    down = (down_at, down_at + down_for)
    end = down[1] + end_extra
    ts, values = _restart_night(rate, period, down, end)
    spans = [(START + down[0], START + down[1])]
    edges = bin_edges(ts[0], ts[-1], max_columns=240, min_width_s=width)
    got = counter_rate(ts, values, edges, down=spans)
    finite = got[np.isfinite(got)]
    assert finite.size and np.allclose(finite, rate, rtol=1e-6)
    for i in range(len(edges) - 1):
        if edges[i] >= START + down[0] + period and edges[i + 1] <= START + down[1] - period:
            assert np.isnan(got[i]), "a rate drawn for a bin the server was down for the whole of"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.1, 30.0), min_size=3, max_size=80))
def test_a_line_of_readings_never_spans_a_gap_of_three_periods(steps_s: list[float]) -> None:
    ts = START + np.cumsum(steps_s)
    limit = 3 * float(np.median(np.diff(ts)))
    x, y = broken(ts, np.ones(ts.size))
    for a, _, b, _ in _segments(x, y):
        assert b - a <= limit



def _steady(rate: float, period: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    t = np.arange(n) * period
    return t, rate * t


@settings(max_examples=100, deadline=None)
@given(rate=st.floats(1.0, 1e5), period=st.sampled_from([0.25, 0.5]), n=st.integers(20, 200),
       width=st.sampled_from([5.0, 10.0]))
def test_timestamps_rounded_to_the_second_still_give_the_rate_not_infinity(
        rate: float, period: float, n: int, width: float) -> None:
    """A sampler faster than its timestamps' resolution: most steps are 0 s. The
    period is read from the steps that moved, so no bin divides by zero."""
    mono, values = _steady(rate, period, n)
    ts = START + np.floor(mono)
    edges = bin_edges(ts[0], ts[-1], max_columns=240, min_width_s=width)
    got = counter_rate(ts, values, edges)
    assert not np.isinf(got).any()
    # bins clear of the rounded first and last second: a rounded edge there moves a share of a bin
    inner = got[(edges[:-1] >= ts[0] + 1) & (edges[1:] <= ts[-1] - 1)]
    assert np.isfinite(inner).all() and np.allclose(inner, rate, rtol=0.25)
    assert np.allclose(counter_rate(ts, values, edges, mono=mono)[np.isfinite(got)], rate, rtol=1e-6)


@settings(max_examples=100, deadline=None)
@given(rate=st.floats(1.0, 1e5), period=st.sampled_from([0.5, 1.0, 2.0]), n=st.integers(10, 150),
       step_at=st.floats(0.1, 0.9), step_s=st.floats(-600.0, 600.0), seed=st.integers(0, 2**32 - 1))
def test_a_wall_clock_step_and_reading_order_change_no_rate_when_readings_carry_mono(
        rate: float, period: float, n: int, step_at: float, step_s: float, seed: int) -> None:
    """Time is monotonic; the wall clock only labels. A step of the wall clock
    (back or forward) mid-run, and readings handed over in any order, give the
    same steady rate everywhere: no spike, no hole."""
    mono, values = _steady(rate, period, n)
    ts = START + mono
    ts[int(step_at * n):] += step_s
    shuffle = np.random.default_rng(seed).permutation(n)
    edges = bin_edges(START, START + mono[-1], max_columns=240, min_width_s=5.0)
    got = counter_rate(ts[shuffle], values[shuffle], edges, mono=mono[shuffle])
    finite = got[np.isfinite(got)]
    assert finite.size and np.allclose(finite, rate, rtol=1e-6)
    # every bin fully inside the read span has its rate
    inside = (edges[:-1] >= START) & (edges[1:] <= START + mono[-1])
    assert np.isfinite(got[inside]).all()


@settings(max_examples=100, deadline=None)
@given(rate=st.floats(1.0, 1e5), period=st.sampled_from([0.5, 1.0]), n=st.integers(10, 150),
       step_at=st.floats(0.1, 0.9), back_s=st.floats(1.01, 600.0))
def test_a_wall_clock_stepped_back_is_no_spike_in_recorded_order(
        rate: float, period: float, n: int, step_at: float, back_s: float) -> None:
    """Readings without mono stay in the order recorded (the store appends in
    time order): a step back of the wall clock is one reading period, not time
    running backwards, so the rate stays the rate."""
    mono, values = _steady(rate, period, n)
    ts = START + mono
    ts[int(step_at * n):] -= back_s + period  # visibly backwards: a smaller step reads as jitter
    edges = bin_edges(START, START + mono[-1], max_columns=240, min_width_s=5.0)
    got = counter_rate(ts, values, edges)
    finite = got[np.isfinite(got)]
    assert finite.size and np.allclose(finite, rate, rtol=1e-6)
