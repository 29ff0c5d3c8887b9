"""A run directory holding a jit_compile event: the report shows it as a note and a
mark on the timeline, never as an incident."""

from __future__ import annotations

import json

from soak.report.render import write_report


def test_a_jit_compile_event_is_a_note_and_a_timeline_mark_of_the_report(run_copy):
    run = run_copy("real_pass")
    events = run / "events.jsonl"
    lines = [json.loads(x) for x in events.read_text().splitlines() if x.strip()]
    started = next(e["ts"] for e in lines if e["type"] == "load_started")
    jit = {"ts": started + 12.0, "type": "jit_compile", "kernel": "_topk_topp_kernel", "compiler": "Triton",
           "worker": "Worker_PP1", "pid": 77, "line": "WARNING [jit_monitor.py:96] Triton kernel JIT compilation "
           "during inference: _topk_topp_kernel"}
    with events.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(jit) + "\n")
    written = write_report(run)
    note = next(n for n in written.model.notes if n.startswith("JIT compile during inference"))
    assert "1 line from vLLM's jit_monitor" in note and "_topk_topp_kernel" in note and "not a verdict" in note
    page = written.html.read_text(encoding="utf-8")
    assert "JIT compile during inference: 1 line" in page and "orange dotted" in page
    assert ">PASS<" in page and "Incident" not in page  # a precursor, not a verdict


def test_without_jit_events_the_report_has_no_jit_note(run_copy):
    written = write_report(run_copy("real_pass"), html=False)
    assert not any("JIT compile" in n for n in written.model.notes)
