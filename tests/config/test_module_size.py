"""Small modules: no module of soak/ has over 400 lines of logic, except the
declarative ones listed with their reason. A line of logic is a source line
that is not blank, a comment or a docstring."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import soak

SOAK = Path(soak.__file__).parent
MAX_LOGIC_LINES = 400

# module (relative to soak/) -> why its length is data, not logic
DECLARATIVE: dict[str, str] = {}

_NOT_CODE = frozenset({tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                       tokenize.ENCODING, tokenize.ENDMARKER})


def logic_lines(text: str) -> int:
    tree = ast.parse(text)
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    code: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in _NOT_CODE:
            code.update(range(token.start[0], token.end[0] + 1))
    return len(code - docstrings)


def test_logic_lines_counts_code_not_words() -> None:
    text = '"""Doc\n\nstring."""\n\n# a comment\nx = 1\n\n\ndef f():\n    """Doc."""\n    return (x +\n            1)\n'
    assert logic_lines(text) == 4  # x = 1, def f, and the two lines of the return


def test_no_module_is_over_the_limit() -> None:
    over = {}
    for path in sorted(SOAK.rglob("*.py")):
        name = str(path.relative_to(SOAK))
        if name in DECLARATIVE:
            continue
        count = logic_lines(path.read_text(encoding="utf-8"))
        if count > MAX_LOGIC_LINES:
            over[name] = count
    assert not over, f"modules over {MAX_LOGIC_LINES} lines of logic (split them by concern): {over}"


def test_every_declarative_exception_exists() -> None:
    assert all((SOAK / name).is_file() for name in DECLARATIVE), DECLARATIVE
