"""A bisect's segments read back from run directories (soak/bisect/segments.py):
the same exposure and hangs as history reads, in segment order, a cut-off
segment counted to its last record, an unreadable one skipped by name."""

from __future__ import annotations

import shutil
from pathlib import Path

from soak.bisect.segments import parse_segment_dir, read_segments
from soak.history.model import run_record
from soak.report.rundir import load_run

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "runs"


def test_names() -> None:
    assert parse_segment_dir(Path("/b/segment-012-build-3")) == (12, 3)
    assert parse_segment_dir(Path("/b/segment-12-build-3")) is None  # numbers have three digits at least
    assert parse_segment_dir(Path("/b/latest")) is None


def test_segments_read_as_history_reads_them(tmp_path: Path) -> None:
    for number, build, fixture in ((1, 5, "pass"), (0, 2, "fail"), (2, 4, "cutoff")):
        shutil.copytree(FIXTURES / fixture, tmp_path / f"segment-{number:03d}-build-{build}")
    (tmp_path / "bisect.json").write_text("{}")  # not a segment
    (tmp_path / "segment-003-build-1").mkdir()  # an empty directory: not readable
    skipped = []
    got = read_segments(tmp_path, on_skip=skipped.append)
    assert [r.build for r in got] == [2, 5, 4]
    for result, fixture in zip(got, ("fail", "pass", "cutoff")):
        data = load_run(FIXTURES / fixture)
        record = run_record(path=fixture, summary=data.summary, events=data.events, config=data.config)
        assert (result.exposure_s, result.hangs) == (record.exposure_s, record.hangs), fixture
    assert got[0].hangs >= 1 and got[1].hangs == 0 and got[0].exposure_s > 0
    assert len(skipped) == 1 and "segment-003-build-1" in str(skipped[0])


def test_a_segment_of_a_build_past_the_last_is_set_aside_not_a_crash(tmp_path: Path) -> None:
    from soak.bisect.cli import _set_aside
    from soak.bisect.posterior import model, step

    shutil.copytree(FIXTURES / "pass", tmp_path / "segment-000-build-7")  # a 4-build bisect
    shutil.copytree(FIXTURES / "pass", tmp_path / "segment-001-build-1")
    skipped = []
    got = read_segments(tmp_path, builds=4, on_skip=lambda exc: (skipped.append(str(exc)), _set_aside(exc, print)))
    assert [r.build for r in got] == [1]
    assert len(skipped) == 1 and "segment-000-build-7" in skipped[0] and "past the last" in skipped[0]
    assert (tmp_path / "segment-000-build-7.unreadable").is_dir()  # the next resume does not trip on it again
    step([r.segment for r in got], model=model(builds=4), segment_s=60)  # the posterior takes what is left


def test_a_segment_whose_server_answered_nothing_is_no_evidence_the_build_is_good(tmp_path: Path) -> None:
    from soak.bisect.posterior import model, posterior
    from soak.bisect.segments import NOTHING_ANSWERED

    run = tmp_path / "segment-000-build-2"
    shutil.copytree(FIXTURES / "pass", run)
    lines = (run / "requests.jsonl").read_text().splitlines()
    (run / "requests.jsonl").write_text("".join(
        line.replace('"outcome":"ok"', '"outcome":"http_error"').replace('"http_status":200', '"http_status":500')
        + "\n" for line in lines))
    shutil.copytree(FIXTURES / "pass", tmp_path / "segment-001-build-3")  # a segment that ran: clean time counts
    failed, ran = read_segments(tmp_path)
    assert (failed.exposure_s, failed.hangs, failed.ended_by) == (0.0, 0, NOTHING_ANSWERED)
    assert ran.exposure_s > 0
    m = model(builds=4)
    # the broken segment moves no belief: the same posterior as without it
    assert posterior([failed.segment, ran.segment], model=m).first_bad == posterior([ran.segment], model=m).first_bad
