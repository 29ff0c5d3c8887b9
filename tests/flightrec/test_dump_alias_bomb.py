"""A flight-recorder dump is a pickle, and a pickle's memo shares objects: a few
hundred bytes can name 1e10 values. For any alias-sharing structure of bounded
serialized size, ``value_depth`` stops within ``Limits.value_nodes`` (raising
``BoundExceeded(value_nodes)``) or returns the true depth where the expanded
structure fits; ``soak diagnose`` on such dumps is exit 2 with one line, in
seconds. Floats past an int (``inf`` seq numbers) read as absent, not
``OverflowError``; the unpickler still refuses every global but the few plain ones."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.bounds import LIMITS, Bound, BoundExceeded, value_depth
from soak.flightrec.diagnose import _int as diagnose_int
from soak.flightrec.dumps import FlightRecorderError, load_dump_bytes, parse_dump

ROOT = Path(__file__).resolve().parents[2]


def shared(width: int, levels: int, leaf, wrap) -> object:
    a = wrap([leaf] * width)
    for _ in range(levels):
        a = wrap([a] * width)
    return a


def expanded(width: int, levels: int) -> int:
    """Values a walk meets: the root, then width per container per level."""
    return 1 + sum(width ** k for k in range(1, levels + 2))


@settings(max_examples=150, deadline=None)
@given(width=st.integers(2, 12), levels=st.integers(0, 14), max_nodes=st.integers(1, 200_000),
       wrap=st.sampled_from([list, tuple]), leaf=st.sampled_from(["x", 1, 2.5, None]))
def test_value_depth_stops_within_the_node_bound(width, levels, max_nodes, wrap, leaf) -> None:
    value = shared(width, levels, leaf, wrap)
    assert len(pickle.dumps(value)) < 2000  # bounded serialized size, whatever it expands to
    started = time.monotonic()
    if expanded(width, levels) <= max_nodes:
        assert value_depth(value, stop=10**6, max_nodes=max_nodes) == levels + 1
    else:
        with pytest.raises(BoundExceeded) as caught:
            value_depth(value, stop=10**6, max_nodes=max_nodes)
        assert caught.value.bound is Bound.VALUE_NODES and caught.value.limit == max_nodes
    assert time.monotonic() - started < 5


@settings(max_examples=4, deadline=None)  # each walks the whole bound: about a second
@given(width=st.integers(8, 12), levels=st.integers(8, 12))
def test_a_pickled_alias_bomb_is_not_a_dump_quickly(width, levels) -> None:
    data = pickle.dumps({"version": "2.4", "entries": shared(width, levels, "x", list)})
    assert len(data) < 2000 and expanded(width, levels) > LIMITS.value_nodes
    started = time.monotonic()
    with pytest.raises(FlightRecorderError, match="value_nodes"):
        load_dump_bytes(data, name="nccl_trace_rank_0")
    assert time.monotonic() - started < 20


def test_soak_diagnose_on_alias_bombs_is_one_line_exit_2_in_seconds(tmp_path) -> None:
    data = pickle.dumps({"entries": shared(10, 10, "x", list)})
    for rank in (0, 1):
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(data)
    proc = subprocess.run([sys.executable, "-m", "soak", "diagnose", str(tmp_path)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "value_nodes" in lines[0] and "Traceback" not in proc.stderr


def test_infinite_sequence_numbers_read_as_absent() -> None:
    assert diagnose_int(float("inf")) is None and diagnose_int(float("nan")) is None
    dump = {"version": "2.4", "pg_status": {"0": {"last_enqueued_collective": float("inf"),
                                                  "last_completed_collective": 3}},
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1e999, [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]"}},
            "entries": [{"pg_id": 0, "collective_seq_id": float("-inf"), "state": "scheduled"}]}
    parsed = parse_dump(load_dump_bytes(pickle.dumps(dump)), rank=0)
    assert parsed.groups[0].last_enqueued is None and parsed.groups[0].last_completed == 3


def test_the_unpickler_refuses_arbitrary_globals() -> None:
    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    with pytest.raises(FlightRecorderError, match="refusing global"):
        load_dump_bytes(pickle.dumps({"entries": [Evil()]}))
