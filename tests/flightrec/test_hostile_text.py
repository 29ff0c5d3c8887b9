"""The diagnosis quotes text the target chose (worker titles, thread names, frame
names and paths from py-spy, collective and group names from flight-recorder dumps,
a diagnosis.json anyone may have edited). Whatever those bytes are, no control or
escape character reaches the incident summary, `soak diagnose`'s terminal output or
the diagnosis record, and the faulty rank is still named."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from soak.flightrec.diagnose import diagnose_group
from soak.flightrec.stackfiles import diagnosis_record, stack_diagnosis
from soak.printable import printable
from soak.respond.collect import incident_diagnosis

# What a hostile server would put in its text: terminal escapes (CSI, OSC retitle,
# C1 CSI), line breaks of every kind, a bell, NUL, a bidi override, DEL.
HOSTILE = ["\x1b[2J", "\x1b]0;owned\x07", "\x9b31m", "\r", "\n", "\x85", "\u2028", "\x00", "\u202e", "\x7f", "\x0b"]
hostile_text = st.lists(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=8)), max_size=6).map("".join)

PS = "vllm/distributed/parallel_state.py"


def all_printable(text: str) -> bool:
    return all(line.isprintable() for line in text.split("\n"))


def _dump(pid: int, title: str, thread: str, frames: list[tuple[str, str]], status: str) -> str:
    body = "".join(f"    {func} ({path})\n" for func, path in frames)
    return f"Process {pid}: {title}\nPython v3.11.7 (/usr/bin/python3.11)\n\nThread {pid} ({status}): \"{thread}\"\n{body}"


def _bundle(root: Path, junk: list[str]) -> Path:
    """Stage 1 spins in a frame whose name and path carry ``junk``; stage 0 waits for the next RPC."""
    spin = [(f"LlamaModel.forward{junk[0]}", f"vllm/model_executor/models/llama{junk[1]}.py:400"),
            ("Worker.execute_model", "vllm/v1/worker/gpu_worker.py:1316")]
    idle = [("MessageQueue.dequeue", "vllm/distributed/device_communicators/shm_broadcast.py:971")]
    procs = []
    for stage, (frames, status, state) in enumerate([(idle, "idle", "S"), (spin, "active+gil", "R")]):
        pid = 4000 + stage
        title = f"VLLM::Worker_PP{stage} {junk[2]}"
        (root / f"py-spy-{pid}.txt").write_text(_dump(pid, title, f"MainThread{junk[3]}", frames, status),
                                                encoding="utf-8")
        procs.append({"pid": pid, "name": f"VLLM::Worker_PP{stage}", "cmdline": [title, junk[4]]})
    (root / "processes.json").write_text(json.dumps({"processes": procs}), encoding="utf-8")
    (root / "process_states.json").write_text(json.dumps({"pids": {
        str(4000 + s): {"state": st_, "title": f"VLLM::Worker_PP{s}{junk[5]}", "cpu": 1.0 if s else 0.0}
        for s, st_ in enumerate("SR")}}), encoding="utf-8")
    return root


@settings(max_examples=60, deadline=None)
@given(junk=st.lists(hostile_text, min_size=6, max_size=6))
def test_hostile_stack_text_never_reaches_a_summary_or_terminal_raw(tmp_path_factory, junk):
    bundle = _bundle(tmp_path_factory.mktemp("incident"), junk)
    found = stack_diagnosis(bundle)
    assert found is not None and found.faulty is not None and found.faulty.stage == 1  # still named
    record = diagnosis_record(flight_recorder="no dump", fr_line=None, fr_detail=None, places={}, stacks=found)
    (bundle / "diagnosis.json").write_text(json.dumps(record), encoding="utf-8")
    line, clause = incident_diagnosis(bundle)
    for text in (found.line, line, clause, json.dumps(record, ensure_ascii=False)):
        assert text and all_printable(text), repr(text)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.lists(hostile_text, min_size=6, max_size=6))
def test_soak_diagnose_prints_no_control_character_whatever_the_stacks_say(tmp_path_factory, capsys, junk):
    from soak.report.diagnose_cli import run

    bundle = _bundle(tmp_path_factory.mktemp("incident"), junk)
    capsys.readouterr()  # one capture per example: the fixture is not reset between them
    run(path=bundle, as_json=False)
    out = capsys.readouterr().out
    assert "rank 1" in out and all_printable(out), repr(out)


@settings(max_examples=60, deadline=None)
@given(name=hostile_text, desc=hostile_text, op=hostile_text)
def test_flight_recorder_group_and_collective_names_come_out_printable(name, desc, op):
    entry = {"profiling_name": f"nccl:{op}", "input_sizes": [[2]], "output_sizes": [[2]], "state": "completed"}
    per_rank = {0: {"entries": {1: entry, 2: entry}, "last_enqueued": 2, "last_completed": 2},
                1: {"entries": {1: entry}, "last_enqueued": 1, "last_completed": 1}}
    group = diagnose_group(name, desc, (0, 1), per_rank, {})
    assert all_printable(group.line) and all_printable(group.desc) and all_printable(group.group)


@settings(max_examples=100, deadline=None)
@given(text=st.text(), limit=st.integers(1, 50))
def test_printable_is_printable_bounded_and_leaves_clean_text_alone(text, limit):
    out = printable(text, limit=limit)
    assert out.isprintable() and len(out) <= limit + 3
    if text.isprintable() and len(text) <= limit:
        assert out == text
