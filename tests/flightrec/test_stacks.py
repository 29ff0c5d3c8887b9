"""The py-spy fallback: where each worker stands and which rank is behind.

Real stacks from real vLLM 0.32 hangs (tests/fixtures/pyspy/real_vllm/, with the
injector's own line in fault.txt), and properties over generated pipelines."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hypothesis import given, settings, strategies as st

from soak.flightrec.stackfiles import diagnosis_record, read_diagnosis, stack_diagnosis, workers_from_bundle
from soak.flightrec.stacks import Activity, Reason, Worker, diagnose_stacks, parse_py_spy, place_of
from soak.respond.collect import incident_diagnosis

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "pyspy" / "real_vllm"


def _fault(case: str) -> dict:
    return json.loads((REAL / case / "fault.txt").read_text().split(" ", 1)[1])


def test_a_real_skipped_send_names_the_sender_and_the_vllm_line_the_receiver_waits_at():
    fault = _fault("skip_send")
    found = stack_diagnosis(REAL / "skip_send")
    assert found.reason is Reason.MISSING_SEND and found.group == "pp"
    assert (found.faulty.rank, found.faulty.stage, found.faulty.pid) == (fault["rank"], 0, fault["pid"])
    assert found.faulty.activity is Activity.IDLE_RPC
    blocked = found.blocked
    assert (blocked.rank, blocked.stage, blocked.call) == (1, 1, "recv")
    assert blocked.vllm_frame == "vllm/distributed/parallel_state.py:935 GroupCoordinator.recv_object"
    assert found.line.startswith(f"pp group: rank 0 (stage 0, PID {fault['pid']}) is behind: it never posted the send")
    assert "parallel_state.py:935" in found.line and "irecv_tensor_dict" in found.line


def test_a_real_spinning_last_stage_is_named_while_the_first_waits():
    fault = _fault("spin_last")
    found = stack_diagnosis(REAL / "spin_last")
    assert found.reason is Reason.SPINNING
    assert (found.faulty.rank, found.faulty.pid) == (fault["rank"], fault["pid"])
    assert found.blocked.activity is Activity.WAITING and found.blocked.stage == 0
    assert "gpu_worker.py:1316 Worker.execute_model" in found.line


def test_a_real_lagged_send_names_the_sender_though_the_tree_recorded_untitled_workers():
    fault = _fault("lag_send")
    procs = json.loads((REAL / "lag_send" / "processes.json").read_text())["processes"]
    assert not any("Worker" in p["name"] for p in procs)  # first seen before vLLM titled them
    found = stack_diagnosis(REAL / "lag_send")
    assert found.reason is Reason.MISSING_SEND
    assert (found.faulty.rank, found.faulty.pid) == (fault["rank"], fault["pid"])


def test_a_real_skipped_send_met_at_shutdown_still_names_the_sender():
    found = stack_diagnosis(REAL / "skip_send_at_shutdown")
    assert found.faulty.pid == _fault("skip_send_at_shutdown")["pid"] and found.reason is Reason.MISSING_SEND


def test_a_real_stopped_worker_has_no_stack_and_only_its_state_names_it(tmp_path):
    fault = _fault("sigstop")
    shutil.copytree(REAL / "sigstop", tmp_path / "inc")
    found = stack_diagnosis(tmp_path / "inc")
    assert found.faulty is None  # py-spy could not suspend it: "Failed to suspend process"
    stopped = next(p for p in found.places if p.pid == fault["pid"])
    assert stopped.stage == 1 and stopped.top is None
    (tmp_path / "inc" / "process_states.json").write_text(json.dumps(
        {"pids": {str(fault["pid"]): {"state": "T", "cpu": 0.0, "title": "VLLM::Worker_PP1"}}}))
    found = stack_diagnosis(tmp_path / "inc")
    assert found.reason is Reason.STOPPED and (found.faulty.rank, found.faulty.pid) == (1, fault["pid"])


def test_real_bundles_with_process_states_name_the_skipper_and_the_stopped_stage():
    skip = stack_diagnosis(REAL / "skip_send_with_states")
    assert (skip.faulty.rank, skip.faulty.pid, skip.reason) == (0, _fault("skip_send_with_states")["pid"],
                                                                Reason.MISSING_SEND)
    assert skip.blocked.state == "S" and skip.blocked.call == "recv"
    stop = stack_diagnosis(REAL / "sigstop_with_states")
    fault = _fault("sigstop_with_states")
    assert (stop.faulty.rank, stop.faulty.pid, stop.reason) == (1, fault["pid"], Reason.STOPPED)
    assert stop.line.startswith(f"rank 1 (stage 1, PID {fault['pid']}) is behind: stopped (state T)")


def test_only_workers_count_and_a_missing_stack_reads_as_no_stack(tmp_path):
    shutil.copytree(REAL / "skip_send", tmp_path / "inc")
    workers = workers_from_bundle(tmp_path / "inc")
    assert sorted(w.title for w in workers) == ["VLLM::Worker_PP0", "VLLM::Worker_PP1"]
    for f in (tmp_path / "inc").glob("py-spy-*.txt"):
        f.unlink()
    assert stack_diagnosis(tmp_path / "inc") is None
    (tmp_path / "inc" / "process_states.json").write_text(json.dumps({"pids": {"6741": {"state": "T", "cpu": 0.0}}}))
    found = stack_diagnosis(tmp_path / "inc")
    assert found.reason is Reason.STOPPED and found.faulty.pid == 6741


def test_the_flight_recorder_wins_where_it_names_a_rank_and_the_stacks_where_it_cannot():
    stacks = stack_diagnosis(REAL / "skip_send")
    fr_detail = {"groups": [{"kind": "missing", "desc": "pp_broadcast", "group": "1", "seq": 55, "odd_ranks": [2]}]}
    fr = diagnosis_record(flight_recorder="3 dumps", fr_line="pp_broadcast: rank 2 never posted collective 55",
                          fr_detail=fr_detail, places={2: {"stage": 2, "pid": 77}}, stacks=stacks)
    assert fr["source"] == "flight_recorder" and fr["faulty"] == {"rank": 2, "stage": 2, "pid": 77} and fr["seq"] == 55
    py = diagnosis_record(flight_recorder="no dump", fr_line=None, fr_detail=None, places={}, stacks=stacks)
    assert py["source"] == "py-spy" and py["faulty"]["rank"] == 0 and py["blocked"]["call"] == "recv"
    assert py["blocked"]["vllm_line"].startswith("vllm/distributed/parallel_state.py:935")
    json.dumps(py)  # the file's content is plain JSON


def test_the_incident_summary_clause_says_what_the_flight_recorder_gave(tmp_path):
    stacks = stack_diagnosis(REAL / "skip_send")
    (tmp_path / "diagnosis.json").write_text(json.dumps(diagnosis_record(
        flight_recorder="no dump: no rank opened a dump pipe", fr_line=None, fr_detail=None, places={}, stacks=stacks)))
    line, clause = incident_diagnosis(tmp_path)
    assert line == stacks.line and read_diagnosis(tmp_path)["faulty"]["pid"] == 6741
    assert clause == f"py-spy: {stacks.line} (flight recorder: no dump: no rank opened a dump pipe)"


# --- generated pipelines -----------------------------------------------------------

TORCH = "torch/distributed/distributed_c10d.py"
PS = "vllm/distributed/parallel_state.py"
EXEC = "    Worker.execute_model (vllm/v1/worker/gpu_worker.py:1316)\n"
BASE = ("    WorkerProc.worker_busy_loop (vllm/v1/executor/multiproc_executor.py:1041)\n"
        "    WorkerProc.worker_main (vllm/v1/executor/multiproc_executor.py:944)\n")
FRAMES = {
    "recv": (f"    recv ({TORCH}:2799)\n    _exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:83)\n"
             f"    GroupCoordinator.recv_object ({PS}:935)\n    GroupCoordinator.irecv_tensor_dict ({PS}:1318)\n"
             + EXEC + BASE, "idle"),
    "send": (f"    send ({TORCH}:2740)\n    GroupCoordinator.send_object ({PS}:910)\n"
             f"    GroupCoordinator.isend_tensor_dict ({PS}:1190)\n" + EXEC + BASE, "idle"),
    "dequeue": ("    Poller.poll (zmq/sugar/poll.py:106)\n"
                "    MessageQueue.acquire_read (vllm/distributed/device_communicators/shm_broadcast.py:864)\n"
                "    MessageQueue.dequeue (vllm/distributed/device_communicators/shm_broadcast.py:971)\n" + BASE, "idle"),
    "spin": ("    LlamaModel.forward (vllm/model_executor/models/llama.py:400)\n" + EXEC + BASE, "active+gil"),
    "wait": ("    Worker.execute_model (vllm/v1/worker/gpu_worker.py:1309)\n" + BASE, "idle"),
}
EXPECTED = {"recv": Activity.BLOCKED, "send": Activity.BLOCKED, "dequeue": Activity.IDLE_RPC,
            "spin": Activity.SPINNING, "wait": Activity.WAITING}


def _worker(stage: int, where: str, *, stopped: bool = False, pid: int | None = None) -> Worker:
    pid = pid or 1000 + stage
    frames, status = FRAMES[where]
    text = (f"Process {pid}: VLLM::Worker_PP{stage}\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
            f"Thread {pid} ({status}): \"MainThread\"\n{frames}"
            f"Thread {pid + 7} (idle): \"DeathPipeMonitor\"\n    Connection._recv (multiprocessing/connection.py:395)\n")
    return Worker(pid=pid, title=f"VLLM::Worker_PP{stage}", state="T" if stopped else ("R" if where == "spin" else "S"),
                  stack=parse_py_spy(text))


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 7), st.sampled_from(sorted(FRAMES)), st.booleans())
def test_each_place_reads_back_as_the_activity_it_was_drawn_as(stage, where, stopped):
    place = place_of(_worker(stage, where, stopped=stopped))
    assert place.stage == stage and place.rank == stage
    assert place.activity is (Activity.STOPPED if stopped else EXPECTED[where])
    if where in ("recv", "send") and not stopped:
        assert place.call == where and place.group == "pp" and place.vllm_frame.startswith(PS)


# Stages that are not the culprit or its victim: idle between RPCs or waiting on their own sends.
bystander = st.sampled_from(["dequeue", "wait"])


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 6).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 2), st.lists(bystander, min_size=n, max_size=n))))
def test_a_stage_that_skipped_its_send_is_named_not_the_one_waiting_for_it(drawn):
    n, culprit, rest = drawn
    workers = [_worker(s, "recv" if s == culprit + 1 else ("dequeue" if s == culprit else rest[s])) for s in range(n)]
    found = diagnose_stacks(workers)
    assert found.reason is Reason.MISSING_SEND
    assert found.faulty.stage == culprit and found.faulty.pid == 1000 + culprit
    assert found.blocked.stage == culprit + 1 and found.group == "pp"


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 6).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1),
                                                     st.lists(st.sampled_from(["recv", "dequeue", "wait"]), min_size=n, max_size=n),
                                                     st.sampled_from(["spin", "stop"]))))
def test_a_spinning_or_stopped_stage_is_named_whatever_the_others_wait_in(drawn):
    n, culprit, rest, how = drawn
    workers = [_worker(s, "spin" if how == "spin" else rest[s], stopped=how == "stop") if s == culprit
               else _worker(s, rest[s]) for s in range(n)]
    found = diagnose_stacks(workers)
    assert found.faulty.stage == culprit
    assert found.reason is (Reason.SPINNING if how == "spin" else Reason.STOPPED)


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 5).flatmap(lambda n: st.lists(st.sampled_from(["dequeue", "wait"]), min_size=n, max_size=n)))
def test_a_pipeline_where_nobody_waits_on_anybody_names_nobody(wheres):
    found = diagnose_stacks([_worker(s, w) for s, w in enumerate(wheres)])
    assert found.faulty is None and found.reason is Reason.NONE
    assert found.line.startswith("no rank stands out")


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=400), st.lists(st.sampled_from(sorted(FRAMES)), max_size=4))
def test_any_text_parses_and_any_workers_diagnose_without_raising(text, wheres):
    parse_py_spy(text)
    junk = Worker(pid=9, title="VLLM::Worker_PP0", stack=parse_py_spy(text))
    found = diagnose_stacks([junk, *(_worker(s + 1, w) for s, w in enumerate(wheres))])
    assert found.faulty is None or found.faulty in found.places


def test_soak_diagnose_falls_back_to_the_stacks_and_says_the_flight_recorder_gave_nothing(capsys):
    from soak.report.diagnose_cli import run

    assert run(path=REAL / "skip_send", as_json=False) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "flight recorder: no dumps in this incident"
    assert out[1].startswith("py-spy: pp group: rank 0 (stage 0, PID 6741) is behind")
    assert any(row.endswith("<- behind") and " 6741 " in row for row in out[2:])
    assert run(path=REAL / "spin_last", as_json=True) == 1
    found = json.loads(capsys.readouterr().out)
    assert found["faulty_rank"] == 1 and found["faulty"]["pid"] == 7001 and found["reason"] == "spinning"
