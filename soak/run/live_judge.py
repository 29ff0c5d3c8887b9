"""The failure criteria and the ``abort_on_fail`` thresholds, judged while the
load runs: each newly failed or at-risk criterion said once, and the load
stopped by the first criterion or threshold that says stop. The verdict itself
is judged at the end, from the record."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from soak.clock import Clock
from soak.criteria.config import CriteriaConfig
from soak.criteria.constraints import CriteriaDecision, judge
from soak.criteria.rules import CriterionState, RequestTally
from soak.events import Emit, EventType
from soak.run.stopping import LoadStop
from soak.samples import RequestRecord

if TYPE_CHECKING:  # the thresholds load only when a run has an abort_on_fail one
    from soak.thresholds.evaluate import ThresholdResult, WindowBook

_SAID = {CriterionState.FAIL: EventType.CRITERION_FAIL, CriterionState.AT_RISK: EventType.CRITERION_AT_RISK}



class LiveJudge:
    def __init__(self, criteria: CriteriaConfig, *, tally: RequestTally, stop: LoadStop, clock: Clock,
                 emit: Emit) -> None:
        self._criteria = criteria
        self._tally = tally
        self._stop = stop
        self._clock = clock
        self._emit = emit
        self._reported: set[str] = set()
        self._book: WindowBook | None = None
        self.breach: ThresholdResult | None = None  # the threshold that stopped the load

    def watch_thresholds(self, thresholds: Any) -> None:
        """Keep the windows of the ``thresholds`` section when one of them aborts the run."""
        from soak.thresholds.evaluate import WindowBook, compile_thresholds

        compiled = compile_thresholds(thresholds)
        if any(t.abort_on_fail for t in compiled):
            self._book = WindowBook(compiled, load_started_at=self._clock.now())

    def add_request(self, record: RequestRecord) -> None:
        if self._book is not None:
            self._book.add_request(record.to_json())

    def add_server(self, ts: float, values: Mapping[str, Any]) -> None:
        if self._book is not None:
            self._book.add_server(ts, values)

    def criteria(self) -> CriteriaDecision:
        now = self._clock.monotonic()
        load = self._stop.load
        if load is not None and load.stopping:
            self._tally.stop_sending(now)  # the drain is not owed the work rate
        self._tally.watch(now)
        decision = judge(self._criteria, self._tally, final=False)
        for result in decision.results:
            said = _SAID.get(result.state)
            if said is not None and result.name not in self._reported:
                self._reported.add(result.name)
                self._emit(said, criterion=result.name, value=result.value, threshold=result.threshold,
                           reasons=list(result.reasons))
        load = self._stop.load
        if decision.stop and load is not None and not load.stopping:
            first = decision.failed[0]
            self._stop.stop(f"criterion {first.name}: {first.reasons[0]}")
        return decision

    def thresholds(self) -> None:
        if self._book is None or self.breach is not None or self._stop.load is None:
            return
        result = self._book.check(self._clock.now())
        if result is None:
            return
        self.breach = result
        reason = f"threshold breached (abort_on_fail): {result.reason}"
        self._stop.reason = reason
        self._emit(EventType.THRESHOLD_BREACHED, threshold=result.name, observed=result.observed,
                   reason=result.reason)
        self._stop.stop(reason)
