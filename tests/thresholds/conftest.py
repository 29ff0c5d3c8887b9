from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "run"))
sys.path.insert(0, str(TESTS / "report"))

# One factory fixture for every suite that drives `soak run` (closed at teardown).
from soakrun_helpers import harness  # noqa: E402,F401
