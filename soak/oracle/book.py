"""The run's reference book: which answer each canary is judged against.

A canary's reference is the one recorded from a known-good build (the reference
file, ``source == "file"``) where there is one, else this run's own first good
answer (``source == "run"``): that first answer is the verdict REFERENCE and is
judged against nothing. A reference is never an answer that cannot be judged
(malformed, or without tokens): the next good answer takes its place. Every
other canary's reference is a candidate for cross-talk.

``references()`` is what this run would record for later nights: its own first
good answer of each canary, also where a file reference was used, unless that
answer was judged CORRUPT or CROSSTALK (a wrong answer is never recorded as
right; a run that fails records nothing anyway, the caller decides).

Pure: no clock, no I/O; the probe calls ``judge`` once per answer.
"""

from __future__ import annotations

from typing import Mapping

from soak.oracle.answer import Answer
from soak.oracle.compare import Judgement, judge_answer, usable
from soak.samples import CanaryVerdict

_WRONG = (CanaryVerdict.CORRUPT, CanaryVerdict.CROSSTALK)


class ReferenceBook:
    """Every canary's reference for one run, and the judge that uses them."""

    def __init__(self, *, tie_margin: float, recorded: Mapping[str, Answer] | None = None) -> None:
        self.tie_margin = float(tie_margin)
        # A recorded answer that cannot be judged is no reference: the run adopts its own.
        self._file: dict[str, Answer] = {str(k): v for k, v in (recorded or {}).items()
                                          if isinstance(v, Answer) and usable(v) is None}
        self._run: dict[str, Answer] = {}  # adopted where the file has none
        self._first: dict[str, Answer] = {}  # this run's first good answer, for the record
        self.ignored = tuple(sorted(str(k) for k in (recorded or {}) if str(k) not in self._file))

    def reference(self, canary_id: str) -> Answer | None:
        return self._file.get(canary_id) or self._run.get(canary_id)

    def source(self, canary_id: str) -> str | None:
        """``"file"`` or ``"run"``: where ``canary_id``'s reference comes from (None: none yet)."""
        if canary_id in self._file:
            return "file"
        return "run" if canary_id in self._run else None

    def _others(self, canary_id: str) -> dict[str, Answer]:
        ids = (set(self._file) | set(self._run)) - {canary_id}
        return {other: self.reference(other) for other in sorted(ids)}  # type: ignore[misc]

    def judge(self, canary_id: str, answer: Answer) -> Judgement:
        """One answer of ``canary_id``, judged (or adopted as the run's reference)."""
        reference = self.reference(canary_id)
        if reference is None:
            why = usable(answer)
            if why is not None:
                return Judgement(CanaryVerdict.UNJUDGED, reason=f"no reference yet, and this answer cannot be "
                                                                f"one: {why}")
            self._run[canary_id] = answer
            self._first.setdefault(canary_id, answer)
            return Judgement(CanaryVerdict.REFERENCE,
                             reason=f"the first answer of canary {canary_id}: this run's reference "
                                    f"({len(answer.tokens)} tokens)")
        judgement = judge_answer(reference, answer, tie_margin=self.tie_margin, others=self._others(canary_id))
        if canary_id not in self._first and usable(answer) is None and judgement.verdict not in _WRONG \
                and judgement.verdict is not CanaryVerdict.UNJUDGED:
            self._first[canary_id] = answer
        return judgement

    def references(self) -> dict[str, Answer]:
        """What this run would record: its own first good answer of each canary."""
        return dict(sorted(self._first.items()))


__all__ = ["ReferenceBook"]
