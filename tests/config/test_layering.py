"""Imports follow the data's one-way flow (docs/ARCHITECTURE.md): the records module
is a leaf, the config stage never imports the run, the run store never imports the run.
Read from the source (every import, also those inside functions), so a lazy import
that runs against the flow is caught too."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import soak

SOAK = Path(soak.__file__).parent


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _soak_imports(paths: list[Path]) -> dict[str, set[str]]:
    return {str(p.relative_to(SOAK.parent)): {m for m in _imports(p) if m.split(".")[0] == "soak"} for p in paths}


def test_the_records_module_is_a_leaf() -> None:
    imported = _imports(SOAK / "records.py")
    ours = {m for m in imported if m.split(".")[0] == "soak"}
    assert ours <= {"soak.samples", "soak.versions"}, ours
    third_party = {m.split(".")[0] for m in imported} - {"soak"} - set(sys.stdlib_module_names)
    assert not third_party, third_party


def test_the_config_stage_imports_no_part_of_the_run() -> None:
    # soak.config composes every stage's section; a section that imports soak.run
    # makes a package cycle (soak.run imports soak.config).
    sections = [SOAK / "config.py", SOAK / "configbase.py", *SOAK.glob("*/config.py")]
    offenders = {path: sorted(m for m in mods if m == "soak.run" or m.startswith("soak.run."))
                 for path, mods in _soak_imports(sections).items()}
    assert not {p: m for p, m in offenders.items() if m}, offenders


def test_the_run_store_and_the_exporter_import_no_part_of_the_run() -> None:
    paths = [*(SOAK / "store").glob("*.py"), *(SOAK / "export").glob("*.py")]
    offenders = {path: sorted(m for m in mods if m == "soak.run" or m.startswith("soak.run."))
                 for path, mods in _soak_imports(paths).items()}
    assert not {p: m for p, m in offenders.items() if m}, offenders


def test_the_responder_imports_neither_the_probes_nor_the_report() -> None:
    # respond sits after detect: it is handed its GPU source and evidence readers,
    # it never imports the probes, the report, the workload or the simulator.
    later_or_sideways = ("soak.probes", "soak.report", "soak.workload", "soak.sim", "soak.run", "soak.load")
    offenders = {path: sorted(m for m in mods if m.startswith(later_or_sideways))
                 for path, mods in _soak_imports(list((SOAK / "respond").glob("*.py"))).items()}
    assert not {p: m for p, m in offenders.items() if m}, offenders


def test_the_workload_stage_imports_no_simulator() -> None:
    offenders = {path: sorted(m for m in mods if m.startswith("soak.sim"))
                 for path, mods in _soak_imports(list((SOAK / "workload").glob("*.py"))).items()}
    assert not {p: m for p, m in offenders.items() if m}, offenders
