"""vLLM's jit_monitor lines: a never-fatal signature, read from a real log file by the
log probe (a real subprocess appends them, as a server's output reaches server.log)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from soak.clock import ManualClock
from soak.logsignatures import JIT_COMPILE, parse_log_line
from soak.probes.logwatch import LogProbe

# As vLLM 0.11.x writes them to a launched server's output: coloured worker prefix included.
LINES = [
    "\x1b[1;36m(Worker_PP3 pid=4242)\x1b[0;0m WARNING 12-06 10:00:01 [jit_monitor.py:96] Triton kernel JIT "
    "compilation during inference: _topk_topp_kernel. This causes a latency spike; add it to the warm-up.",
    "(Worker_PP0 pid=4239) WARNING 12-06 10:00:02 [jit_monitor.py:96] TileLang JIT compilation during inference: "
    "mhc_pre_big_fuse_with_norm_tilelang",
    "(APIServer pid=4200) INFO 12-06 10:00:03 [loggers.py:127] Engine 000: Avg prompt throughput: 1.0 tokens/s",
    "(EngineCore_DP0 pid=4210) INFO 12-06 10:00:06 [shm_broadcast.py:466] No available shared memory broadcast "
    "block found in 5 seconds. This typically happens when some processes are hanging.",
]


@pytest.mark.parametrize("line, compiler, kernel", [
    (LINES[0], "Triton", "_topk_topp_kernel"),
    (LINES[1], "TileLang", "mhc_pre_big_fuse_with_norm_tilelang"),
    ("WARNING [jit_monitor.py:96] Triton kernel JIT compilation during inference", "Triton", None),
    # vLLM 0.32's jit_monitor._handle_jit_event, word for word: "%s %s during inference: %s%s. ..."
    ("(Worker_PP1 pid=9) WARNING 12-06 10:00:01 [jit_monitor.py:140] CuTeDSL JIT compilation during inference: "
     "fused_moe_kernel. This causes a latency spike; consider extending warmup to cover this shape/config.",
     "CuTeDSL", "fused_moe_kernel"),
    # --jit-monitor-verbose: the compile's details after the name
    ("WARNING [jit_monitor.py:137] Triton kernel JIT compilation during inference: _rejection_kernel "
     "(signature *fp32, i32; constants BLOCK=128). This causes a latency spike; consider extending warmup "
     "to cover this shape/config.", "Triton", "_rejection_kernel"),
])
def test_jit_lines_are_a_never_fatal_signature_naming_the_kernel(line, compiler, kernel):
    m = parse_log_line(line)
    assert (m.signature, m.fatal) == (JIT_COMPILE, False)
    assert m.fields["compiler"] == compiler and m.fields.get("kernel") == kernel


def test_the_log_probe_reads_jit_lines_from_a_file_a_server_writes(tmp_path):
    path = tmp_path / "server.log"
    script = ("import sys, time\n"
              "out = open(sys.argv[1], 'a')\n"
              "for line in sys.argv[2:]:\n"
              "    out.write(line + '\\n'); out.flush(); time.sleep(0.01)\n")
    subprocess.run([sys.executable, "-c", script, str(path), *LINES], check=True, timeout=30)
    clock = ManualClock(1_800_000_000.0)
    samples = asyncio.run(LogProbe(path, clock=clock).collect())
    assert [(s.signature, s.fatal) for s in samples] == [
        (JIT_COMPILE, False), (JIT_COMPILE, False), ("shm_broadcast_wait", False)]
    first = samples[0]
    assert first.fields == {"worker": "Worker_PP3", "pid": 4242, "compiler": "Triton", "kernel": "_topk_topp_kernel"}
    assert "\x1b" not in first.line and first.ts == 1_800_000_000.0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("line", [
    "a" * 4_000_000,  # one run of letters: an unbounded [A-Za-z]+ before " JIT" backtracks quadratically
    "Triton " * 600_000,
    "x" * 2_000_000 + " JIT compilation during inference: " + "k" * 2_000_000,
    "JIT compilation during inference" * 100_000,
    ("(" + "W" * 1000 + " pid=") * 2_000,
])
def test_a_hostile_megabyte_line_parses_in_linear_time(line) -> None:
    # The log probe reads a server's lines on the harness's own loop: a line that
    # takes quadratic time there stops the run (a chaos night hung on a 4 MB line).
    match = parse_log_line(line)
    assert match is None or match.signature == "jit_compile"
