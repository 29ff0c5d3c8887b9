"""``python -m soak.bisect.unseal ARGV...``: a launched build's command with its
secrets put back. The segment config a bisect writes (and a Slurm job reads on
another node, later) holds ``{SOAK_BISECT_SECRET_N}`` where the command had a
secret flag value or URL credential (``soak.bisect.local.seal``); the values
travel in the segment's environment, the way a build's ``env:`` does, and this
puts them back and execs the command, the variables taken out of its
environment. Their names end in a secret word, so the segment's ``soak run``
redacts the values wherever the server prints them.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Mapping, Sequence

PREFIX = "SOAK_BISECT_SECRET_"
PLACEHOLDER = re.compile(r"\{(" + PREFIX + r"\d+)\}")


def unseal(argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """``argv`` with every placeholder replaced by its variable; KeyError naming one that is not set."""
    return [PLACEHOLDER.sub(lambda m: environ[m.group(1)], arg) for arg in argv]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("soak bisect: unseal: no command given", file=sys.stderr)
        return 2
    try:
        command = unseal(argv, os.environ)
    except KeyError as exc:
        print(f"soak bisect: {exc.args[0]} is not set: the segment's secret values travel in its environment "
              "(for Slurm, sbatch must export the caller's environment)", file=sys.stderr)
        return 2
    env = {k: v for k, v in os.environ.items() if not k.startswith(PREFIX)}
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"soak bisect: cannot run {argv[0]!r}: {exc.strerror}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main())
