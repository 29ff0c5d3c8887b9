"""The stage order as a test: one table of floors (docs/ARCHITECTURE.md draws it)
and one rule, imports only go down.

A module on a floor imports modules of lower floors, and modules of its own
package; the shared leaves (floor 0) also import each other. Siblings on one
floor (detect and criteria, store and export, report and history) never import
each other. Every import counts, also one inside a function or under
TYPE_CHECKING: a lazy import that runs against the flow is still a back-edge.
Any exception is listed in ``EXCEPTIONS`` with its reason."""

from __future__ import annotations

import ast
import sys
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

import soak

SOAK = Path(soak.__file__).parent

# Floor by floor, bottom up: the data's one-way flow (config -> workload -> load
# -> probes -> detect -> respond -> store/export -> thresholds -> judge ->
# report -> history -> run). A pattern names a module or a package (``soak.load``
# is the package and everything in it); the first pattern that matches decides.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # soak.prove: the sequential test, pure; the live view, judge, report and history read it
    # soak.oracle: the correctness oracle, pure; the canary probe, detector, report read it
    ("leaves", ("soak", "soak.proc", "soak.tokens", "soak.flightrec", "soak.prove", "soak.oracle")),
    # every stage's config section: validated before anything runs
    ("sections", ("soak.*.config", "soak.export.push_config", "soak.target")),
    ("config", ("soak.config",)),  # composes the sections
    # the config reference (docs/config-reference.md), generated from the composed config
    ("reference", ("soak.configref",)),
    ("workload", ("soak.workload",)),
    ("load", ("soak.load",)),
    ("probes", ("soak.probes",)),
    ("detect", ("soak.detect", "soak.criteria")),
    ("respond", ("soak.respond",)),
    ("record", ("soak.store", "soak.export")),
    ("thresholds", ("soak.thresholds",)),
    ("judge", ("soak.judge",)),
    ("report", ("soak.report",)),  # one run read, judged and rendered; the night pushed
    ("history", ("soak.history",)),  # many runs, each read as the report reads one
    ("wiring", ("soak.run", "soak.sim", "soak.rigs")),
    # soak bisect runs segments through soak.run: a floor above it (the posterior is pure)
    ("bisect", ("soak.bisect",)),
    ("cli", ("soak.cli",)),
    ("main", ("soak.__main__",)),
)
LEAF_MODULES = "soak.*"  # any other top-level module: a shared leaf

# Floors whose modules also import each other: shared leaves, and config
# sections that nest (target's simulator section is the simulator's).
OPEN_FLOORS = frozenset({"leaves", "sections"})

# (importer, imported): why this edge may run against the floors.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("soak.bisect.unseal", "soak.cli"): "an entry point (python -m soak.bisect.unseal --soak-run): a sealed "
                                         "bisect segment's `soak run`, its config's secrets put back as it is read",
}


def floor_of(module: str) -> int:
    for number, (_, patterns) in enumerate(FLOORS):
        for pattern in patterns:
            if "*" in pattern:
                if fnmatchcase(module, pattern):
                    return number
            elif module == pattern or (pattern != "soak" and module.startswith(pattern + ".")):
                return number
    if module.count(".") == 1 and fnmatchcase(module, LEAF_MODULES):
        return 0
    raise KeyError(f"{module} is on no floor: add it to FLOORS")


def package_of(module: str) -> str:
    """soak.load.client -> soak.load: modules of one package (one stage) import each other."""
    return ".".join(module.split(".")[:2])


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SOAK.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # ``from soak.x import y``: y may be a module of soak.x
            found.update(f"{node.module}.{alias.name}" for alias in node.names
                         if (SOAK.parent / f"{node.module}.{alias.name}".replace(".", "/")).with_suffix(".py").exists()
                         or (SOAK.parent / f"{node.module}.{alias.name}".replace(".", "/")).is_dir())
    return {m for m in found if m.split(".")[0] == "soak" and m != "soak"}


def back_edges(modules: dict[str, set[str]]) -> list[str]:
    """Every import that does not go down, as 'importer (floor) -> imported (floor)'."""
    found = []
    for importer, imported in sorted(modules.items()):
        floor = floor_of(importer)
        for target in sorted(imported):
            if (importer, target) in EXCEPTIONS:
                continue
            target_floor = floor_of(target)
            if target_floor < floor or package_of(importer) == package_of(target) \
                    or (target_floor == floor and FLOORS[floor][0] in OPEN_FLOORS):
                continue
            found.append(f"{importer} ({FLOORS[floor][0]}) -> {target} ({FLOORS[target_floor][0]})")
    return found


def _source_modules() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in sorted(SOAK.rglob("*.py"))}


def test_imports_only_go_down() -> None:
    edges = back_edges(_source_modules())
    assert not edges, "imports against the floors (docs/ARCHITECTURE.md):\n" + "\n".join(edges)


def test_every_module_is_on_a_floor() -> None:
    for module in _source_modules():
        floor_of(module)


def test_every_exception_is_still_needed() -> None:
    modules = _source_modules()
    stale = [edge for edge in EXCEPTIONS if edge[1] not in modules.get(edge[0], set())]
    assert not stale, f"listed exceptions no import needs any more: {stale}"


@pytest.mark.parametrize("importer, imported", [
    ("soak.store.summary", "soak.thresholds.evaluate"),  # the back-edge issue 33 removed
    ("soak.store.rundir", "soak.judge.entry"),
    ("soak.probes.gpu", "soak.detect.rules"),
    ("soak.export.live", "soak.store.summary"),  # siblings on one floor
    ("soak.report.rundir", "soak.history.collect"),
    ("soak.detect.replay", "soak.store.rundir"),
    ("soak.records", "soak.run.loop"),
])
def test_a_planted_back_edge_is_caught(importer: str, imported: str) -> None:
    assert back_edges({importer: {imported}}), f"{importer} -> {imported} went unnoticed"


def test_a_downward_import_passes() -> None:
    assert not back_edges({"soak.run.loop": {"soak.store.store", "soak.records", "soak.judge"}})
    assert not back_edges({"soak.bounds": {"soak.errors"}})  # leaves among themselves


def test_the_records_module_is_a_leaf_of_the_standard_library() -> None:
    tree = ast.parse((SOAK / "records.py").read_text(encoding="utf-8"))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    third_party = {m.split(".")[0] for m in imported} - {"soak"} - set(sys.stdlib_module_names)
    assert not third_party, third_party
