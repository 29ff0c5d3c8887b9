"""The end of a run (soak.run.ending): what the run knew at its end is judged once,
run_ended records it, summary.json is what ``soak report`` would judge from the
directory, and what goes wrong at the end (a summary.json that cannot be written,
a record the judge cannot read) still ends the run in order, as a harness fault."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from soak.clock import ManualClock, run_clock
from soak.criteria.config import CriteriaConfig
from soak.criteria.rules import RequestTally
from soak.judge import rejudge
from soak.records import Verdict
from soak.run import ending
from soak.run.faults import Faults
from soak.run.stopping import LoadStop
from soak.store.store import RunStore

T0 = 1_800_000_000.0


class StubRun:
    """What the end reads of a SoakRun, over a real run store."""

    def __init__(self, path: Path, *, thresholds: dict[str, Any] | None = None, requests: int = 6) -> None:
        manual = ManualClock(T0)
        self.clock = run_clock(manual)
        self.store = RunStore(path, clock=self.clock)
        self.run_dir, self.sinks = self.store.run_dir, self.store
        self.config = SimpleNamespace(pushgateway=SimpleNamespace(url=None), criteria=CriteriaConfig())
        self.redactor = self.report_child = self.outcome = self.cycle = None
        self.options = SimpleNamespace(report=None)
        self.faults = Faults(record=self.store, on_fault=lambda reason: None)
        self.load_stop = LoadStop()
        self.load_stop.reason = "duration"
        self.live = SimpleNamespace(breach=None)
        self.tally = RequestTally.for_config(CriteriaConfig())
        self.store.write_config({"thresholds": thresholds} if thresholds else {})
        self.event("run_started", run_id="stub", duration_s=10.0, warmup_s=0.0)
        self.event("load_started")
        self.event("criteria_config", criteria=CriteriaConfig().model_dump(mode="json"))
        with (path / "requests.jsonl").open("a") as fh:
            for i in range(requests):
                fh.write(json.dumps({"request_id": f"r{i}", "outcome": "ok", "started_at": T0 + i,
                                     "ended_at": T0 + i + 0.5, "ttft_s": 0.1, "e2e_s": 0.5,
                                     "output_tokens": 10, "prompt_tokens": 100}) + "\n")
        manual.advance(10.0)
        self.event("load_stopped")

    async def stop_parts(self) -> None:
        self.stopped = True

    def observe_wall(self) -> None:
        pass

    def event(self, type: str, **fields: Any) -> None:
        self.sinks.on_event(type, {"ts": self.clock.now(), **fields})

    def fault(self, exc: BaseException, *, where: str) -> None:
        self.faults.note(exc, where)


def _events(run: StubRun) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run.run_dir / "events.jsonl").read_text().splitlines()]


def test_a_clean_end_records_its_facts_and_writes_what_soak_report_would_judge(tmp_path) -> None:
    run = StubRun(tmp_path / "run")
    outcome = asyncio.run(ending.finish(run, None))
    assert (outcome.exit_code, outcome.verdict, outcome.reason) == (0, Verdict.PASS, "duration")
    (ended,) = [e for e in _events(run) if e["type"] == "run_ended"]
    assert ended["exit_code"] == 0 and ended["problem"] is None and ended["harness_fault"] is None
    written = json.loads((run.run_dir / "summary.json").read_text())
    judgement, again = rejudge(run.run_dir)
    assert written == json.loads(json.dumps(again.raw)) and judgement.exit_code == 0
    assert asyncio.run(ending.finish(run, None)) is outcome  # once


def test_a_breached_threshold_is_99_and_says_which(tmp_path) -> None:
    # config.yaml holds the resolved config: each rule in its long form
    run = StubRun(tmp_path / "run", thresholds={"requests_per_s": {"threshold": ["> 1000"]}})
    outcome = asyncio.run(ending.finish(run, None))
    assert outcome.exit_code == 99 and outcome.reason == "thresholds breached: requests_per_s > 1000"
    assert outcome.summary["thresholds"]["breached"] == ["requests_per_s > 1000"]


def test_a_summary_json_that_cannot_be_written_is_exit_4(tmp_path, monkeypatch) -> None:
    run = StubRun(tmp_path / "run")

    def full(summary: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run.store, "write_summary", full)
    outcome = asyncio.run(ending.finish(run, None))
    assert (outcome.exit_code, outcome.verdict) == (4, Verdict.ABORTED)
    assert run.faults.where == "writing summary.json"


def test_a_record_the_judge_cannot_read_ends_the_run_as_a_harness_fault(tmp_path, monkeypatch) -> None:
    run = StubRun(tmp_path / "run")

    def unreadable(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("a shape no reader foresaw")

    monkeypatch.setattr("soak.judge.entry.read_recorded", unreadable)
    outcome = asyncio.run(ending.finish(run, None))
    assert outcome.exit_code == 4 and run.faults.where == "summarizing the run"
    (ended,) = [e for e in _events(run) if e["type"] == "run_ended"]
    assert ended["exit_code"] == 4 and ended["harness_fault"].startswith("while summarizing the run: ValueError")
    # the directory judged again later says the same exit code
    monkeypatch.undo()
    assert rejudge(run.run_dir)[0].exit_code == 4


@pytest.mark.parametrize("problem, code", [(ending.EnvironmentProblem("no NVML"), 3), (ending.UsageError("bad"), 2)])
def test_a_problem_is_its_exit_code_and_run_ended_says_which(tmp_path, problem, code) -> None:
    run = StubRun(tmp_path / "run", requests=0)
    run.load_stop.reason = f"{type(problem).__name__}: {problem}"
    outcome = asyncio.run(ending.finish(run, problem))
    assert (outcome.exit_code, outcome.verdict) == (code, Verdict.ABORTED)
    (ended,) = [e for e in _events(run) if e["type"] == "run_ended"]
    assert ended["problem"] == ("environment" if code == 3 else "usage") and ended["load_cut_short"] is True
    assert rejudge(run.run_dir)[0].exit_code == code
