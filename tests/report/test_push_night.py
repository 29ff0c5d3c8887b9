"""The night's pushed hang count as the nights dashboard reads it: never a
silent 0 on a night with hangs, whoever calls the push (with the run's events
or only its summary), and never more than the hang incidents it records."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from soak.report.push import night_families
from soak.store.rundir import RunDir
from soak.summary_file import RunSummary

HANG_RESTART = Path(__file__).resolve().parent / "fixtures" / "hang-restart"


def _pushed(families) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in families.registry.collect() for s in f.samples}


def _hangs_and_hang_incidents(summary, events) -> tuple[float, float]:
    pushed = _pushed(night_families(summary, exit_code=1, confidence=0.95, events=events))
    return pushed[("soak_night_hangs", ())], pushed[("soak_night_incidents", (("kind", "hang"),))]


def test_a_night_with_two_hangs_pushes_two_with_or_without_its_events() -> None:
    summary = RunSummary.from_json(json.loads((HANG_RESTART / "summary.json").read_text()))
    events = list(RunDir(HANG_RESTART).events())
    assert _hangs_and_hang_incidents(summary, events) == (2, 2)
    # a caller that has only summary.json (no run_dir): the summary's hangs, not 0
    assert _hangs_and_hang_incidents(summary, None) == (2, 2)
    assert _hangs_and_hang_incidents(summary, []) == (2, 2)


@settings(max_examples=50, deadline=None)
@given(kinds=st.lists(st.sampled_from(["hang", "crash", "server_error"]), max_size=6))
def test_without_events_the_pushed_hangs_are_the_summarys_hang_incidents(kinds: list[str]) -> None:
    base = json.loads((HANG_RESTART / "summary.json").read_text())
    template = base["incidents"][0]
    base["incidents"] = [{**template, "number": n + 1, "kind": k} for n, k in enumerate(kinds)]
    hangs, incidents = _hangs_and_hang_incidents(RunSummary.from_json(base), None)
    assert hangs == incidents == kinds.count("hang")


@settings(max_examples=50, deadline=None)
@given(drop=st.sets(st.integers(0, 40)))
def test_with_events_the_pushed_hangs_never_exceed_the_hang_incidents(drop: set[int]) -> None:
    """Events lost or damaged (a torn night): the MTBF's count stays within the recorded hangs."""
    summary = RunSummary.from_json(json.loads((HANG_RESTART / "summary.json").read_text()))
    events = [e for i, e in enumerate(RunDir(HANG_RESTART).events()) if i not in drop]
    hangs, incidents = _hangs_and_hang_incidents(summary, events)
    assert 0 <= hangs <= incidents == 2
