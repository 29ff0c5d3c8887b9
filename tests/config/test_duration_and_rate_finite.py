"""Durations and rates are finite and bounded: for any text or number,
``parse_duration`` returns seconds in [0, MAX_DURATION_S] (30 days) or raises
ValueError (the config loader's one line naming the field); NaN, infinity and
``99999999999999999999999h`` never reach the planner, whose loops they would
never end. An open-loop ``load.rate`` is finite and positive."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.config import load_run_config
from soak.durations import MAX_DURATION_S, duration_flag, parse_duration
from soak.errors import ArgumentError, ConfigError

ROOT = Path(__file__).resolve().parents[2]

numbers = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10**400, 10**400)
number_texts = (numbers.map(str) | st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "1e308",
                                                     "9" * 400, "99999999999999999999999"]))
duration_texts = st.one_of(
    number_texts,
    st.lists(st.tuples(number_texts.filter(lambda t: t.replace(".", "", 1).isdigit()),
                       st.sampled_from(["ms", "s", "m", "h", "d"])), min_size=1, max_size=4)
    .map(lambda parts: "".join(n + u for n, u in parts)),
    st.text(alphabet="0123456789.smhdnaif e+-", max_size=30),
)


@settings(max_examples=400, deadline=None)
@given(value=numbers | duration_texts)
def test_any_duration_is_finite_and_at_most_the_maximum_or_refused(value) -> None:
    try:
        seconds = parse_duration(value)
    except ValueError:
        return
    assert isinstance(seconds, float) and math.isfinite(seconds) and 0 <= seconds <= MAX_DURATION_S


@pytest.mark.parametrize("text", ["nan", "inf", "9" * 400 + "s", "1" * 320 + "ms", "inf" + "s"])
def test_a_flag_that_is_not_finite_is_an_argument_error(text) -> None:
    with pytest.raises(ArgumentError, match="--duration"):
        duration_flag(text)


@pytest.mark.parametrize("text", ["99999999999999999999999h", "31d", "720h1s"])
def test_a_duration_flag_past_the_maximum_is_refused_where_it_becomes_the_config(tmp_path, text) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("duration: 10s\n")
    seconds = duration_flag(text)  # a flag is only finite; --duration is the config's duration
    with pytest.raises(ConfigError, match="duration: a duration can be at most 30 days"):
        load_run_config(path, duration=seconds)


def test_thirty_days_is_allowed_and_a_second_more_is_not() -> None:
    assert parse_duration("30d") == MAX_DURATION_S
    with pytest.raises(ValueError, match="at most 30 days"):
        parse_duration("30d1s")


@pytest.mark.parametrize("value", [".nan", ".inf", "99999999999999999999999h", "1" + "0" * 400])
def test_a_config_duration_that_never_ends_is_a_config_error_naming_the_field(tmp_path, value) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"duration: {value}\n")
    with pytest.raises(ConfigError) as caught:
        load_run_config(path)
    assert "duration" in str(caught.value) and str(path) in str(caught.value)


@pytest.mark.parametrize("rate", [".inf", "-.inf", ".nan"])
def test_an_open_loop_rate_must_be_finite(tmp_path, rate) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"duration: 10s\nload: {{mode: open, rate: {rate}}}\n")
    with pytest.raises(ConfigError, match="load.rate"):
        load_run_config(path)


@pytest.mark.parametrize("text", ["duration: .nan\n", "duration: 10s\nload: {mode: open, rate: .inf}\n"])
def test_soak_validate_refuses_it_in_one_line_exit_2_quickly(tmp_path, text) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "soak", "validate", str(path)], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr and str(path) in proc.stderr
