from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# Factory fixtures for every suite that drives `soak run` or the fake vLLM (closed at teardown).
from soakrun_helpers import fake_vllm, harness  # noqa: E402,F401
