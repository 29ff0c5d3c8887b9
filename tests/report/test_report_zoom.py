"""The incident zoom and the night-long heatmap on data (soak.report.zoom,
soak.report.series): what the picture would show, read from the numbers and
the SVG the pure functions return."""

from __future__ import annotations

import re

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.report.series import dark_beside_busy, heatmap_grid, stage_columns
from soak.report.zoom import downtimes, zoom_data, zoom_svg

PERIOD = 0.5


def _healthy(n: int, stages: int, rng: np.random.Generator) -> np.ndarray:
    """The simulator's instant readings under load: every stage 0, 60 or 100% together."""
    level = rng.choice([0.0, 60.0, 100.0], size=n)
    return np.repeat(level[:, None], stages, axis=1)


def _stall(util: np.ndarray, first: int, last: int) -> np.ndarray:
    out = util.copy()
    out[first:last, :-1] = 100.0
    out[first:last, -1] = 0.0
    return out


def test_a_3_5_second_dark_tail_on_a_66_minute_night_survives_binning_and_healthy_load_is_no_barcode() -> None:
    rng = np.random.default_rng(7)
    n = int(66 * 60 / PERIOD)
    ts = np.arange(n) * PERIOD
    at = int(2000 / PERIOD)
    util = _stall(_healthy(n, 8, rng), at, at + 7)  # 3.5 s: 7 readings
    edges, mean, dark = heatmap_grid(ts, util, max_columns=240, min_width_s=2.0, dark_pct=10, busy_pct=90, hold_s=3.0)
    assert len(edges) - 1 <= 241
    marked = np.argwhere(dark)
    assert {int(r) for r, _ in marked} == {7}  # only the tail's row, and it is marked
    column = int(marked[0][1])
    assert edges[column] <= 2000 < edges[column + 1] or edges[column] <= 2003.5 < edges[column + 1]
    # healthy load averages out: the columns' means spread a sixth of what the readings jump (0/60/100)
    healthy = np.delete(mean[0], column)
    assert np.nanstd(healthy) < np.std(util[:, 0]) / 5 and 45 < np.nanmean(healthy) < 75


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=2**31 - 1), st.integers(min_value=2, max_value=8))
def test_healthy_load_that_moves_every_stage_together_marks_no_stage(seed: int, stages: int) -> None:
    util = _healthy(400, stages, np.random.default_rng(seed))
    assert not dark_beside_busy(util, busy_pct=90, dark_pct=10).any()


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=390), st.integers(min_value=2, max_value=12))
def test_a_tail_dark_for_two_readings_or_more_is_marked_on_every_one_of_them(first: int, length: int) -> None:
    util = _stall(np.full((400, 4), 60.0), first, first + length)
    marks = dark_beside_busy(util, busy_pct=90, dark_pct=10)
    stalled = min(first + length, 400) - first
    assert marks[:, 3].sum() == (stalled if stalled >= 2 else 0) and not marks[:, :3].any()


def test_a_pipeline_bubble_shorter_than_the_hold_and_the_harness_restart_mark_nothing() -> None:
    ts = np.arange(600) * PERIOD
    util = _stall(np.full((600, 4), 60.0), 100, 104)  # 2 s: a long bubble, under the detector's 3 s
    util = _stall(util, 400, 440)  # 20 s inside the restart: the new server's start-up, tail idle
    _, _, dark = heatmap_grid(ts, util, max_columns=100, min_width_s=2.0, dark_pct=10, busy_pct=90, hold_s=3.0,
                              quiet=[(195.0, 225.0)])
    assert not dark.any()


def test_one_dark_reading_is_a_blip_not_a_mark() -> None:
    util = _stall(np.full((50, 4), 60.0), 20, 21)
    assert not dark_beside_busy(util, busy_pct=90, dark_pct=10).any()


def test_a_stage_is_its_busiest_gpu() -> None:
    util = np.array([[0.0, 90.0, 10.0, np.nan], [np.nan, np.nan, 5.0, 7.0]])
    got = stage_columns(util, ((0, 1), (2, 3)))
    assert got[0].tolist() == [90.0, 10.0] and np.isnan(got[1, 0]) and got[1, 1] == 7.0


def _zoom_of_a_hang(*, rounded: bool = False):
    onset = 1000.0
    ts = np.arange(900.0, 1100.0, PERIOD)
    util = np.full((ts.size, 4), 80.0)
    stuck = (ts >= onset) & (ts < onset + 4)
    util[stuck, :3], util[stuck, 3] = 100.0, 0.0
    gone = (ts >= onset + 4) & (ts < onset + 12)  # killed: no readings until the restart
    ts, util = ts[~gone], util[~gone]
    if rounded:  # a sampler faster than its timestamps' resolution: half the steps are 0 s
        ts = np.floor(ts)
    server_ts = np.arange(900.0, 1100.0, 1.0)
    generation = np.cumsum(np.where((server_ts >= onset) & (server_ts < onset + 12), 0.0, 50.0))
    running = np.where(server_ts >= onset, 3.0, 2.0)
    return zoom_data(number=1, onset=onset, detected=onset + 3.5, stage_ts=ts, stage_util=util,
                     server_ts=server_ts, generation=generation, running=running,
                     downtime=[(onset + 3.5, onset + 12)], span_s=60)


def test_the_zoom_cuts_a_minute_either_side_and_breaks_the_lines_where_the_server_was_down() -> None:
    zoom = _zoom_of_a_hang()
    tail = zoom.stages[3]
    assert len(tail) == 2  # before the kill, after the restart: no line drawn across the gap
    assert all(-60 <= t <= 60 for line in tail for t, _ in line)
    assert [v for t, v in tail[0] if 0 <= t < 4] == [0.0] * 8
    assert zoom.detected_s == 3.5 and zoom.downtime == ((3.5, 12.0),)
    rates = [v for line in zoom.tokens for t, v in line]
    assert max(rates) == 50.0 and min(rates) == 0.0


def test_timestamps_rounded_to_the_second_still_draw_lines_not_dots() -> None:
    tail = _zoom_of_a_hang(rounded=True).stages[3]
    assert len(tail) == 2  # before the kill, after the restart, as with exact timestamps


def test_the_svg_shows_the_tail_at_zero_after_the_onset_and_says_where_zero_is() -> None:
    svg = zoom_svg(_zoom_of_a_hang())
    y0 = float(re.search(r"data-y0='([\d.]+)'", svg).group(1))
    y100 = float(re.search(r"data-y100='([\d.]+)'", svg).group(1))
    x_onset = float(re.search(r"data-x-onset='([\d.]+)'", svg).group(1))
    x_detect = float(re.search(r"data-x-detected='([\d.]+)'", svg).group(1))
    paths = dict(re.findall(r"<path data-stage='(\d)' d='([^']*)'", svg))
    assert sorted(paths) == ["0", "1", "2", "3"]

    def between(d: str) -> set[float]:
        return {float(y) for x, y in re.findall(r"([\d.]+),([\d.]+)", d) if x_onset <= float(x) <= x_detect}

    assert between(paths["3"]) == {y0} and between(paths["0"]) == {y100}
    assert paths["3"].count("M ") == 2
    assert "class='downtime'" in svg and "class='onset'" in svg and "class='detected'" in svg


def test_downtime_runs_from_the_decision_to_the_restart_or_the_end() -> None:
    events = [{"type": "incident", "ts": 10.0, "number": 1, "detected_at": 9.5},
              {"type": "restart_done", "ts": 15.0, "number": 1},
              {"type": "incident", "ts": 30.0, "number": 2, "detected_at": 30.0}]
    assert downtimes(events, end=31.0) == {1: (9.5, 15.0), 2: (30.0, 31.0)}


def test_a_hostile_unit_label_is_escaped() -> None:
    zoom = _zoom_of_a_hang()
    svg = zoom_svg(type(zoom)(**{**zoom.__dict__, "unit": "<script>x</script>"}))
    assert "<script>" not in svg and "&lt;script&gt;" in svg


def test_the_stages_come_from_the_recorded_layout_or_one_a_column_where_it_does_not_fit() -> None:
    from soak.report.rundir import stage_layout

    tp2 = {"target": {"kind": "simulator", "pp_size": 4, "tp_size": 2}}
    assert stage_layout(tp2, 8, stage_cpu=False) == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert stage_layout(tp2, 6, stage_cpu=False) == tuple((i,) for i in range(6))  # not the GPUs that were read
    assert stage_layout(tp2, 4, stage_cpu=True) == ((0,), (1,), (2,), (3,))
    assert stage_layout({"target": {"kind": "nonsense"}}, 2, stage_cpu=False) == ((0,), (1,))
