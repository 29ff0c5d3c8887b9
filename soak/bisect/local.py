"""The local executor: one segment at a time on this machine, each an ordinary
``python -m soak run`` in its own process group (its own session), so the
segment's run directory is one that report, history and compare read, and a
Ctrl-C at the terminal reaches the bisect only: closing the executor stops its
own child's group, never anything else.

A segment's config is the build's run config (``config.segment_config``) with
seeds of its own, derived from the bisect's seed and the segment's directory
name: every segment is a fresh draw (a simulated build's onset too), and a
resumed bisect draws the same seeds for the same segments. The build's env goes
to the child through its environment, never into a file, and so does every
secret of its config (``seal``: the command's, a credential URL anywhere): the
file, which a Slurm job reads on another node later, holds a placeholder for
each, resolved from the environment when the segment starts (soak.bisect.unseal).

The child gets SIGTERM if the bisect dies (PR_SET_PDEATHSIG): a SIGKILLed
bisect leaves a segment that ends itself like an interrupted ``soak run``
(results so far kept, server killed), which the resumed bisect reads back.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import yaml

from soak.bisect.executor import Build, SegmentResult
from soak.bisect.unseal import RUN
from soak.errors import ConfigError, SoakError

RUNNING = ".running"  # DIR/.running: "PID START RUN_DIR" of the segment in flight (RUN_DIR resolved)


class SegmentFailed(SoakError):
    """A segment's ``soak run`` could not run (its exit status says why); the
    bisect ends with it rather than soak a build that cannot start again and again."""

    def __init__(self, message: str, *, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def segment_seed(seed: int, run_dir: Path) -> int:
    digest = hashlib.sha256(f"soak-bisect/{seed}/{run_dir.name}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def seeded(config: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """The segment config with its own seeds: the run's (workload) and a simulator's."""
    out = copy.deepcopy(dict(config))
    out["seed"] = seed
    target = out.get("target")
    if isinstance(target, dict) and target.get("kind", "simulator") == "simulator":
        sim = dict(target.get("sim") or {})
        sim["seed"] = seed
        target["sim"] = sim
    return out


def seal(config: Mapping[str, Any], *, python: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The segment config with every secret in it replaced by a placeholder
    (``{SOAK_BISECT_<n>_SECRET}``, soak.bisect.unseal) and the environment that
    fills them. The redactor decides, over the whole config, not a parser of the
    command: every string it would change (a URL with credentials anywhere,
    ``pushgateway.url`` too; ``HF_TOKEN=T`` in a command; a value it learned from
    the command or ``target.env``), every value of a secret-named key, and, by
    position as ``redact_argv`` finds them, the values of a command's secret
    flags (``--api-key K``, short ones too). ``NAME=VALUE`` keeps its name in the
    file. A launched command with a placeholder runs through ``python -m
    soak.bisect.unseal``; the rest is resolved as the segment's run reads it."""
    import shlex

    from soak.bisect.unseal import variable
    from soak.redact import REDACTED, Redactor, redact_argv, secret_name

    out = copy.deepcopy(dict(config))
    target = out.get("target") if isinstance(out.get("target"), dict) else None
    command = target.get("command") if target is not None and target.get("kind") == "launched" else None
    argv = None
    if command:
        argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    target_env = target.get("env") if target is not None and isinstance(target.get("env"), dict) else None
    redactor = Redactor.for_run(environ={}, command=argv or (),
                                env={str(k): str(v) for k, v in target_env.items()} if target_env else None)
    # every shape and secret-named key's value learned first: a value seen once is hidden everywhere
    _strings(out, redactor.text, redactor.learn)
    env: dict[str, str] = {}

    def hide(value: str) -> str:
        name = next((k for k, v in env.items() if v == value), None) or variable(len(env))
        env[name] = value
        return "{" + name + "}"

    def seal_string(text: str, *, always: bool = False, whole: bool = False) -> str:
        if not text or (not always and redactor.text(text) == text):
            return text
        name, eq, value = text.partition("=")
        if not whole and eq and value and name and all(c in _NAME_CHARS for c in name) and redactor.text(name + eq) == name + eq:
            return name + eq + hide(value)  # HF_TOKEN=T, --hf-token=T: the name stays readable
        return hide(text)

    def walk(obj: Any) -> Any:
        if isinstance(obj, str):
            return seal_string(obj)
        if isinstance(obj, dict):
            return {k: (seal_string(v, always=True) if isinstance(v, str) and isinstance(k, str) and secret_name(k)
                        else walk(v)) for k, v in obj.items()}
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        return obj

    sealed_command = None
    if argv is not None:
        by_position = redact_argv(argv)
        # a flag's value after it (``--api-key K``) is hidden whole, whatever it looks like
        sealed_command = [seal_string(arg, always=shown != arg and REDACTED in shown, whole=shown == REDACTED)
                          for arg, shown in zip(argv, by_position)]
        target["command"] = []  # its place kept; sealed by position above
    out = walk(out)
    if sealed_command is not None:
        commanded = any("{" + name + "}" in arg for arg in sealed_command for name in env)
        out["target"]["command"] = [python, "-m", "soak.bisect.unseal", *sealed_command] if commanded else command
    return out, env


_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def _strings(obj: Any, see: Callable[[str], Any], secret: Callable[[str], Any]) -> None:
    """``see`` every string in ``obj``; ``secret`` every string value of a secret-named key."""
    from soak.redact import secret_name

    if isinstance(obj, str):
        see(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _strings(k, see, secret)
            if isinstance(k, str) and isinstance(v, str) and secret_name(k):
                secret(v)
            _strings(v, see, secret)
    elif isinstance(obj, list):
        for v in obj:
            _strings(v, see, secret)


def config_digest(config: Mapping[str, Any]) -> str:
    """A build's segment config, sealed (no secret in it), as a digest: what
    bisect.json keeps so a resume can tell the build changed under its label."""
    import json

    sealed, _ = seal(config, python="python")
    for derived in ("duration", "name"):  # the segment length (compared on its own) and the bisect's name
        sealed.pop(derived, None)
    return hashlib.sha256(json.dumps(sealed, sort_keys=True, default=str).encode()).hexdigest()


def die_with_parent(parent: int) -> Callable[[], None]:
    """The child's hook before exec: SIGTERM when the bisect dies
    (PR_SET_PDEATHSIG), and an exit if it already has (died between fork and
    prctl: the signal would never come, and the segment would run its full
    length). prctl is looked up here, in the parent: nothing that can take a
    lock (an import, ctypes' loading) runs between fork and exec."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: a killed bisect leaves its segment to end at its duration
        prctl = None

    def hook() -> None:
        if prctl is not None:
            prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(128 + signal.SIGTERM)

    return hook


def process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (/proc/PID/stat field 22): with the PID,
    one process, never a later one that reuses the number."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
        return stat[stat.rindex(")") + 2:].split()[19]
    except (OSError, ValueError, IndexError):
        return None


class LocalExecutor:
    slots = 1

    def __init__(self, *, root: Path, segment_configs: Sequence[Mapping[str, Any]],
                 envs: Sequence[Mapping[str, str]], seed: int = 0, environ: Mapping[str, str] | None = None,
                 python: str = sys.executable, grace_s: float = 30.0, slack_s: float = 300.0) -> None:
        self.root, self.seed, self.python = root, seed, python
        # A build's secrets leave its config for the environment its segments get
        # (here and, through ``envs``, the Slurm executor's sbatch export).
        sealed = [seal(c, python=python) for c in segment_configs]
        self.configs = [c for c, _ in sealed]
        self.envs = [{**e, **s} for e, (_, s) in zip(envs, sealed)]
        self.sealed = [bool(s) for _, s in sealed]
        self.environ = dict(os.environ if environ is None else environ)
        self.grace_s, self.slack_s = grace_s, slack_s
        self._proc: asyncio.subprocess.Process | None = None
        self._current: tuple[Build, Path, float] | None = None

    def command(self, build: Build, *, segment_s: float, run_dir: Path) -> tuple[list[str], Path, float]:
        """Write the segment's config; the ``soak run`` command, its config file and its time bound."""
        config = seeded(self.configs[build.index], segment_seed(self.seed, run_dir))
        folder = self.root / "configs"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{run_dir.name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        # a sealed config's placeholders are resolved from the environment as the run reads it
        runner = ["soak.bisect.unseal", RUN] if self.sealed[build.index] else ["soak", "run"]
        argv = [self.python, "-m", *runner, str(path), "--out", str(run_dir), "--view", "plain"]
        exporter = config.get("exporter")
        if not (isinstance(exporter, dict) and "port" in exporter):
            argv += ["--exporter-port", "0"]  # segments never fight over the harness's default port
        target = config.get("target") if isinstance(config.get("target"), dict) else {}
        from soak.durations import parse_duration

        startup = parse_duration(target.get("startup_timeout", 1800 if target.get("kind") == "launched" else 60))
        bound = parse_duration(config["duration"]) + startup + self.slack_s
        return argv, path, bound

    async def submit(self, build: Build, *, segment_s: float, run_dir: Path) -> None:
        if self._proc is not None:
            raise RuntimeError("the local executor runs one segment at a time")
        argv, _, bound = self.command(build, segment_s=segment_s, run_dir=run_dir)
        with open(self.root / "configs" / f"{run_dir.name}.log", "wb") as log:  # the child keeps its own copy
            self._proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
                env={**self.environ, **self.envs[build.index]}, start_new_session=True,
                preexec_fn=die_with_parent(os.getpid()))
        (self.root / RUNNING).write_text(
            f"{self._proc.pid} {process_start(self._proc.pid)} {run_dir.resolve()}\n", encoding="utf-8")
        self._current = (build, run_dir, bound)

    async def next_done(self) -> SegmentResult:
        assert self._proc is not None and self._current is not None
        build, run_dir, bound = self._current
        try:
            code = await asyncio.wait_for(self._proc.wait(), timeout=bound)
        except asyncio.TimeoutError:
            await self._stop()
            code = None
        self._proc = self._current = None
        (self.root / RUNNING).unlink(missing_ok=True)
        log = self.root / "configs" / f"{run_dir.name}.log"
        if code in (2, 3, 4):
            why = {2: "its config was refused", 3: "the target never became ready or the environment lacks "
                   "something", 4: "the harness failed"}[code]
            raise SegmentFailed(f"segment {run_dir.name} (build {build.label}): soak run exited {code}, {why} "
                                f"(see {log})", exit_code=3 if code == 3 else 4)
        from soak.bisect.segments import NOTHING_ANSWERED, read_segment

        try:
            result = read_segment(run_dir, build=build.index)
        except ConfigError as exc:
            raise SegmentFailed(f"segment {run_dir.name}: its run directory cannot be read: {exc} (see {log})",
                                exit_code=4) from exc
        if result.ended_by == NOTHING_ANSWERED:
            # Counted as nothing, soaking it again would only repeat the failure: end here.
            raise SegmentFailed(f"segment {run_dir.name} (build {build.label}): its server answered no request "
                                f"ok; the build cannot be soaked (see {run_dir / 'report.html'})", exit_code=3)
        return result

    async def _stop(self) -> None:
        """SIGTERM to the child's own group (soak run ends as interrupted: its
        results kept, its server killed), SIGKILL to that group after the grace."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        for sig, wait in ((signal.SIGTERM, self.grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)  # the group is the child's: start_new_session made it its leader
            except ProcessLookupError:
                return
            try:
                await asyncio.wait_for(proc.wait(), timeout=wait)
                return
            except asyncio.TimeoutError:
                continue

    async def aclose(self) -> None:
        await self._stop()
        self._proc = self._current = None
        (self.root / RUNNING).unlink(missing_ok=True)


def wait_for_orphan(root: Path, *, grace_s: float = 30.0) -> None:
    """Before a resume: stop a segment the killed bisect left running, as the
    executor stops its own (SIGTERM to its group, SIGKILL after the grace), and
    wait for it to be gone so its run directory is complete when read back. Only
    the process ``.running`` names, the same one (its start time), running under
    this folder (however ``root`` is spelled): never a later process with its PID."""
    import time

    marker = root / RUNNING
    try:
        pid_text, start, run_dir = marker.read_text(encoding="utf-8").split(maxsplit=2)
        pid = int(pid_text)
    except (OSError, ValueError):
        marker.unlink(missing_ok=True)
        return

    def ours() -> bool:
        return (process_start(pid) == start and Path(run_dir.strip()).parent == root.resolve()
                and "Z" != Path(f"/proc/{pid}/stat").read_text(errors="replace").rsplit(")", 1)[-1].split()[0])

    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            if not ours():
                break
            os.killpg(pid, sig)  # its own group: start_new_session made it the leader
        except (OSError, ValueError):
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                if not ours():
                    break
            except OSError:
                break  # gone
            time.sleep(0.1)
        else:
            continue
        break
    marker.unlink(missing_ok=True)
