"""Shared by the dashboard tests: a real Prometheus (Debian's package) on a free
loopback port, running the shipped config with the targets a test names."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from prom_helpers import make_prometheus  # noqa: E402,F401  (a fixture)
