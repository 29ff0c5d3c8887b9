"""Paths of the report stage's fixtures (imported by its tests; a unique module name
because tests/ has no packages)."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RUNS = FIXTURES / "runs"
FLIGHT = FIXTURES / "flight_recorder"
JUNIT_XSD = FIXTURES / "junit" / "JUnit.xsd"
