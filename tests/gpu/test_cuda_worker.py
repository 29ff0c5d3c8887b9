"""soak.rigs.cuda_worker: the simulator's worker protocol, then the real GPU signature.

The protocol tests run the worker with ``--device cpu`` wherever torch is
installed; the signature test needs a CUDA GPU and NVML and skips elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess

import pytest

from soak.clock import SystemClock

from .conftest import kill_tree


class WorkerHandle:
    def __init__(self, proc: subprocess.Popen, acks) -> None:
        self.proc = proc
        self._acks = acks

    def send(self, **command) -> None:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def send_line(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def ack(self) -> str:
        line = self._acks.readline()
        assert line, f"worker exited (rc {self.proc.poll()}) before acknowledging"
        return line.strip()

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout)


@pytest.fixture
def start_worker(spawn):
    opened = []

    def start(python: str, rank: int, pp_size: int, *extra: str, device: str = "cpu") -> WorkerHandle:
        read_fd, write_fd = os.pipe()
        argv = [python, "-m", "soak.rigs.cuda_worker", "--rank", str(rank), "--pp-size", str(pp_size),
                "--gpu-index", str(rank), "--ack-fd", str(write_fd), "--device", device, *extra]
        proc = spawn(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(write_fd,), text=True)
        os.close(write_fd)
        acks = os.fdopen(read_fd)
        opened.append(acks)
        handle = WorkerHandle(proc, acks)
        assert handle.ack() == f"{rank} idle"  # ready: memory held, a kernel ran
        return handle

    yield start
    for stream in opened:
        stream.close()


def _alive_after_sigterm(proc: subprocess.Popen) -> bool:
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        return True
    return False


def test_hung_states_ignore_sigterm_and_healthy_ones_do_not(torch_python, start_worker):
    worker = start_worker(torch_python, 1, 2, "--mem-mib", "4")
    worker.send(state="busy", util=0.5)
    assert worker.ack() == "1 busy"
    worker.send(state="spin")
    assert worker.ack() == "1 spin"
    assert _alive_after_sigterm(worker.proc)
    worker.send(state="hold")
    assert worker.ack() == "1 hold"
    assert _alive_after_sigterm(worker.proc)
    worker.send(state="idle")
    assert worker.ack() == "1 idle"
    os.kill(worker.proc.pid, signal.SIGTERM)
    assert worker.wait() == -signal.SIGTERM


def test_bad_commands_are_logged_and_change_nothing(torch_python, start_worker):
    worker = start_worker(torch_python, 0, 1, "--mem-mib", "4")
    worker.send_line("not json")
    worker.send(state="dancing")
    worker.send(state="busy", util=3)
    worker.send(state="spin")
    assert worker.ack() == "0 spin"  # the three bad lines were not acknowledged
    worker.send(state="exit", code=7)
    assert worker.wait() == 7
    log = worker.proc.stdout.read()
    assert "(Worker_PP0 pid=" in log
    assert "unknown state 'dancing'" in log and "util must be a number" in log and "not JSON" in log


def test_ignore_sigterm_overrides_the_state(torch_python, start_worker):
    worker = start_worker(torch_python, 0, 1, "--mem-mib", "4")
    worker.send(state="busy", util=0.2, ignore_sigterm=True)
    assert worker.ack() == "0 busy"
    assert _alive_after_sigterm(worker.proc)
    worker.send(ignore_sigterm=False)
    assert worker.ack() == "0 busy"
    os.kill(worker.proc.pid, signal.SIGTERM)
    assert worker.wait() == -signal.SIGTERM


def test_end_of_input_ends_a_healthy_worker_but_not_a_hung_one(torch_python, start_worker):
    healthy = start_worker(torch_python, 0, 2, "--mem-mib", "4")
    hung = start_worker(torch_python, 1, 2, "--mem-mib", "4", "--orphan-linger", "1.5")
    hung.send(state="hold")
    assert hung.ack() == "1 hold"
    healthy.proc.stdin.close()
    hung.proc.stdin.close()
    assert healthy.wait() == 0
    assert hung.proc.poll() is None  # orphaned while hung: it stays
    assert hung.wait(timeout=30) == 0  # ... for --orphan-linger seconds


def test_bad_rank_is_one_line_and_exit_2(torch_python):
    proc = subprocess.run(
        [torch_python, "-m", "soak.rigs.cuda_worker", "--rank", "3", "--pp-size", "2", "--device", "cpu"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "cuda_worker: --rank 3 is outside 0..1"


# -- on a real GPU ---------------------------------------------------------------------


async def _until(source, predicate, what, tries=60):
    sample = None
    for _ in range(tries):  # bounded: about 30 s
        sample = await source.read()
        if sample.error is None and predicate(sample.gpus):
            return sample
        await asyncio.sleep(0.5)
    raise AssertionError(f"never saw {what}; last reading: {sample}")


@pytest.mark.gpu
async def test_deadlock_signature_on_one_gpu_read_per_process(gpu_python, start_worker):
    """Three stages share GPU 0: per-process NVML shows 0..1 busy and the last at 0%,
    SIGTERM leaves them all, SIGKILL frees the GPU."""
    pynvml = pytest.importorskip("pynvml")
    from soak.probes.process_source import NvmlProcessGpuSource

    workers = [start_worker(gpu_python, rank, 3, "--mem-mib", "1024", device="cuda") for rank in range(3)]
    pids = {w.proc.pid for w in workers}
    source = NvmlProcessGpuSource(stages=3, clock=SystemClock(), window_s=2.0)
    await source.open()
    try:
        for w in workers:
            w.send(state="busy", util=0.8)
            w.ack()
        healthy = await _until(source, lambda g: len(g) == 3 and all(r.util_pct > 30 for r in g), "three busy stages")
        assert all(r.mem_used_mib >= 1024 for r in healthy.gpus)
        for w, state in zip(workers, ("spin", "spin", "hold")):
            w.send(state=state)
            w.ack()
        stalled = await _until(
            source, lambda g: g[0].util_pct >= 90 and g[1].util_pct >= 90 and g[2].util_pct <= 5, "the tail stall"
        )
        assert stalled.gpus[2].mem_used_mib >= 1024  # the last stage holds its memory
        assert all(_alive_after_sigterm(w.proc) for w in workers)
        for w in workers:
            kill_tree(w.proc)
        await _until(source, lambda g: all(not r.pids for r in g), "the GPU free")
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert not pids & {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        pynvml.nvmlShutdown()
    finally:
        await source.aclose()
