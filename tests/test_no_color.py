"""NO_COLOR (https://no-color.org): set and not empty, the harness writes no ANSI colour
anywhere; the live view on a terminal and the end block included. Real ``soak run``
subprocesses against the simulator, on a pipe (FORCE_COLOR asks for colour there) and
on a pseudo-terminal (the rich live view)."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent / "run"))

from soakrun_helpers import small_config, soak_cmd, write_config  # noqa: E402
from soak.colour import colour_wanted, no_color  # noqa: E402

pytestmark = pytest.mark.timeout(300)

ESC = "\x1b["
# an SGR sequence that sets a colour: 30-37, 38;..., 39, 40-49, 90-97, 100-107
COLOUR_SGR = re.compile(r"\x1b\[([0-9;]*)m")


def _colours(text: str) -> list[str]:
    found = []
    for params in COLOUR_SGR.findall(text):
        parts = params.split(";")
        i = 0
        while i < len(parts):
            p = int(parts[i]) if parts[i].isdigit() else 0
            if 30 <= p <= 49 or 90 <= p <= 107:
                found.append(params)
                break
            i += 1
    return found


class _Tty:
    def __init__(self, tty: bool) -> None:
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


names = st.sampled_from(["NO_COLOR", "FORCE_COLOR", "TERM", "HOME"])
values = st.sampled_from(["", "0", "1", "true", "x"])


@given(environ=st.dictionaries(names, values), tty=st.booleans())
def test_no_color_set_and_not_empty_wins_over_everything(environ, tty):
    wanted = colour_wanted(_Tty(tty), environ)
    if environ.get("NO_COLOR", "") != "":
        assert not wanted and no_color(environ)
    elif environ.get("FORCE_COLOR", "") not in ("", "0"):
        assert wanted
    else:
        assert wanted == tty  # an empty NO_COLOR is no request (the convention's wording)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env.update(COLUMNS="120", LINES="40", TERM="xterm-256color", **extra)
    return env


def _config(tmp_path: Path, mode: str) -> Path:
    config = small_config(duration="3s", view={"mode": mode, "refresh": "0.2s", "plain_interval": "1s"})
    config["workload"]["tokenizer"] = {"kind": "estimate"}
    return write_config(tmp_path / f"run-{mode}.yaml", config)


@pytest.mark.parametrize("no_color_value", ["1", None])
def test_a_run_on_a_pipe_writes_no_escape_under_no_color(tmp_path, no_color_value):
    extra = {"FORCE_COLOR": "1", **({"NO_COLOR": no_color_value} if no_color_value else {})}
    done = subprocess.run(soak_cmd("run", str(_config(tmp_path, "plain")), "--out", str(tmp_path / "run")),
                          capture_output=True, text=True, timeout=200, env=_env(**extra))
    assert done.returncode == 0, done.stderr
    both = done.stdout + done.stderr
    assert "verdict" in both.lower() or "pass" in both.lower()
    if no_color_value:
        assert ESC not in both, [line for line in both.splitlines() if ESC in line][:3]
    else:  # the same run asked for colour: the end block is painted (so the check above can fail)
        assert _colours(done.stderr), done.stderr[-2000:]


def _run_on_a_tty(cmd: list[str], env: dict[str, str]) -> tuple[int, str]:
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    out = io.BytesIO()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer closed its end
                return
            if not chunk:
                return
            out.write(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=200)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    os.close(master)
    return code, out.getvalue().decode("utf-8", "replace")


@pytest.mark.parametrize("no_color_value", ["1", None])
def test_the_live_view_and_end_block_on_a_terminal_carry_no_colour_under_no_color(tmp_path, no_color_value):
    extra = {"NO_COLOR": no_color_value} if no_color_value else {}
    code, text = _run_on_a_tty(soak_cmd("run", str(_config(tmp_path, "auto")), "--out", str(tmp_path / "run")),
                               _env(**extra))
    assert code == 0, text[-3000:]
    assert ESC in text  # the rich live view ran (it moves the cursor on a terminal either way)
    if no_color_value:
        assert not _colours(text), _colours(text)[:5]
    else:
        assert _colours(text)
