"""The tests' own layout: a test module imports what it shares with others from tests/helpers, never from another
test module or a conftest.py (pytest imports those itself, under names of its own: an import makes a second copy),
and a fixture shared across modules is in a conftest.py. Every tests/**/*.py is parsed, nothing imported."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
HELPERS = TESTS / "helpers"


def sources() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "testdata" not in p.relative_to(TESTS).parts)


def imported(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, dotted name) of every module TREE imports, anywhere in it; `from X import Y` names X and X.Y."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            out += [(node.lineno, base)] + [(node.lineno, f"{base.rstrip('.')}.{a.name}") for a in node.names]
    return out


def forbidden(module: str) -> bool:
    """A test module or a conftest."""
    return any(part.startswith("test_") or part == "conftest" for part in module.split("."))


def test_no_module_of_the_tests_imports_a_test_module_or_a_conftest():
    found = {}  # one line per import statement: its first forbidden name
    for path in sources():
        for line, module in imported(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if forbidden(module):
                found.setdefault(f"{path.relative_to(TESTS.parent)}:{line}", module)
    assert found == {}, "import it from tests/helpers (a fixture: from a conftest.py, as pytest does):\n" + \
        "\n".join(f"{where}: {module}" for where, module in found.items())


def test_what_is_neither_a_test_module_nor_a_conftest_is_a_helper_in_tests_helpers():
    stray = [str(p.relative_to(TESTS.parent)) for p in sources()
             if not p.name.startswith("test_") and p.name != "conftest.py" and HELPERS not in p.parents]
    assert stray == []


def test_the_check_catches_each_way_of_importing_a_test_module():
    tree = ast.parse("import tests.unit.test_plan\n"
                     "from tests.unit.test_plan import on\n"
                     "from tests.unit import test_plan\n"
                     "def f():\n"
                     "    from test_emulated_driver import deb\n"
                     "    from tests.lab import conftest\n"
                     "from tests.helpers.facts import on\n"
                     "import unittest.mock\n")
    assert sorted({line for line, module in imported(tree) if forbidden(module)}) == [1, 2, 3, 5, 6]
