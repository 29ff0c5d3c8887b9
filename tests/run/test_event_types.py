"""Every event type soak writes or matches is a member of ``soak.events.EventType``:
one spelling for the run, the store, the live view, the exporter and the readers."""

from __future__ import annotations

import ast
from pathlib import Path

import soak
from soak.events import EventType

SOURCE = Path(soak.__file__).parent
EMITTERS = {"event", "on_event", "emit", "_emit"}
# Modules whose "type" keys are someone else's, not an event's.
OTHER_TYPES = {
    "configbase.py": "pydantic's error types",
    "workload/config.py": "pydantic's error types",
    "tokens/chat.py": "a chat message part's type",
    "export/lint.py": "Grafana dashboard variables",
}


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _strings(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for elt in node.elts for s in _strings(elt)]
    return []


def _reads_type(node: ast.expr) -> bool:
    """``e.get("type")`` or ``e["type"]``: an event's type read back."""
    if isinstance(node, ast.Call) and _name(node.func) == "get" and node.args:
        return _strings(node.args[0]) == ["type"]
    if isinstance(node, ast.Subscript):
        return _strings(node.slice) == ["type"]
    return False


def event_type_literals(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) in EMITTERS and node.args:
            found += [(node.lineno, s) for s in _strings(node.args[0])]
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.NotEq, ast.In)):
            left, right = node.left, node.comparators[0]
            if _reads_type(left):
                found += [(node.lineno, s) for s in _strings(right)]
            elif _reads_type(right):
                found += [(node.lineno, s) for s in _strings(left)]
    return found


def test_no_event_type_in_the_source_is_spelled_as_a_string():
    # Every emitter and every reader of events.jsonl names the type by its
    # EventType member: a misspelled literal would be a type nobody matches.
    spelled = []
    for path in sorted(SOURCE.rglob("*.py")):
        if path.relative_to(SOURCE).as_posix() in OTHER_TYPES:
            continue
        for line, text in event_type_literals(ast.parse(path.read_text(encoding="utf-8"))):
            spelled.append(f"{path.relative_to(SOURCE.parent)}:{line}: {text!r}")
    assert spelled == []


def test_the_scan_catches_a_type_that_is_not_a_member():
    tree = ast.parse('run.event("load_started")\nself.event("lunch_started", x=1)\n'
                     'if e.get("type") in ("incident", "hang_killed"): pass\n')
    assert [t for _, t in event_type_literals(tree) if t not in {m.value for m in EventType}] == \
        ["lunch_started", "hang_killed"]


def test_a_member_is_its_string_on_disk_and_in_a_label():
    assert EventType.RESTART_DONE == "restart_done" and f"{EventType.RESTART_DONE}" == "restart_done"
    assert str(EventType.RUN_ENDED) == "run_ended"
    assert {"restart_done": 1}[EventType.RESTART_DONE] == 1
