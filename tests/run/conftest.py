from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# One factory fixture for every suite that drives `soak run` (closed at teardown).
from soakrun_helpers import harness  # noqa: E402,F401
