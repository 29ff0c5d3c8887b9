"""``python -m soak.configref > docs/config-reference.md``: the page, regenerated."""

from __future__ import annotations

import sys

from soak.configref.lookup import markdown

if __name__ == "__main__":
    sys.stdout.write(markdown())
