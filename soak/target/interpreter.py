"""The server's own interpreter, asked what it has installed (``soak.target.launch``):
``importlib.metadata``'s versions of vllm, torch and the NCCL wheels, the folder
each top-level package is imported from, the file a ``-m`` module runs, the
nvidia-nccl wheel's library. Neither vllm nor torch is imported (seconds, and a
GPU): ``find_spec`` of top-level names finds without importing.

Bounded: one call, killed at ``timeout_s``; its answer cut at 64 KiB. Only the path
variables of the launch's environment reach it, so a secret in the server's
environment never reaches a process the harness starts only to read. Blocking.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import time
from typing import Any, Mapping

# The packages whose versions make a build: the server, its torch, and the NCCL
# wheels torch loads (nvidia-nccl-cu12 2.19 against 2.21 is a night's difference).
PACKAGES = ("vllm", "torch", "nvidia-nccl-cu12", "nvidia-nccl-cu11", "nvidia-nccl-cu13", "soak")
# The packages whose import folder is recorded: a checkout on PYTHONPATH has no version to tell it by.
IMPORTED = ("vllm", "torch")
# What the interpreter is given of the launch's environment: what decides where it finds its
# packages, nothing else (a secret in the server's environment never reaches this process).
_PROBE_ENV = ("PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONPLATLIBDIR",
              "VIRTUAL_ENV", "LD_LIBRARY_PATH", "HOME", "LANG", "LC_ALL")
_ANSWER_LIMIT = 64 * 1024


# Asked of the server's interpreter: importlib.metadata and find_spec of top-level
# names only (neither imports vllm or torch, which would take seconds and a GPU).
# Python 3.8 and later.
_PROBE = r"""
import json, os, sys
request = json.loads(sys.argv[1])
out = {"python": sys.version.split()[0], "packages": {}, "imported_from": {}}
try:
    from importlib import metadata
except ImportError:
    metadata = None
for name in request["packages"]:
    try:
        out["packages"][name] = metadata.version(name) if metadata is not None else None
    except Exception:
        out["packages"][name] = None
import importlib.util
def where(top):
    try:
        spec = importlib.util.find_spec(top)
    except Exception:
        return None, None
    if spec is None:
        return None, None
    folders = list(spec.submodule_search_locations or [])
    return (folders[0] if folders else None), spec.origin
for top in request["imported"]:
    out["imported_from"][top] = where(top)[0]
module = request.get("module")
if module:
    parts = module.split(".")
    folder, origin = where(parts[0])
    found = None
    if folder is not None:
        base = os.path.join(folder, *parts[1:])
        for candidate in (base + ".py", os.path.join(base, "__main__.py")):
            if os.path.isfile(candidate):
                found = candidate
                break
    elif len(parts) == 1:
        found = origin
    out["module_file"] = found
nccl = None
try:
    spec = importlib.util.find_spec("nvidia")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
except Exception:
    folders = []
for folder in folders:
    candidate = os.path.join(folder, "nccl", "lib", "libnccl.so.2")
    if os.path.isfile(candidate):
        nccl = candidate
        break
out["nccl_wheel"] = nccl
sys.stdout.write(json.dumps(out))
"""


def ask_interpreter(interpreter: str, *, env: Mapping[str, str], cwd: str | None, module: str | None,
                    timeout_s: float) -> tuple[dict[str, Any] | None, str | None]:
    """The server's interpreter's answer (``_PROBE``), or None and why not. Its
    own child, killed at the deadline; stdout read up to 64 KiB."""
    request = json.dumps({"packages": list(PACKAGES), "imported": list(IMPORTED), "module": module})
    given = {k: env[k] for k in _PROBE_ENV if k in env}
    try:
        proc = subprocess.Popen([interpreter, "-c", _PROBE, request], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                env={**given, "PYTHONDONTWRITEBYTECODE": "1"},
                                cwd=cwd if cwd and os.path.isdir(cwd) else None, start_new_session=True)
    except (OSError, ValueError) as exc:
        return None, f"cannot run it: {getattr(exc, 'strerror', None) or exc}"
    data = b""
    deadline = time.monotonic() + timeout_s
    try:
        assert proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while len(data) <= _ANSWER_LIMIT:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None, f"no answer within {timeout_s:g} s"
                if not sel.select(left):
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                data += chunk
        if len(data) > _ANSWER_LIMIT:
            return None, "its answer was too long"
        try:
            code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None, f"did not exit within {timeout_s:g} s"
        if code != 0:
            return None, f"it exited with code {code}"
        try:
            answer = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None, "its answer was not JSON"
        return (answer, None) if isinstance(answer, dict) else (None, "its answer was not an object")
    finally:
        if proc.poll() is None:
            proc.kill()  # our own child, by its handle: nothing else is signalled
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if proc.stdout is not None:
            proc.stdout.close()


__all__ = ["IMPORTED", "PACKAGES", "ask_interpreter"]
