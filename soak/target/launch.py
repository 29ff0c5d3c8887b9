"""What a server the harness starts runs, read on the harness side for the build
identity (``soak.history.build``): two nights with the same flags and ``/version``
but another server script, NCCL (``LD_LIBRARY_PATH``) or venv (``PYTHONPATH``)
are two builds, and swapping NCCL or a venv is exactly how a fix is tried.

``read_launch(spec)`` records, from the launch command and the environment the
launcher gives it (``LaunchSpec``, made by ``ProcessTarget.launch_spec``):

- ``executable``: ``argv[0]`` as the launch finds it (``PATH`` of the launch's
  environment, or relative to its ``cwd``), where it resolves, and the file's
  sha256 where it is a readable regular file;
- ``script``: the script or ``-m`` module it runs (a Python interpreter's first
  argument, a shell's script), its file and sha256;
- ``interpreter``: the server's own Python (``argv[0]``, or a console script's
  ``#!`` line such as ``vllm``'s); ``packages``: vllm, torch and the NCCL wheels
  as that interpreter's ``importlib.metadata`` reads them, and ``imported_from``:
  the folder each of vllm and torch is imported from (a checkout on
  ``PYTHONPATH`` has no dist-info to tell it by);
- ``nccl``: the NCCL libraries the server can load (``VLLM_NCCL_SO_PATH``, the
  first ``libnccl.so*`` on ``LD_LIBRARY_PATH``, the nvidia-nccl wheel's), each
  with its path and sha256;
- ``env``: ``LD_LIBRARY_PATH`` and ``PYTHONPATH``, the only environment values
  recorded (paths, passed through the run's redactor all the same);
- ``model``: the model's revision (``--revision``, a Hugging Face snapshot
  folder, or the HF cache's ``refs/``) and its ``config.json``'s sha256.

Bounded: the interpreter is asked once, for at most ``timeout_s`` (10 s), with
only the path variables of the launch's environment (no secret reaches a process
the harness starts only to read), its answer cut at 64 KiB; a file is digested
up to ``DIGEST_LIMIT`` bytes within the deadline. Total: what cannot be read is
null, with a line in ``unknown`` saying why; nothing here raises. Blocking: the
run calls it off the event loop (``asyncio.to_thread``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from soak.target.interpreter import IMPORTED, PACKAGES, ask_interpreter

# The only environment values recorded (paths): what decides which libraries and modules load.
RECORDED_ENV = ("LD_LIBRARY_PATH", "PYTHONPATH")
TIMEOUT_S = 10.0
DIGEST_LIMIT = 1 << 30  # a libnccl is ~250 MB; a file past 1 GiB is recorded by size alone
_TEXT_LIMIT = 500  # a recorded path or version: longer is cut (a hostile argv or answer)
_PYTHON = re.compile(r"^(python|pypy)[0-9.]*$")
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class LaunchSpec:
    """What the launcher runs: the command, the whole environment it gives it (read
    here for paths only, never recorded whole) and its working directory."""

    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    cwd: str | None = None


def _text(value: Any) -> str | None:
    return value[:_TEXT_LIMIT] if isinstance(value, str) else None


class _Reading:
    """One read: the deadline every step shares, and the notes of what was not read."""

    def __init__(self, *, timeout_s: float, redact: Callable[[str], str]) -> None:
        self.deadline = time.monotonic() + 3 * timeout_s  # the interpreter's call, and the digests
        self.timeout_s = timeout_s
        self.redact = redact
        self.unknown: list[str] = []

    def path(self, value: str | None) -> str | None:
        return None if value is None else self.redact(value[:_TEXT_LIMIT])

    def file(self, path: str | None, *, what: str) -> dict[str, Any] | None:
        """``{path, resolved, sha256, size}`` of a file; sha256 null where it is not a
        readable regular file (said in ``unknown``), or past the limit or the deadline."""
        if path is None:
            return None
        out: dict[str, Any] = {"path": self.path(path)}
        resolved = os.path.realpath(path)
        if resolved != path:
            out["resolved"] = self.path(resolved)
        out["sha256"], out["size"] = self._digest(resolved, what=what)
        return out

    def _digest(self, path: str, *, what: str) -> tuple[str | None, int | None]:
        # O_NONBLOCK: a FIFO put where a file was expected must not hang the open.
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            self.unknown.append(f"{what}: cannot read {self.path(path)}: {exc.strerror or exc}")
            return None, None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                self.unknown.append(f"{what}: {self.path(path)} is not a regular file")
                return None, None
            if info.st_size > DIGEST_LIMIT:
                self.unknown.append(f"{what}: {self.path(path)} is {info.st_size} bytes, past the digest's limit")
                return None, info.st_size
            h = hashlib.sha256()
            while chunk := os.read(fd, 1 << 20):
                h.update(chunk)
                if time.monotonic() > self.deadline:
                    self.unknown.append(f"{what}: {self.path(path)}: not digested within the reading's time")
                    return None, info.st_size
            return h.hexdigest(), info.st_size
        except OSError as exc:
            self.unknown.append(f"{what}: cannot read {self.path(path)}: {exc.strerror or exc}")
            return None, None
        finally:
            os.close(fd)


def locate(program: str, *, env: Mapping[str, str], cwd: str | None) -> str | None:
    """``argv[0]`` as ``execvpe`` finds it: a path with a slash relative to the
    launch's ``cwd``, a bare name on the launch environment's ``PATH``."""
    if os.sep in program:
        full = program if os.path.isabs(program) or cwd is None else os.path.join(cwd, program)
        return os.path.abspath(full) if os.path.exists(full) else None
    found = shutil.which(program, path=env.get("PATH", os.defpath))
    return os.path.abspath(found) if found else None


def python_target(args: Sequence[str]) -> tuple[str, str | None]:
    """What a Python interpreter's arguments (after ``argv[0]``) run:
    ``("module", name)``, ``("script", path)``, ``("code", None)`` or ``("stdin", None)``."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return ("script", args[i + 1]) if i + 1 < len(args) else ("stdin", None)
        if arg == "-":
            return "stdin", None
        if arg.startswith("--"):
            i += 2 if arg == "--check-hash-based-pycs" else 1
            continue
        if arg.startswith("-"):
            letters, j = arg[1:], 0
            while j < len(letters):
                ch, rest = letters[j], letters[j + 1:]
                if ch == "c":
                    return "code", None
                if ch == "m":
                    name = rest or (args[i + 1] if i + 1 < len(args) else "")
                    return ("module", name) if name else ("stdin", None)
                if ch in "WX":  # -W arg / -X opt: the rest of the word, else the next one
                    if not rest:
                        i += 1
                    break
                j += 1
            i += 1
            continue
        return "script", arg
    return "stdin", None


def _shebang(path: str, *, env: Mapping[str, str]) -> str | None:
    """The interpreter a ``#!`` line names (``/usr/bin/env python3`` found on the
    launch's PATH), None for a binary or an unreadable file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            head = os.read(fd, 256)
        finally:
            os.close(fd)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return None
    program = words[0]
    if os.path.basename(program) == "env":
        rest = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        if not rest:
            return None
        return locate(rest[0], env=env, cwd=None)
    return program


def _nccl_on_path(library_path: str | None) -> str | None:
    """The first libnccl the dynamic loader would find on LD_LIBRARY_PATH."""
    for folder in (library_path or "").split(":"):
        if not folder:
            continue
        for name in ("libnccl.so.2", "libnccl.so"):
            candidate = os.path.join(folder, name)
            if os.path.isfile(candidate):
                return candidate
    return None


def _flag(command: Sequence[str], name: str) -> str | None:
    found = None
    for i, arg in enumerate(command):
        flag, eq, value = arg.partition("=")
        if flag == name:
            found = value if eq else (command[i + 1] if i + 1 < len(command) else None)
    return found


def hf_cache(env: Mapping[str, str], download_dir: str | None) -> str | None:
    """Where the server's Hugging Face hub cache is (vLLM's ``--download-dir``, else
    huggingface_hub's own order of variables)."""
    if download_dir:
        return download_dir
    if env.get("HF_HUB_CACHE"):
        return env["HF_HUB_CACHE"]
    if env.get("HF_HOME"):
        return os.path.join(env["HF_HOME"], "hub")
    base = env.get("XDG_CACHE_HOME") or (os.path.join(env["HOME"], ".cache") if env.get("HOME") else None)
    return os.path.join(base, "huggingface", "hub") if base else None


def _small_text(path: str, limit: int = 200) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return os.read(fd, limit).decode("utf-8", "replace").strip()
        finally:
            os.close(fd)
    except OSError:
        return None


def model_facts(model: str | None, *, command: Sequence[str], env: Mapping[str, str], cwd: str | None,
                reading: _Reading) -> dict[str, Any]:
    """The model's id, revision (and where that was read) and config.json's sha256."""
    revision = _flag(command, "--revision")
    out: dict[str, Any] = {"id": reading.path(model), "revision": reading.path(revision),
                           "revision_from": "--revision" if revision else None, "config_sha256": None}
    if not model:
        return out
    local = model if os.path.isabs(model) or cwd is None else os.path.join(cwd, model)
    config_file = None
    if os.path.isdir(local):
        real = os.path.realpath(local)
        snapshot = re.search(r"/snapshots/([0-9a-f]{40})(?:/|$)", real)
        if snapshot and not revision:
            out["revision"], out["revision_from"] = snapshot.group(1), "the snapshot folder"
        config_file = os.path.join(local, "config.json")
    elif re.fullmatch(r"[\w.-]+(/[\w.-]+)?", model):
        cache = hf_cache(env, _flag(command, "--download-dir"))
        if cache:
            folder = os.path.join(cache, "models--" + model.replace("/", "--"))
            commit = revision if revision and _COMMIT.match(revision) else None
            if commit is None:
                ref = _small_text(os.path.join(folder, "refs", revision or "main"))
                if ref and _COMMIT.match(ref):
                    commit = ref
                    out["revision"], out["revision_from"] = ref, f"the HF cache's refs/{revision or 'main'}"
            if commit is not None:
                config_file = os.path.join(folder, "snapshots", commit, "config.json")
    if config_file is not None and os.path.isfile(config_file):
        facts = reading.file(config_file, what="the model's config.json")
        out["config_sha256"] = facts["sha256"] if facts else None
    return out


def read_launch(spec: LaunchSpec, *, model: str | None = None, timeout_s: float = TIMEOUT_S,
                redact: Callable[[str], str] = lambda s: s, with_model: bool = True) -> dict[str, Any]:
    """What ``spec`` runs (the module's docstring), as the ``build`` event's ``launch``;
    ``with_model=False``: all but ``model`` (``read_model`` adds it once the server has
    loaded it: the HF cache's refs name a download only after it). Never raises: a step
    that fails is null, and said in ``unknown``."""
    reading = _Reading(timeout_s=timeout_s, redact=redact)
    try:
        out = _read(spec, reading=reading)
        if with_model:
            out = with_model_read(out, spec, model=model, redact=redact)
        return out
    except Exception as exc:  # a reader is total: what it could not foresee is one note
        return {"unknown": [*reading.unknown, f"the launch: {type(exc).__name__}: {redact(str(exc))[:200]}"]}


def with_model_read(launch: Mapping[str, Any], spec: LaunchSpec, *, model: str | None,
                    redact: Callable[[str], str] = lambda s: s) -> dict[str, Any]:
    """``launch`` with its ``model`` read now (``model_facts``). Never raises."""
    reading = _Reading(timeout_s=TIMEOUT_S, redact=redact)
    unknown = list(launch.get("unknown") or []) if isinstance(launch.get("unknown"), list) else []
    try:
        command, env = through_env(spec.command, spec.env)
        facts = model_facts(model, command=command, env=env, cwd=spec.cwd, reading=reading)
    except Exception as exc:  # total: one note
        facts = None
        reading.unknown.append(f"the model: {type(exc).__name__}: {redact(str(exc))[:200]}")
    return {**launch, "model": facts, "unknown": unknown + reading.unknown}


def through_env(command: Sequence[str], env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """``env [-i] [-u NAME] [NAME=VALUE]... PROGRAM ARGS`` as what it runs: the program's
    command and the environment it gets (``env LD_LIBRARY_PATH=... vllm serve`` sets
    the very paths the build records); any other command as it is."""
    args, env = list(command), dict(env)
    if not args or os.path.basename(args[0]) != "env":
        return args, env
    i = 1
    while i < len(args):
        arg = args[i]
        if arg in ("-i", "--ignore-environment", "-"):
            env = {}
        elif arg in ("-u", "--unset") and i + 1 < len(args):
            env.pop(args[i + 1], None)
            i += 1
        elif arg.startswith("--unset="):
            env.pop(arg.partition("=")[2], None)
        elif arg == "--":
            i += 1
            break
        elif "=" in arg and not arg.startswith("-"):
            name, _, value = arg.partition("=")
            env[name] = value
        elif not arg.startswith("-"):
            break
        i += 1
    return args[i:], env


def _read(spec: LaunchSpec, *, reading: _Reading) -> dict[str, Any]:
    command, env = through_env(spec.command, spec.env)
    cwd = spec.cwd
    out: dict[str, Any] = {"executable": None, "script": None, "interpreter": None, "python": None,
                           "packages": None, "imported_from": None, "nccl": [],
                           "env": {name: reading.path(env.get(name)) for name in RECORDED_ENV}}
    if not command:
        out["unknown"] = ["the launch command is empty"]
        return out
    executable = locate(command[0], env=env, cwd=cwd)
    if executable is None:
        reading.unknown.append(f"the executable: {reading.path(command[0])} not found")
    out["executable"] = reading.file(executable, what="the executable")
    interpreter = module = None
    script: str | None = None
    name = os.path.basename(os.path.realpath(executable)) if executable else ""
    if executable and (_PYTHON.match(name) or _PYTHON.match(os.path.basename(executable))):
        interpreter = executable
        kind, value = python_target(command[1:])
        if kind == "module":
            module = value
        elif kind == "script":
            script = value
    elif executable:
        named = _shebang(executable, env=env)
        if named is not None and _PYTHON.match(os.path.basename(named)):
            interpreter = named  # a console script (vllm, torchrun): its #! names the server's Python
        elif name in _SHELLS or (named is not None and os.path.basename(named) in _SHELLS):
            args = [a for a in command[1:] if not a.startswith("-")]
            script = args[0] if args and name in _SHELLS else None
            reading.unknown.append("packages: the server is started by a shell script; which Python it runs "
                                   "is not known to soak")
        else:
            reading.unknown.append("packages: the executable is not a Python interpreter or a script of one")
    out["interpreter"] = reading.path(interpreter)
    if script is not None:
        located = script if os.path.isabs(script) or cwd is None else os.path.join(cwd, script)
        out["script"] = reading.file(located, what="the script")
    answer = None
    if interpreter is not None:
        left = max(0.5, min(reading.timeout_s, reading.deadline - time.monotonic()))
        answer, why = ask_interpreter(interpreter, env=env, cwd=cwd, module=module, timeout_s=left)
        if answer is None:
            reading.unknown.append(f"packages: the server's interpreter {reading.path(interpreter)}: {why}")
    if module is not None:
        module_file = _text(answer.get("module_file")) if answer else None
        script_facts = reading.file(module_file, what=f"the module {module}") if module_file else None
        out["script"] = {"module": reading.path(module), **(script_facts or {"path": None, "sha256": None})}
    if answer is not None:
        out["python"] = reading.path(_text(answer.get("python")))
        packages = answer.get("packages") if isinstance(answer.get("packages"), dict) else {}
        out["packages"] = {n: reading.path(_text(packages.get(n))) for n in PACKAGES}
        imported = answer.get("imported_from") if isinstance(answer.get("imported_from"), dict) else {}
        out["imported_from"] = {n: reading.path(_text(imported.get(n))) for n in IMPORTED}
    nccl = []
    for via, path in (("VLLM_NCCL_SO_PATH", env.get("VLLM_NCCL_SO_PATH") or None),
                      ("LD_LIBRARY_PATH", _nccl_on_path(env.get("LD_LIBRARY_PATH"))),
                      ("the nvidia-nccl wheel", _text(answer.get("nccl_wheel")) if answer else None)):
        if path:
            facts = reading.file(path, what=f"NCCL ({via})")
            nccl.append({"via": via, **(facts or {})})
    out["nccl"] = nccl
    out["unknown"] = reading.unknown
    return out


def attached_launch() -> dict[str, Any]:
    """An attached server's ``launch``: soak did not start it, so it says so."""
    return {"unknown": ["an attached server: soak did not start it, so its executable, script, packages, NCCL "
                        "and environment are unknown (its /version and model are recorded)"]}


__all__ = ["LaunchSpec", "PACKAGES", "RECORDED_ENV", "TIMEOUT_S", "attached_launch", "ask_interpreter", "hf_cache",
           "locate", "model_facts", "python_target", "read_launch", "through_env", "with_model_read"]
