"""A bisect segment's secrets put back from its environment.

The segment config a bisect writes (and a Slurm job reads on another node,
later) holds ``{SOAK_BISECT_<n>_SECRET}`` wherever the build's config held a
string the redactor would hide (``soak.bisect.local.seal``): a secret flag's
value, a URL's credentials, ``HF_TOKEN=...`` in a command, a credential URL in
any section (``pushgateway.url``). The values travel in the segment's
environment, the way a build's ``env:`` does, and are put back at the segment's
start, never on disk:

- ``python -m soak.bisect.unseal --soak-run CONFIG ARGS...``: the segment's
  ``soak run CONFIG ARGS...`` in this process, the config's placeholders
  resolved as it is read (the launched command's are left to the next form);
- ``python -m soak.bisect.unseal ARGV...``: a launched build's command with its
  secrets put back, exec'd with the variables taken out of its environment.

The names end in ``SECRET`` by construction (``soak.redact.secret_name`` says so
whatever the index), so the segment's ``soak run`` learns the values from its
environment (``Redactor.for_run``) and hides them wherever the server prints them.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

PREFIX = "SOAK_BISECT_"
SUFFIX = "_SECRET"
PLACEHOLDER = re.compile(r"\{(" + PREFIX + r"\d+" + SUFFIX + r")\}")
RUN = "--soak-run"  # the segment's soak run, in this process


def variable(index: int) -> str:
    """The name of the ``index``-th secret of a segment: ``SOAK_BISECT_0_SECRET``."""
    return f"{PREFIX}{index}{SUFFIX}"


def is_variable(name: str) -> bool:
    return PLACEHOLDER.fullmatch("{" + name + "}") is not None


def unseal(argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """``argv`` with every placeholder replaced by its variable; KeyError naming one that is not set."""
    return [PLACEHOLDER.sub(lambda m: environ[m.group(1)], arg) for arg in argv]


def resolve(obj: Any, environ: Mapping[str, str], *, skip: tuple[str, ...] = ()) -> Any:
    """``obj`` (a segment config) with every placeholder in its strings resolved;
    ``skip``: a path of keys left as it is (``("target", "command")``)."""
    if isinstance(obj, str):
        return PLACEHOLDER.sub(lambda m: environ[m.group(1)], obj)
    if isinstance(obj, Mapping):
        out = {}
        for k, v in obj.items():
            if skip and k == skip[0]:
                out[k] = v if len(skip) == 1 else resolve(v, environ, skip=skip[1:])
            else:
                out[k] = resolve(v, environ)
        return out
    if isinstance(obj, list):
        return [resolve(v, environ) for v in obj]
    return obj


def _missing(text: str, environ: Mapping[str, str]) -> list[str]:
    return sorted({m.group(1) for m in PLACEHOLDER.finditer(text)} - set(environ))


def _not_set(name: str) -> int:
    print(f"soak bisect: {name} is not set: the segment's secret values travel in its environment "
          "(for Slurm, sbatch must export the caller's environment)", file=sys.stderr)
    return 2


def run_segment(args: Sequence[str]) -> int:
    """``soak run CONFIG ARGS...`` with CONFIG's placeholders resolved from the
    environment as the run reads it (the file keeps them)."""
    if not args:
        print("soak bisect: unseal: no config given", file=sys.stderr)
        return 2
    path = Path(args[0])
    try:
        missing = _missing(path.read_text(encoding="utf-8"), os.environ)
    except (OSError, UnicodeDecodeError):
        missing = []  # soak run says what is wrong with the file
    if missing:
        return _not_set(missing[0])
    import soak.config as config_module

    read_yaml = config_module.read_yaml
    wanted = path.resolve()

    def read_resolved(where: Any, *a: Any, **kw: Any) -> Any:
        data = read_yaml(where, *a, **kw)
        if Path(where).resolve() == wanted:
            # the launched command's placeholders stay: its own unseal puts them back at exec
            data = resolve(data, os.environ, skip=("target", "command"))
        return data

    config_module.read_yaml = read_resolved
    from soak.cli import main as soak_main

    return soak_main(["run", *args])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("soak bisect: unseal: no command given", file=sys.stderr)
        return 2
    if argv[0] == RUN:
        return run_segment(argv[1:])
    try:
        command = unseal(argv, os.environ)
    except KeyError as exc:
        return _not_set(exc.args[0])
    env = {k: v for k, v in os.environ.items() if not is_variable(k)}
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"soak bisect: cannot run {argv[0]!r}: {exc.strerror}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main())
