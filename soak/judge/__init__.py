"""One judge of a run: what the run directory recorded, and how the run ended,
in; the verdict, its reasons, the exit code and summary.json out.

- ``recorded``: the one read of a run directory (the only I/O);
- ``ladder``: the exit-code ladder, pure;
- ``ending``: what the run knew at its end (live, or from ``run_ended``);
- ``judgement``: ``judge`` (pure) and ``summary_json``, its serialized form;
- ``entry``: ``conclude`` (the end of a run) and ``rejudge`` (``soak report``).
"""

from soak.judge.entry import conclude, rejudge, summarize
from soak.judge.ending import Ending, EndingSource
from soak.judge.judgement import Judgement, judge, summary_json
from soak.judge.ladder import Problem, outcome_of
from soak.judge.recorded import Recorded, read_recorded

__all__ = ["Ending", "EndingSource", "Judgement", "Problem", "Recorded", "conclude", "judge", "outcome_of",
           "read_recorded", "rejudge", "summarize", "summary_json"]
