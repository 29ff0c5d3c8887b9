"""py-spy is refused by the kernel (Yama ptrace_scope, no CAP_SYS_PTRACE): the
evidence note says so and how to allow it."""

from __future__ import annotations

import os
import stat
import sys

from soak.respond.evidence import PTRACE_HINT, py_spy_dump


def _fake_py_spy(tmp_path, output: str, code: int):
    exe = tmp_path / "py-spy"
    exe.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write({output!r})\nsys.exit({code})\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe)


async def test_a_refused_ptrace_says_how_to_allow_it(tmp_path):
    exe = _fake_py_spy(tmp_path, "Error: Failed to suspend process\nReason: Operation not permitted (os error 1)\n", 1)
    ok, note = await py_spy_dump(exe, os.getpid(), native=False, timeout_s=30, dest=tmp_path / "py-spy-1.txt")
    assert not ok and PTRACE_HINT in note
    assert "kernel.yama.ptrace_scope" in note and "CAP_SYS_PTRACE" in note


async def test_another_failure_gets_no_ptrace_hint(tmp_path):
    exe = _fake_py_spy(tmp_path, "Error: No python processes found in process 1\n", 1)
    ok, note = await py_spy_dump(exe, os.getpid(), native=False, timeout_s=30, dest=tmp_path / "py-spy-1.txt")
    assert not ok and "ptrace" not in note and "No python processes" in note


def test_py_spy_is_a_runtime_dependency():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    runtime = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    assert re.search(r'^\s*"py-spy>=', runtime, re.M), "py-spy must install with soak, not only with [test]"
