"""The per-process GPU source maps every vLLM worker title to its pipeline stage."""

from __future__ import annotations

import pytest

from soak.probes.process_source import stage_of


@pytest.mark.parametrize("cmdline,stage", [
    (["VLLM::Worker_PP3"], 3),
    (["VLLM::Worker_DP0_PP3_TP1"], 3),
    (["VLLM::Worker_PP7_PCP1_TP2_DCP0_EP4"], 7),
    (["VLLM::Worker_DP1_PP2_EP3"], 2),
    (["VLLM::Worker_TP1"], 0),  # one pipeline stage: no _PP part
    (["MYBOX::Worker_PP5_TP0"], 5),  # VLLM_PROCESS_NAME_PREFIX
    (["VLLM::Worker"], None),  # 0.33 before its groups are set up: not placed yet
    (["VLLM::EngineCore"], None),
    (["VLLM::APIServer_0"], None),
    (["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "m"], None),  # the one untitled API server
    (["VLLM::Worker_TP1_PP3"], None),  # not an order vLLM writes: no guess
    (["python", "-m", "soak.rigs.cuda_worker", "--rank", "4"], 4),
])
def test_stage_of(cmdline, stage):
    assert stage_of(cmdline) == stage


def test_a_bare_worker_is_read_again_once_titled():
    from soak.probes import process_source

    titles = {101: ["VLLM::Worker"]}
    source = process_source.NvmlProcessGpuSource.__new__(process_source.NvmlProcessGpuSource)
    source._pid_stage = {}
    source._cmdline_of = lambda pid: titles[pid]
    # the read loop's rule: an unplaced PID is looked up again on the next read
    for expected in (None, 3):
        if source._pid_stage.get(101) is None:
            source._pid_stage[101] = stage_of(source._cmdline_of(101))
        assert source._pid_stage[101] == expected
        titles[101] = ["VLLM::Worker_PP3_TP0"]
