"""bench/night_axis.py on recordings it cannot splice: one line naming
events.jsonl and exit 2, never a loop that does not end or a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from night_axis import MARGIN_S, SpliceError, pieces  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def _recording(onset: float | None, *, stop: float = 120.0) -> list[dict]:
    events = [{"type": "run_started", "ts": 0.0}, {"type": "load_stopped", "ts": stop}]
    if onset is not None:
        events += [{"type": "incident", "number": 1, "onset_at": onset, "ts": onset + 3},
                   {"type": "restart_done", "number": 1, "ts": onset + 8}]
    return events


@pytest.mark.parametrize("onset, says", [(5.0, "the first onset is 5.0 s after run_started"),
                                         (None, "no incident with an onset_at")])
def test_an_unspliceable_recording_is_one_line_and_exit_2(tmp_path, onset, says) -> None:
    run = tmp_path / "recorded"
    run.mkdir()
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in _recording(onset)))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "night_axis.py"), str(run), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and str(run / "events.jsonl") in done.stderr and says in done.stderr


@settings(max_examples=100, deadline=None)
@given(onset=st.floats(0.0, 100.0), minutes=st.floats(1.0, 90.0), hang_at=st.floats(0.0, 90.0))
def test_pieces_either_refuse_or_fill_the_night_in_order(onset: float, minutes: float, hang_at: float) -> None:
    try:
        plan, end = pieces(_recording(onset), minutes=minutes, hangs_at=[hang_at])
    except SpliceError:
        assert onset < 2 * MARGIN_S + 1.0
        return
    destinations = [to for _lo, _hi, to in plan]
    assert destinations == sorted(destinations)
    assert end >= minutes * 60.0
