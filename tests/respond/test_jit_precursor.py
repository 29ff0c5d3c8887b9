"""The incident summary's JIT clause: which jit_monitor lines count (those of the
evidence window before the decision) and how they read."""

from __future__ import annotations

from soak.respond.evidence import jit_precursor_note, jit_precursors
from soak.samples import LogSample, ServerSample

T0 = 1_800_000_000.0


def jit(t: float, kernel: str) -> LogSample:
    return LogSample(T0 + t, "jit_compile", f"Triton kernel JIT compilation during inference: {kernel}", False,
                     {"compiler": "Triton", "kernel": kernel, "worker": "Worker_PP3", "pid": 9})


def test_only_jit_lines_inside_the_window_count():
    samples = [jit(10, "old"), ServerSample(T0 + 50, True, {}), jit(60, "a"), jit(90, "b"), jit(130, "after")]
    found = jit_precursors(samples, since=T0 + 30, until=T0 + 120)
    assert [s.fields["kernel"] for s in found] == ["a", "b"]
    note = jit_precursor_note(found, T0 + 95)
    assert note == ("JIT compile during inference 5.0s before onset: b on Worker_PP3 (2 in the window) "
                    "(a precursor, not a verdict)")


def test_no_jit_line_no_clause():
    assert jit_precursor_note(jit_precursors([ServerSample(T0, True, {})], since=T0 - 1, until=T0 + 1), T0) is None
