"""A build's nights as one sequential test (soak/history/prove.py): intervals
laid end to end, oldest night first, and the broken MTBF from history; and
``soak history --prove`` (soak/history/cli.py, render.py): the sentence per
build, history.html's walk between both lines, the flags checked as the section."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from bs4 import BeautifulSoup

from soak.errors import ArgumentError
from soak.exposure import Interval
from soak.history.cli import configure, prove_section, terminal_lines, with_proofs
from soak.history.model import History, RunRecord, build_stats
from soak.history.render import history_html, history_json
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


# -- soak history --prove: the terminal sentence, history.html and history.json, the flags


# nightly-1203 hangs every 20 minutes over two nights; nightly-1206 ran 40 and 30 clean minutes
RUNS = (night("nightly-1203", 1.0, (20, True), (20, True), (20, True), label="nightly-1203"),
        night("nightly-1203", 2.0, (20, True), label="nightly-1203"),
        night("nightly-1206", 3.0, (40, False), label="nightly-1206"),
        night("nightly-1206", 4.0, (30, False), label="nightly-1206"))
HISTORY = History(confidence=0.95, runs=RUNS, builds=tuple(build_stats(b, [r for r in RUNS if r.build == b],
                                                                         confidence=0.95)
                                                             for b in ("nightly-1203", "nightly-1206")),
                  baseline=None, baseline_mtbf_s=None, rate_tests=())


def args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(["runs", *argv])


def test_the_broken_builds_mtbf_from_history_and_the_fixed_build_accepted() -> None:
    section = prove_section(args("--prove", "--broken-build", "nightly-1203", "--ratio", "10"), [Path("runs")])
    h = with_proofs(HISTORY, section, only=None)
    (proof,) = h.proofs  # the broken build is not tested against itself
    assert proof.build == "nightly-1206" and proof.decision.state is ProofState.ACCEPTED
    # θ1 = 80 min / 4 hangs = 20 min, θ0 = 200 min: the plan, accepted at 65.4 minutes
    assert proof.decision.sentence == "fixed (α 5%, β 5%) after 65.4 clean minutes"
    assert proof.exposure_s == 70 * MIN


def test_one_build_named_and_a_plan_given_outright() -> None:
    section = prove_section(args("--prove", "nightly-1203", "--broken-mtbf", "20m", "--target-mtbf", "200m"),
                            [Path("runs")])
    (proof,) = with_proofs(HISTORY, section, only="nightly-1203").proofs
    # its 2nd hang lands at minute 40, past the reject deadline for 2 (36.9); the 3rd at 60 is before 88.1
    assert proof.decision.state is ProofState.REJECTED and proof.decision.hangs == 3


@pytest.mark.parametrize("argv, said", [
    (("--prove", "--broken-mtbf", "20m"), "give one of target"),
    (("--prove", "--broken-mtbf", "20m", "--ratio", "10", "--alpha", "0.7"), "--alpha: "),
    (("--prove", "--broken-mtbf", "20m", "--broken-build", "x", "--ratio", "10"), "give one of broken"),
])
def test_bad_flags_are_one_line(argv, said) -> None:
    with pytest.raises(ArgumentError, match=said):
        prove_section(args(*argv), [Path("runs")])


def test_an_unknown_build_or_a_broken_build_without_hangs_says_the_builds() -> None:
    section = prove_section(args("--prove", "--broken-build", "nightly-1206", "--ratio", "10"), [Path("runs")])
    with pytest.raises(ArgumentError, match="history has none .builds: nightly-1203, nightly-1206"):
        with_proofs(HISTORY, section, only=None)
    section = prove_section(args("--prove", "--broken-mtbf", "20m", "--ratio", "10"), [Path("runs")])
    with pytest.raises(ArgumentError, match="no build 'nightly-9999'"):
        with_proofs(HISTORY, section, only="nightly-9999")


def test_history_html_draws_each_walk_between_both_lines_and_json_keeps_it() -> None:
    section = prove_section(args("--prove", "--broken-mtbf", "20m", "--ratio", "10"), [Path("runs")])
    h = with_proofs(HISTORY, section, only=None)
    soup = BeautifulSoup(history_html(h), "html.parser")
    svgs = soup.find_all("svg", class_="proof")
    assert len(svgs) == 2
    for svg in svgs:
        assert svg.find("line", class_="accept-line") and svg.find("line", class_="reject-line")
        assert svg.find("polyline", class_="walk")
    said = [p.get_text() for p in soup.find_all("p", class_="proof")]
    assert said == ["not fixed (α 5%, β 5%): 3 hangs within 60.0 minutes",
                    "fixed (α 5%, β 5%) after 65.4 clean minutes"]
    proofs = json.loads(json.dumps(history_json(h)))["proofs"]
    assert [p["decision"] for p in proofs] == ["rejected", "accepted"]
    assert proofs[1]["path"] == {"hang_exposures_s": [], "exposure_s": 70 * MIN}
    assert "proofs" not in history_json(HISTORY)  # without --prove, as before


def test_a_build_label_with_an_escape_sequence_cannot_drive_the_terminal() -> None:
    """A run directory's build label is hostile: `soak history --prove` prints it
    (each build's line and its proof sentence) with its control characters shown as '?'."""
    evil = "nightly\x1b[2J\x1b]0;pwned\x07-1206"
    runs = (*RUNS[:2], *(night(evil, r.started_at, *[(i.length_s / MIN, i.hang) for i in r.intervals], label=evil)
                         for r in RUNS[2:]))
    h = History(confidence=0.95, runs=runs, builds=tuple(build_stats(b, [r for r in runs if r.build == b],
                                                                     confidence=0.95)
                                                         for b in ("nightly-1203", evil)),
                baseline=None, baseline_mtbf_s=None, rate_tests=())
    section = prove_section(args("--prove", "--broken-build", "nightly-1203", "--ratio", "10"), [Path("runs")])
    lines = terminal_lines(with_proofs(h, section, only=None))
    assert all(line.isprintable() for line in lines)
    assert "nightly?[2J?]0;pwned?-1206: fixed (α 5%, β 5%) after 65.4 clean minutes" in lines
    assert any(line.startswith("nightly?[2J?]0;pwned?-1206: 2 runs") for line in lines)
