"""Pure parts of the responder: the stop/restart policy, the flight-recorder
environment, the GPU-release rule, the config section's errors."""

from __future__ import annotations

import os
import stat

import pytest

from soak.config import load_run_config
from soak.errors import ConfigError
from soak.respond.config import ResponseConfig
from soak.respond.flight import default_flight_recorder_paths, flight_recorder_env
from soak.respond.policy import Action, next_action
from soak.respond.flight import request_dumps
from soak.respond.gpu import learn_baselines, still_held
from soak.samples import GpuReading, GpuSample, GpuSource


def test_stop_is_the_default_and_ends_the_soak():
    decision = next_action(ResponseConfig(), restarts_done=0)
    assert decision.action is Action.STOP and "stop" in decision.reason


def test_restart_until_max_restarts_then_stop():
    config = ResponseConfig(on_hang="restart", max_restarts=2)
    assert [next_action(config, restarts_done=n).action for n in range(4)] == [
        Action.RESTART, Action.RESTART, Action.STOP, Action.STOP,
    ]
    assert "max_restarts (2)" in next_action(config, restarts_done=2).reason


def test_an_attached_server_cannot_be_restarted_by_the_harness():
    decision = next_action(ResponseConfig(on_hang="restart"), restarts_done=0, can_restart=False)
    assert decision.action is Action.STOP and "cannot be restarted" in decision.reason


def test_flight_recorder_env_sets_both_spellings(tmp_path):
    env = flight_recorder_env(tmp_path, str(tmp_path / "pipe_rank_"))
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == env["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == env["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "nccl_trace_rank_")
    # torch reads the pipe under its TORCH_NCCL_ name only, and its default
    # async error handling (3) is left alone: setting it changes nothing.
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == str(tmp_path / "pipe_rank_")
    assert "TORCH_FR_DEBUG_INFO_PIPE_FILE" not in env
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in env
    paths = default_flight_recorder_paths(tmp_path)
    assert paths.dump_prefix.startswith(str(tmp_path.resolve() / "nccl"))


def test_a_pipe_nobody_reads_is_noted_and_never_blocks(tmp_path):
    os.mkfifo(tmp_path / "pipe_rank_0.pipe")
    written, notes = request_dumps(str(tmp_path / "pipe_rank_"))
    assert written == [] and notes == [f"{tmp_path / 'pipe_rank_0.pipe'}: no reader"]
    assert stat.S_ISFIFO(os.stat(tmp_path / "pipe_rank_0.pipe").st_mode)


def gpu(index, mem, pids=()):
    return GpuReading(index=index, util_pct=0.0, mem_used_mib=mem, pids=tuple(pids))


def test_memory_back_is_measured_from_a_learned_baseline_or_from_settled_readings():
    idle = GpuSample(0.0, GpuSource.NVML, (gpu(0, 615.0), gpu(1, 9000.0, pids=[7])))
    baselines = learn_baselines([idle])
    assert baselines == {0: 615.0}  # GPU 1 listed a process: no baseline from it
    after = GpuSample(1.0, GpuSource.NVML, (gpu(0, 1000.0), gpu(1, 700.0)))
    reasons = still_held(after, {7}, tolerance_mib=512.0, baselines=baselines)
    assert len(reasons) == 1 and "no baseline" in reasons[0]  # GPU 1: first reading after the kill
    again = GpuSample(2.0, GpuSource.NVML, (gpu(0, 1000.0), gpu(1, 700.0)))
    assert still_held(again, {7}, tolerance_mib=512.0, baselines=baselines, previous=after) == []
    still = GpuSample(3.0, GpuSource.NVML, (gpu(0, 1200.0), gpu(1, 700.0, pids=[7])))
    reasons = still_held(still, {7}, tolerance_mib=512.0, baselines=baselines, previous=again)
    assert reasons == ["gpu 0 uses 1200 MiB > 1127 MiB allowed (baseline 615)", "gpu 1 lists target pids [7]"]


def test_bad_response_settings_are_one_line_naming_the_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("response:\n  on_hang: sometimes\n")
    with pytest.raises(ConfigError) as info:
        load_run_config(path)
    assert str(info.value).startswith(f"{path}: response.on_hang:")
    path.write_text("response:\n  evidence:\n    py_spyy: true\n")
    with pytest.raises(ConfigError, match=r"response\.evidence\.py_spyy: unknown key"):
        load_run_config(path)


def test_an_attached_servers_dumps_are_looked_for_where_torch_writes_them(tmp_path):
    from soak.respond.flight import torch_default_dump_prefix

    assert torch_default_dump_prefix({"HOME": "/home/u"}) == "/home/u/.cache/torch/comm_lib_trace_rank_"
    assert torch_default_dump_prefix({"HOME": "/home/u", "XDG_CACHE_HOME": "/c"}) == "/c/torch/comm_lib_trace_rank_"
    assert torch_default_dump_prefix({"HOME": "/h", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/d/t_"}) == "/d/t_"
    assert torch_default_dump_prefix(None) is None


def test_attached_paths_are_read_from_the_servers_own_environment(tmp_path):
    import subprocess
    import sys

    from soak.respond.flight import attached_flight_recorder_paths

    env = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
           "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "p_"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        paths = attached_flight_recorder_paths(proc.pid, run_dir=tmp_path / "run")
        assert paths.dump_prefix == str(tmp_path / "xdg" / "torch" / "comm_lib_trace_rank_")
        assert paths.pipe_stem == str(tmp_path / "p_")
    finally:
        proc.kill()
        proc.wait()
    gone = attached_flight_recorder_paths(proc.pid, run_dir=tmp_path / "run")
    assert gone.dump_prefix.startswith(str((tmp_path / "run").resolve()))
