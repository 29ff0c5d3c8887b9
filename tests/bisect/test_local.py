"""The local executor (soak/bisect/local.py): a segment's config with seeds of
its own and no env value in it, its soak run in its own process group, and
closing it stops that group and nothing else."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from soak.bisect.executor import Build
from soak.bisect.local import LocalExecutor, seeded, segment_seed

SIM = {"name": "s", "build": "b0", "duration": "30s", "response": {"on_hang": "stop"},
       "target": {"kind": "simulator", "sim": {"time_scale": 20, "seed": 7,
                                               "faults": [{"kind": "pp_deadlock", "wall_mtbf": "10s"}]}}}
LAUNCHED = {"name": "s", "build": "b1", "duration": "30s",
            "target": {"kind": "launched", "command": ["vllm", "serve", "m"], "startup_timeout": "10m"}}


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**31), st.integers(0, 998))
def test_every_segment_draws_its_own_seeds_and_a_resume_the_same(seed: int, number: int) -> None:
    a, b = Path(f"/d/segment-{number:03d}-build-0"), Path(f"/d/segment-{number + 1:03d}-build-0")
    assert segment_seed(seed, a) == segment_seed(seed, Path("/elsewhere") / a.name)
    assert segment_seed(seed, a) != segment_seed(seed, b)
    out = seeded(SIM, segment_seed(seed, a))
    assert out["seed"] == out["target"]["sim"]["seed"] == segment_seed(seed, a)
    assert SIM["target"]["sim"]["seed"] == 7  # the build's config is not changed in place


def test_the_segment_config_holds_no_env_value(tmp_path: Path) -> None:
    executor = LocalExecutor(root=tmp_path, segment_configs=[SIM, LAUNCHED],
                             envs=[{}, {"HF_TOKEN": "hf_s3cret_value"}], seed=3, environ={})
    argv, path, bound = executor.command(Build(1, "b1"), segment_s=30, run_dir=tmp_path / "segment-000-build-1")
    written = path.read_text()
    assert "hf_s3cret_value" not in written and yaml.safe_load(written)["target"]["command"] == ["vllm", "serve", "m"]
    assert argv[1:4] == ["-m", "soak", "run"] and argv[argv.index("--out") + 1] == str(tmp_path / "segment-000-build-1")
    assert argv[-2:] == ["--exporter-port", "0"]
    assert bound == 30 + 600 + 300  # the run, the target's start-up allowance, the slack


def test_closing_stops_its_own_group_only(tmp_path: Path) -> None:
    # a stand-in for `python -m soak run`: a child that ignores SIGTERM, with a grandchild
    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\ntrap '' TERM\nsleep 300 &\necho $! > \"$(dirname $0)/grandchild\"\nwait\n")
    fake.chmod(0o755)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    try:
        executor = LocalExecutor(root=tmp_path, segment_configs=[SIM, SIM], envs=[{}, {}], python=str(fake),
                                 grace_s=0.5, environ=dict(os.environ))

        async def go() -> int:
            await executor.submit(Build(0, "b0"), segment_s=30, run_dir=tmp_path / "segment-000-build-0")
            deadline = asyncio.get_running_loop().time() + 30  # a loaded CI starts a shell slowly
            while asyncio.get_running_loop().time() < deadline:
                if (tmp_path / "grandchild").is_file() and (tmp_path / "grandchild").read_text().strip():
                    break
                await asyncio.sleep(0.05)
            assert (tmp_path / ".running").read_text().split()[2] == str((tmp_path / "segment-000-build-0").resolve())
            pid = executor._proc.pid
            assert os.getpgid(pid) == pid != os.getpgid(0)  # its own group: a terminal's Ctrl-C is the bisect's
            await executor.aclose()
            await executor.aclose()  # idempotent
            return pid

        child = asyncio.run(go())
        grandchild = int((tmp_path / "grandchild").read_text())
        import time

        def gone(pid: int) -> bool:
            try:
                return "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
            except OSError:
                return True

        deadline = time.monotonic() + 10  # a SIGKILLed process is running its exit for a moment
        while not all(gone(pid) for pid in (child, grandchild)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert gone(child) and gone(grandchild)
        assert bystander.poll() is None and not (tmp_path / ".running").exists()
    finally:
        bystander.send_signal(signal.SIGKILL)
        bystander.wait()


SECRET_FLAGS = ["--api-key", "sk-live-SECRET123", "--hf-token=hf_SECRET456", "--db-url", "postgres://u:pw0rd99@h/db"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["serve", "m", "--port", "8000", "--api-key", "--hf-token=", "-x", "k3y!", "a=b",
                                 "https://u:p4ss@h/?token=t0k3n", "--token", "SOAK", "{", "}"]), max_size=12)
       .map(lambda parts: [p + str(i) if p.endswith("=") else p for i, p in enumerate(parts)]))
def test_a_sealed_command_runs_as_written(argv: list[str]) -> None:
    from soak.bisect.local import seal
    from soak.bisect.unseal import unseal
    from soak.redact import argv_secrets, url_secrets

    command = ["vllm", *argv]
    sealed, env = seal({"target": {"kind": "launched", "command": command}}, python="py")
    got = sealed["target"]["command"]
    inner = got[3:] if env else got
    assert unseal(inner, env) == command
    if env:
        assert got[:3] == ["py", "-m", "soak.bisect.unseal"]
    # every secret travels in the environment: a flag's value whole, a URL's credentials (its skeleton stays)
    for value in set(argv_secrets(command)) - set(env.values()):
        assert any(value in hidden for hidden in env.values()) or (
            "://" in value and set(url_secrets(value)) <= set(env.values()))


def test_secret_flags_never_reach_the_bisect_folder(tmp_path: Path) -> None:
    # the launched "server" records the argv it was given, outside the bisect's folder, and exits
    seen = tmp_path / "seen-argv"
    server = tmp_path / "server"
    server.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {seen}\nenv > {seen}.env\nexit 1\n")
    server.chmod(0o755)
    root = tmp_path / "bisect"
    root.mkdir()
    config = {"name": "s", "build": "b0", "duration": "30s",
              "target": {"kind": "launched", "command": [str(server), "serve", *SECRET_FLAGS],
                         "startup_timeout": "20s"}}
    executor = LocalExecutor(root=root, segment_configs=[config], envs=[{}], environ=dict(os.environ))
    from soak.bisect.local import SegmentFailed

    async def go() -> None:
        await executor.submit(Build(0, "b0"), segment_s=30, run_dir=root / "segment-000-build-0")
        try:
            await executor.next_done()
        except SegmentFailed:
            pass  # the stand-in server exits: the segment's target never became ready
        finally:
            await executor.aclose()

    asyncio.run(go())
    assert seen.read_text().split("\n")[:-1] == ["serve", *SECRET_FLAGS]  # the segment ran the build's command
    assert "SOAK_BISECT_SECRET" not in seen.with_suffix(".env").read_text()  # and no more than it
    files = [p for p in root.rglob("*") if p.is_file()]
    assert any(p.name == "segment-000-build-0.yaml" for p in files) and len(files) > 3
    for path in files:
        data = path.read_bytes()
        for value in ("sk-live-SECRET123", "hf_SECRET456", "pw0rd99"):
            assert value.encode() not in data, f"{value} in {path.relative_to(root)}"


def _stubborn() -> subprocess.Popen:
    ignore_term = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                   "print('up', flush=True); time.sleep(300)")
    return subprocess.Popen([sys.executable, "-c", ignore_term], start_new_session=True, stdout=subprocess.PIPE)


def test_a_resume_stops_the_orphan_segment_however_the_folder_is_spelled(tmp_path: Path, monkeypatch) -> None:
    import time

    from soak.bisect.local import process_start, wait_for_orphan

    orphan = _stubborn()  # a segment that outlived its bisect and ignores SIGTERM
    orphan.stdout.readline()
    try:
        (tmp_path / ".running").write_text(
            f"{orphan.pid} {process_start(orphan.pid)} {(tmp_path / 'segment-003-build-1').resolve()}\n")
        monkeypatch.chdir(tmp_path.parent)
        began = time.monotonic()
        wait_for_orphan(Path(tmp_path.name), grace_s=0.5)  # relative, as typed on the command line
        assert orphan.wait(timeout=10) == -signal.SIGKILL  # SIGTERM, then SIGKILL after the grace
        assert time.monotonic() - began < 12 and not (tmp_path / ".running").exists()
    finally:
        orphan.kill()
        orphan.wait()


def test_a_resume_leaves_a_process_that_only_reuses_the_pid_alone(tmp_path: Path) -> None:
    from soak.bisect.local import wait_for_orphan

    bystander = _stubborn()
    bystander.stdout.readline()
    try:
        (tmp_path / ".running").write_text(f"{bystander.pid} 1 {(tmp_path / 'segment-000-build-0').resolve()}\n")
        wait_for_orphan(tmp_path, grace_s=0.5)
        assert bystander.poll() is None and not (tmp_path / ".running").exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_a_segment_whose_bisect_is_already_gone_does_not_run() -> None:
    from soak.bisect.local import die_with_parent

    command = [sys.executable, "-c", "print('ran')"]
    gone = subprocess.run(command, check=False, preexec_fn=die_with_parent(os.getpid() + 1), capture_output=True, text=True)
    assert gone.returncode == 128 + signal.SIGTERM and gone.stdout == ""
    alive = subprocess.run(command, check=False, preexec_fn=die_with_parent(os.getpid()), capture_output=True, text=True)
    assert alive.returncode == 0 and alive.stdout == "ran\n"


def test_a_segment_whose_server_answered_nothing_ends_the_bisect(tmp_path: Path) -> None:
    import shutil

    import pytest

    from soak.bisect.local import SegmentFailed

    answered_nothing = tmp_path / "prepared"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "pass", answered_nothing)
    requests = answered_nothing / "requests.jsonl"
    requests.write_text(requests.read_text().replace('"outcome":"ok"', '"outcome":"http_error"'))
    fake = tmp_path / "fake-python"  # a stand-in `soak run` that writes that run directory at --out
    fake.write_text(f"#!/bin/sh\ncp -r {answered_nothing} \"$6\"\n")
    fake.chmod(0o755)
    root = tmp_path / "bisect"
    root.mkdir()
    executor = LocalExecutor(root=root, segment_configs=[SIM], envs=[{}], python=str(fake), environ=dict(os.environ))

    async def go() -> None:
        await executor.submit(Build(0, "b0"), segment_s=30, run_dir=root / "segment-000-build-0")
        await executor.next_done()

    with pytest.raises(SegmentFailed, match="answered no request") as failed:
        asyncio.run(go())
    assert failed.value.exit_code == 3


def test_a_slurm_job_gets_the_secrets_through_sbatch_s_environment_not_the_file(tmp_path: Path) -> None:
    from soak.bisect.cli import _slurm_executor
    from soak.bisect.spec import load_bisect

    sim = {"kind": "simulator"}
    launched = {"kind": "launched", "command": "vllm serve m --api-key sk-live-SECRET123 --hf-token=hf_SECRET456"}
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({
        "segment": "5s", "executor": {"kind": "slurm", "slots": 2},
        "builds": [{"label": "b0", "target": sim}, {"label": "b1", "target": launched, "env": {"A": "1"}}]}))
    spec = load_bisect(tmp_path / "b.yaml")
    local = LocalExecutor(root=tmp_path, segment_configs=spec.segment_configs, envs=spec.envs, environ={})
    slurm = _slurm_executor(spec.config, local=local, envs=local.envs, environ={}, out=tmp_path, say=print)
    argv = slurm.segment_command(Build(1, "b1"), 5.0, tmp_path / "segment-000-build-1")
    written = Path(argv[4]).read_text()  # python -m soak run CONFIG: the file the job reads on its node
    for value in ("sk-live-SECRET123", "hf_SECRET456"):
        assert value not in written and value not in " ".join(argv)
    assert {"A": "1"}.items() <= slurm.build_env(Build(1, "b1")).items()
    assert sorted(slurm.build_env(Build(1, "b1")).values()) == ["1", "hf_SECRET456", "sk-live-SECRET123"]
