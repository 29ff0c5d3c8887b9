from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "run"))
sys.path.insert(0, str(TESTS / "report"))

from soakrun_helpers import Harness  # noqa: E402


@pytest.fixture
def harness():
    """Factory: ``h = harness(config_path, run_dir, *flags)``; every one closed at teardown."""
    created: list[Harness] = []

    def make(config_path: Path, run_dir: Path, *extra: str) -> Harness:
        h = Harness(config_path, run_dir, *extra)
        created.append(h)
        return h

    yield make
    for h in created:
        h.close()
