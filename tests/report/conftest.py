"""Report-stage fixtures: copies of the recorded run directories (so rendering
never writes into tests/fixtures) and the synthetic run generator."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from report_paths import RUNS


def _load_generator():
    spec = importlib.util.spec_from_file_location("soak_test_run_generator", RUNS / "generate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def generator():
    return _load_generator()


@pytest.fixture
def run_copy(tmp_path):
    """run_copy("fail") -> a private copy of tests/fixtures/runs/fail."""

    def copy(name: str) -> Path:
        dest = tmp_path / name
        shutil.copytree(RUNS / name, dest)
        for produced in ("report.html", "junit.xml"):
            (dest / produced).unlink(missing_ok=True)
        return dest

    return copy
