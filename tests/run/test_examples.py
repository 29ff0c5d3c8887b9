"""The shipped example configs for the real box are complete, valid run configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from soak.cli import main as soak_main
from soak.config import load_run_config, redacted_config
from soak.target.config import target_layout

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates(path: Path, capsys) -> None:
    assert soak_main(["validate", str(path)]) == 0
    assert "ok (" in capsys.readouterr().out


def test_the_launch_example_is_the_facts_launch_line() -> None:
    config = load_run_config(EXAMPLES[[p.name for p in EXAMPLES].index("rtx3090-launch.yaml")])
    command = " ".join(config.target.command)
    for flag in ("--pipeline-parallel-size 8", "--tensor-parallel-size 1", "--distributed-executor-backend mp",
                 '"method":"dspark","num_speculative_tokens":5', "--kv-cache-dtype fp8", "--block-size 256",
                 "--max-num-seqs 12", "--max-num-batched-tokens 256", "--enable-prefix-caching",
                 "--max-model-len 327680"):
        assert flag in command, flag
    assert config.target.env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    layout = target_layout(config.target)
    assert (layout.pp_size, layout.tp_size, layout.block_size) == (8, 1, 256)


def test_an_api_key_in_a_launch_command_is_redacted(tmp_path) -> None:
    path = tmp_path / "k.yaml"
    path.write_text("target: {kind: launched, command: 'vllm serve m --api-key sk-abc', env: {MY_TOKEN: t0k}}\n")
    data = redacted_config(load_run_config(path))
    assert data["target"]["command"][-1] == "***" and data["target"]["env"]["MY_TOKEN"] == "***"
