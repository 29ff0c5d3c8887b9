"""scripts/real-vllm's TMPDIR (vLLM binds its IPC sockets there) is a folder of this
user's, mode 700, or the script refuses: /tmp is shared, and a folder or link someone
else made first under that name would put the sockets in their reach."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "real-vllm"


def _env(home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), "env"], env=dict(os.environ, REAL_VLLM_HOME=str(home)),
                          capture_output=True, text=True, timeout=60)


def _tmpdir(home: Path) -> Path:
    done = _env(home)
    assert done.returncode == 0, done.stderr
    return Path(next(line.split("=", 1)[1] for line in done.stdout.splitlines() if line.startswith("TMPDIR=")))


def _named(home: Path) -> Path:
    """The folder the script names for ``home``, computed as it does (POSIX cksum of the path)."""
    crc = subprocess.run(["cksum"], input=str(home), capture_output=True, text=True, check=True).stdout.split()[0]
    return Path(f"/tmp/soak-real-vllm-{os.getuid()}-{crc}")


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home"
    yield home
    tmp = _named(home)  # outside tmp_path: removed whatever state the test left it in
    if tmp.is_symlink():
        tmp.unlink()
    shutil.rmtree(tmp, ignore_errors=True)


def test_its_own_folder_is_made_private(home):
    tmp = _tmpdir(home)
    assert tmp == _named(home)
    tmp.chmod(0o777)
    assert _tmpdir(home) == tmp and (tmp.stat().st_mode & 0o777) == 0o700


def test_a_link_in_its_place_is_refused(home, tmp_path):
    tmp = _tmpdir(home)
    tmp.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    tmp.symlink_to(elsewhere)
    try:
        done = _env(home)
        assert done.returncode == 2
        assert done.stderr.strip().count("\n") == 0 and str(tmp) in done.stderr and "Traceback" not in done.stderr
    finally:
        tmp.unlink()


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user owns needs root")
def test_a_folder_another_user_owns_is_refused(home):
    tmp = _tmpdir(home)
    os.chown(tmp, 65534, 65534)  # nobody
    done = _env(home)
    assert done.returncode == 2 and "owned by someone else" in done.stderr
