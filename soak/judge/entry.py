"""The judge's two entry points: the end of a run, and a recorded run directory.

``conclude`` is the run's end: read the directory once, judge, have the run loop
write ``run_ended`` (``record_end``), fold that event into what was read, and
serialize summary.json. ``rejudge`` is ``soak report DIR`` (and every reader of
a run's report): the same reading and the same judge, the Ending rebuilt from the
recorded ``run_ended``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from soak.judge.ending import Ending
from soak.judge.judgement import Judgement, judge, run_ended_fields, summary_json
from soak.judge.recorded import read_recorded
from soak.summary_file import RunSummary


def conclude(run_dir: str | Path, ending: Ending, *,
             record_end: Callable[[dict[str, Any]], Mapping[str, Any]]) -> tuple[Judgement, dict[str, Any]]:
    """(the judgement, summary.json's content). ``record_end(fields)`` writes the
    ``run_ended`` event and returns it as written (ts and mono included)."""
    recorded = read_recorded(run_dir, cut_short=ending.load_cut_short)
    judgement = judge(recorded, ending)
    written = record_end(run_ended_fields(judgement, ending))
    return judgement, summary_json(recorded.with_run_ended(written), judgement)


def rejudge(run_dir: str | Path, *, on_request: Callable[[dict[str, Any]], None] | None = None,
            request_stats: dict[str, int] | None = None) -> tuple[Judgement, RunSummary]:
    """The recorded run judged again, as its end judged it. ``on_request`` sees
    every request in the one pass over requests.jsonl (the report's columns);
    ``request_stats`` gets that file's unreadable-line counts."""
    recorded = read_recorded(run_dir, on_request=on_request, request_stats=request_stats)
    judgement = judge(recorded, Ending.recorded(recorded.events.run_ended))
    return judgement, RunSummary.from_json(summary_json(recorded, judgement))


def summarize(run_dir: str | Path) -> dict[str, Any]:
    """summary.json's content for a recorded run (``rejudge``'s serialized form);
    kept for the many tests that read a run's summary as a dict."""
    return dict(rejudge(run_dir)[1].raw)


__all__ = ["conclude", "rejudge", "summarize"]
