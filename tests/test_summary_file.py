"""summary.json read through soak.summary_file.RunSummary: total, typed, lossless."""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import soak.summary_file as summary_file
from soak.records import Verdict
from soak.summary_file import RunSummary

RUNS = Path(__file__).parent / "fixtures" / "runs"
FIXTURES = sorted(RUNS.glob("*/summary.json"))

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
# The names summary.json uses, so the readers of each field meet hostile values (an
# arbitrary dictionary almost never has the key "latency").
KEYS = ("verdict", "cut_off", "run_id", "name", "hostname", "started_at", "ended_at", "duration_s", "exit_code",
        "verdict_reasons", "requests", "tokens", "server_tokens", "prefix_cache_hit_ratio", "throughput", "latency",
        "incidents", "restarts", "criteria", "thresholds", "build", "server_metrics", "error_rate", "clock",
        "gpu_source", "server_version", "warnings", "records")
INNER = ("ok", "failed", "by_outcome", "cut_by_drain", "prompt", "generated", "cached", "ttft_s", "p99", "kind",
         "number", "killed_pids", "results", "passed", "breached", "state", "name", "reasons", "basis", "wall_steps",
         "stale", "messages", "label", "build", "samples", "value", "rate", "note", "diagnosis")
shaped_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(INNER), inner, max_size=4),
    max_leaves=25,
)
summaries = st.dictionaries(st.sampled_from(KEYS), shaped_values, max_size=len(KEYS))


def _conforms(value: Any, hint: Any, module: Any) -> bool:
    """Whether ``value`` has the declared type ``hint`` (the hints RunSummary uses)."""
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, h, module) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, float) and math.isfinite(value)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (str, bool):
        return isinstance(value, hint)
    if origin is tuple:
        (item, _ellipsis) = typing.get_args(hint)
        return isinstance(value, tuple) and all(_conforms(v, item, module) for v in value)
    if origin in (collections.abc.Mapping, dict):
        key, item = typing.get_args(hint)
        return isinstance(value, Mapping) and all(
            _conforms(k, key, module) and _conforms(v, item, module) for k, v in value.items())
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return isinstance(value, hint)
    if dataclasses.is_dataclass(hint):
        return isinstance(value, hint) and _typed(value, module)
    raise AssertionError(f"no check for {hint!r}")


def _typed(record: Any, module: Any) -> bool:
    hints = typing.get_type_hints(type(record), vars(module))
    bad = [f.name for f in dataclasses.fields(record)
           if f.name != "raw" and not _conforms(getattr(record, f.name), hints[f.name], module)]
    assert not bad, f"{type(record).__name__}: fields of the wrong type: {bad}"
    return True


def _every_view(summary: RunSummary) -> None:
    """The derived readings a reader uses: none may raise either."""
    assert summary.hangs >= 0
    summary.build_entry, summary.server_metrics_note, summary.requests.cut
    for entry in (summary.criteria, summary.thresholds):
        if entry is not None:
            assert all(_typed(row, summary_file) for row in entry.rows)
    if summary.build_entry is not None:
        _typed(summary.build_entry, summary_file)
    for path in (("latency", "ttft_s", "p99"), ("prefix_cache_hit_ratio",), ("requests", "ok")):
        figure = summary.figure(path)
        assert figure is None or (isinstance(figure, float) and math.isfinite(figure))


@settings(max_examples=100, deadline=None)
@given(json_values | summaries)
def test_any_json_value_reads_typed_and_whole_and_never_raises(obj) -> None:
    summary = RunSummary.from_json(obj)
    assert _typed(summary, summary_file)
    _every_view(summary)
    if isinstance(obj, dict):
        assert summary.to_json() == obj  # what no reader names is kept


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=5))
def test_round_trip(obj) -> None:
    assert RunSummary.from_json(obj).to_json() == obj
    assert RunSummary.of(RunSummary.from_json(obj)).to_json() == obj


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.parent.name)
def test_recorded_summaries_read_whole(path: Path) -> None:
    raw = json.loads(path.read_text())
    summary = RunSummary.from_json(raw)
    assert _typed(summary, summary_file)
    assert summary.to_json() == raw
    assert summary.verdict is Verdict(raw["verdict"])
    assert summary.requests.ok == raw["requests"]["ok"] and summary.requests.failed == raw["requests"]["failed"]
    assert summary.tokens.generated == raw["tokens"]["generated"]
    assert summary.server_tokens.prompt == raw["server_tokens"]["prompt"]
    assert summary.throughput.generated_tokens_per_s == raw["throughput"]["generated_tokens_per_s"]
    assert summary.latency["ttft_s"]["p99"] == raw["latency"]["ttft_s"]["p99"]
    assert summary.records["samples"] == raw["records"]["samples"]
    assert [i.number for i in summary.incidents] == [i["number"] for i in raw["incidents"]]
    assert summary.hangs == sum(i["kind"] == "hang" for i in raw["incidents"])
    assert summary.figure(("latency", "tpot_s", "p50")) == raw["latency"]["tpot_s"]["p50"]


def test_wrong_types_read_as_absent() -> None:
    summary = RunSummary.from_json({
        "verdict": "maybe", "started_at": "yesterday", "duration_s": float("nan"), "exit_code": True,
        "tokens": {"generated": "many"}, "incidents": [{"kind": "hang", "number": "1"}, "not an incident"],
        "latency": {"ttft_s": {"p99": "slow", "p50": 0.5}, "junk": 3}, "records": {"samples": 1.5},
    })
    assert summary.verdict is None and summary.started_at is None and summary.duration_s is None
    assert summary.exit_code is None and summary.tokens.generated is None
    assert [(i.kind, i.number) for i in summary.incidents] == [("hang", None)] and summary.hangs == 1
    assert summary.latency == {"ttft_s": {"p50": 0.5}} and summary.records == {}


@pytest.mark.parametrize("recorded, rate", [
    (0.25, 0.25), ({"value": 0.5}, 0.5), ({"rate": 0.125}, 0.125), ({"value": "x"}, None), ("0.5", None),
])
def test_error_rate_reads_both_recorded_shapes(recorded, rate) -> None:
    assert RunSummary.from_json({"error_rate": recorded}).error_rate == rate


def test_typed_rows_of_criteria_and_thresholds() -> None:
    summary = RunSummary.from_json({
        "criteria": {"results": [{"name": "error_rate", "state": "fail", "reasons": ["12% failed", 3]}, 7]},
        "thresholds": {"passed": False, "results": [{"name": "ttft_p99", "passed": False, "outcome": "breached",
                                                     "reason": "9 s > 5 s"}]},
        "build": {"label": "nightly", "build": "nightly", "vllm_version": None},
        "server_metrics": {"note": "the server restarted"},
    })
    (criterion,) = summary.criteria.rows
    assert criterion.failed and criterion.reasons == ("12% failed",)
    (threshold,) = summary.thresholds.rows
    assert (threshold.name, threshold.passed, threshold.reason) == ("ttft_p99", False, "9 s > 5 s")
    assert summary.build_entry.key == "nightly" and summary.build_entry.vllm_version is None
    assert summary.server_metrics_note == "the server restarted"
