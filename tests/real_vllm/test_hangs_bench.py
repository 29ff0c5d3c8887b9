"""bench/real_vllm_hangs.py without vLLM: the plan it asks for, the config it
writes, how it reads the injector's stamps, a py-spy dump and a diagnosis, and
how it judges issue 34's goals. (The real tier runs it against vLLM.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.config import load_run_config

from .conftest import REPO, hangs_bench

bench = hangs_bench()


@settings(max_examples=50, deadline=None)
@given(forms=st.lists(st.sampled_from(sorted(bench.FORMS)), min_size=1, max_size=5, unique=True),
       per_form=st.integers(1, 6), step=st.integers(1, 500))
def test_the_plan_cycles_the_forms_then_ends_healthy(forms, per_form, step) -> None:
    plan = bench.plan_for(forms, per_form, step)
    assert plan[-1] == "none" and len(plan) == len(forms) * per_form + 1
    assert [bench.form_of(e) for e in plan[:-1]] == forms * per_form
    assert all(f"step={step}" in e for e in plan[:-1])


def test_an_unknown_form_is_one_line() -> None:
    with pytest.raises(SystemExit, match="unknown form 'lag', known: skip_send, lag_send"):
        bench.plan_for(["lag"], 1, 40)


def test_the_written_config_loads_and_carries_the_plan_restarts_and_port(tmp_path) -> None:
    plan = bench.plan_for(["skip_send", "lag_send"], 2, 40)
    dest = bench.plan_config(REPO / "bench" / "real-vllm-hangs.yaml", tmp_path / "run.yaml", plan=plan,
                             state_dir=tmp_path / "faults", max_restarts=len(plan), port=8131)
    config = load_run_config(dest)
    assert config.target.env["SOAK_VLLM_FAULTS"] == ",".join(plan)
    assert config.target.env["SOAK_VLLM_FAULT_STATE"] == str(tmp_path / "faults")
    assert config.response.on_hang == "restart" and config.response.max_restarts == len(plan)
    assert config.target.command[-1] == "8131" and config.target.base_url.endswith(":8131")


def test_stamps_are_read_from_server_log_lines_whatever_prefixes_them() -> None:
    log = ("(Worker_PP1 pid=7) INFO hello\n"
           '(Worker_PP0 pid=6) SOAK_FAULT_PLAN {"plan": 1, "fault": "lag_send:rank=0:step=40"}\n'
           '(Worker_PP0 pid=6) SOAK_FAULT_INJECTED {"kind": "lag_send", "rank": 0, "plan": 1, "ts": 5.0}\n'
           "SOAK_FAULT_INJECTED {broken\n")
    assert bench.read_stamps(log) == [{"kind": "lag_send", "rank": 0, "plan": 1, "ts": 5.0}]
    assert bench.read_stamps(log, bench.PLAN_MARK)[0]["plan"] == 1


def test_where_py_spy_found_a_process_is_its_innermost_vllm_frame(tmp_path) -> None:
    (tmp_path / "py-spy-9.txt").write_text(
        'Process 9: VLLM::Worker_PP1\nPython v3.11\n\nThread 9 (idle): "MainThread"\n'
        "    recv (torch/distributed/distributed_c10d.py:2701)\n"
        "    recv_object (vllm/distributed/parallel_state.py:1010)\n"
        "    irecv_tensor_dict (vllm/distributed/parallel_state.py:1320)\n\n"
        'Thread 10 (idle): "other"\n    wait (threading.py:1)\n')
    assert bench.py_spy_where(tmp_path, 9) == "idle: recv_object (vllm/distributed/parallel_state.py:1010)"
    assert bench.py_spy_where(tmp_path, 8) == "no dump"


def _row(form: str, detect: float, *, rule="stage_cpu_stall", stage=1, rank=0, diagnosed=0, left=()) -> dict:
    return {"form": form, "detect_s": detect, "rule": rule, "stage_named": stage, "expected_stage": 1,
            "faulty_rank": rank, "diagnosed_rank": diagnosed, "left": list(left), "shm_left": []}


def test_the_goals_hold_only_when_every_hang_of_a_form_meets_them() -> None:
    good = [_row("lag_send", d) for d in (4.0, 6.0, 9.0)]
    assert bench.goals(good)["lag_send"] == {
        "hangs": 3, "detected": 3, "median_s": 6.0, "max_s": 9.0, "fast": True, "right_rule": True,
        "right_stage": True, "rank_named": True, "nothing_left": True}
    slow = bench.goals([*good, _row("lag_send", 21.0)])["lag_send"]
    assert slow["fast"] is False and slow["median_s"] == 7.5
    assert bench.goals([*good, _row("lag_send", 5.0, rule="generation_frozen")])["lag_send"]["right_rule"] is False
    assert bench.goals([*good, _row("lag_send", 5.0, diagnosed=None)])["lag_send"]["rank_named"] is False
    assert bench.goals([*good, _row("lag_send", 5.0, left=[123])])["lag_send"]["nothing_left"] is False
    # a form with no faulty sender asks no rank of the diagnosis
    assert bench.goals([_row("spin_last", 3.0, diagnosed=None)])["spin_last"]["rank_named"] is None


def test_the_diagnosed_rank_is_read_from_what_diagnose_prints(tmp_path, monkeypatch) -> None:
    said = {}

    class Done:
        def __init__(self, out: str) -> None:
            self.stdout, self.stderr = out, ""

    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: Done(said["out"]))
    said["out"] = json.dumps({"line": "pp: rank 0 never posted seq 41", "groups": [
        {"kind": "missing", "odd_ranks": [0]}, {"kind": "none", "odd_ranks": []}]})
    assert bench.diagnosed_rank(Path(tmp_path))[0] == 0
    said["out"] = json.dumps({"faulty_rank": 1, "line": "x"})
    assert bench.diagnosed_rank(Path(tmp_path))[0] == 1
    said["out"] = "soak diagnose: no flight-recorder dumps"
    assert bench.diagnosed_rank(Path(tmp_path)) == (None, "soak diagnose: no flight-recorder dumps")
    # prose naming a blocked rank is not a faulty rank
    said["out"] = json.dumps({"line": "rank 1 is blocked in recv_object from rank 0", "groups": []})
    assert bench.diagnosed_rank(Path(tmp_path))[0] is None
    # the incident's own diagnosis.json first
    (tmp_path / "diagnosis.json").write_text(json.dumps({"faulty": {"rank": 0, "stage": 0}, "line": "y"}))
    assert bench.diagnosed_rank(Path(tmp_path)) == (0, "y")
