"""A build's nights as one sequential test (soak/history/prove.py): intervals
laid end to end, oldest night first, and the broken MTBF from history."""

from __future__ import annotations

from soak.exposure import Interval
from soak.history.model import RunRecord
from soak.history.prove import broken_mtbf_of, path_of, prove_build, runs_of
from soak.prove.sprt import ProofState, plan

MIN = 60.0
PLAN = plan(broken_mtbf_s=20 * MIN, target_mtbf_s=200 * MIN)


def night(build: str, started_at: float | None, *intervals: tuple[float, bool], label: str | None = None) -> RunRecord:
    return RunRecord(
        path=f"/runs/{build}-{started_at}", run_id=None, name=None, started_at=started_at, build=build,
        vllm_version=None, launch_digest=None, label=label, verdict="pass", cut_off=False,
        intervals=tuple(Interval(start=0.0, length_s=m * MIN, hang=h, ended_by="hang" if h else "end of load")
                        for m, h in intervals),
        incidents=(), figures={}, thresholds_passed=None, restarts=0)


def test_nights_laid_end_to_end_oldest_first() -> None:
    runs = [night("b2", 200.0, (30, False)), night("b2", 100.0, (10, True), (20, False)),
            night("b1", 50.0, (5, True))]
    mine = runs_of(runs, "b2")
    assert [r.started_at for r in mine] == [100.0, 200.0]
    marks, total = path_of(mine)
    assert marks == (10 * MIN,) and total == 60 * MIN


def test_a_build_proven_fixed_over_two_nights() -> None:
    # 40 clean minutes, then 30 more the next night: the accept line (65.4) falls in the second
    runs = [night("fix", 1.0, (40, False)), night("fix", 2.0, (30, False))]
    d = prove_build(PLAN, runs, "fix")
    assert d.state is ProofState.ACCEPTED
    assert d.sentence == "fixed (α 5%, β 5%) after 65.4 clean minutes"


def test_a_build_still_broken() -> None:
    runs = [night("old", 1.0, (12, True), (15, True), (40, False))]
    d = prove_build(PLAN, runs, "old")
    assert d.state is ProofState.REJECTED and d.hangs == 2 and d.exposure_s == 27 * MIN


def test_broken_mtbf_by_key_or_label() -> None:
    runs = [night("key-1", 1.0, (12, True), (18, True), (30, False), label="nightly-1203")]
    assert broken_mtbf_of(runs, "nightly-1203") == 30 * MIN  # 60 minutes, 2 hangs
    assert broken_mtbf_of(runs, "key-1") == 30 * MIN
    assert broken_mtbf_of(runs, "other") is None
    assert broken_mtbf_of([night("clean", 1.0, (60, False))], "clean") is None
