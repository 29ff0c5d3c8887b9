"""`soak validate` and `soak run` on inputs past the bounds (soak.bounds): a
workload path of /dev/zero, a file with one gigantic line, YAML nested past the
depth or made of aliases. Each is exit 2 with one line naming the file and the
line, quickly and in bounded memory (the harness's peak RSS, read through a
small parent process that only waits for it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peak_rss import soak_peak_rss
from soak.bounds import LIMITS
from soak.config import load_run_config
from soak.errors import ConfigError

RSS_BOUND_KIB = 500 * 1024


def replay_config(tmp_path: Path, path: str) -> Path:
    config = tmp_path / "replay.yaml"
    config.write_text(f"duration: 10s\nworkload:\n  kind: replay_jsonl\n  path: {path}\n")
    return config


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_a_workload_path_of_dev_zero_is_exit_2_naming_the_line_in_bounded_memory(tmp_path) -> None:
    code, rss, stderr = soak_peak_rss("validate", str(replay_config(tmp_path, "/dev/zero")), cwd=tmp_path)
    line = one_line(stderr)
    assert code == 2 and "/dev/zero:1:" in line and "line_bytes" in line
    assert rss < RSS_BOUND_KIB, f"peak RSS {rss} KiB"


def test_a_file_with_one_gigantic_line_is_exit_2_naming_it_in_bounded_memory(tmp_path) -> None:
    trace = tmp_path / "trace.jsonl"
    with open(trace, "wb") as fh:
        fh.write(json.dumps({"prompt": "ok", "max_tokens": 4}).encode() + b"\n")
        fh.write(b'{"prompt": "' + b"x" * (LIMITS.line_bytes + 1024) + b'", "max_tokens": 4}\n')
    code, rss, stderr = soak_peak_rss("validate", str(replay_config(tmp_path, str(trace))), cwd=tmp_path)
    line = one_line(stderr)
    assert code == 2 and f"{trace}:2:" in line and "line_bytes" in line
    assert rss < RSS_BOUND_KIB, f"peak RSS {rss} KiB"


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_deeply_nested_config_is_exit_2_with_one_line_not_the_hang_code(tmp_path, command) -> None:
    config = tmp_path / "deep.yaml"
    config.write_text("duration: 10s\nthresholds: " + "[" * 100_000 + "]" * 100_000 + "\n")
    code, rss, stderr = soak_peak_rss(command, str(config), *(["--out", str(tmp_path / "run")] if command == "run" else []),
                                 cwd=tmp_path)
    line = one_line(stderr)
    assert code == 2 and f"{config}:2:" in line and "nesting_depth" in line
    assert not (tmp_path / "run").exists()


def test_a_nested_workload_line_is_exit_2_naming_its_line(tmp_path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"prompt": "ok", "max_tokens": 4}\n' + '{"prompt": "a", "x": ' + "[" * 100_000
                     + "]" * 100_000 + "}\n")
    code, _, stderr = soak_peak_rss("validate", str(replay_config(tmp_path, str(trace))), cwd=tmp_path)
    assert code == 2 and f"{trace}:2:" in one_line(stderr) and "nesting_depth" in stderr


yaml_bombs = st.one_of(
    st.integers(130, 5000).map(lambda d: "thresholds: " + "[" * d + "]" * d + "\n"),
    st.integers(130, 5000).map(lambda d: "thresholds: " + "{a: " * d + "1" + "}" * d + "\n"),
    st.integers(130, 400).map(lambda d: "".join(" " * i + f"k{i}:\n" for i in range(d)) + " " * d + "v: 1\n"),
    st.integers(1001, 1500).map(lambda n: "x: &a [1]\nthresholds: [" + ", ".join(["*a"] * n) + "]\n"),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=yaml_bombs, head=st.sampled_from(["", "duration: 10s\n", "# comment\nname: x\n"]))
def test_any_yaml_past_the_bounds_is_one_config_error_naming_the_file(tmp_path, text, head) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(head + text)
    with pytest.raises(ConfigError) as caught:
        load_run_config(config)
    assert caught.value.path == str(config) and caught.value.line is not None
    assert "bound" in caught.value.message
