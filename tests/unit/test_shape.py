"""The package's shape (issue 22): no import circles, the command line is one layer, SQL only in the history's
classes and one parser for the history's timestamps.

Every orchestrator/**/*.py is parsed (nothing is imported or run); its imports, those inside functions included,
are resolved (relative ones against the module's package) into a graph of the package's modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = "orchestrator"
ROOT = Path(__file__).resolve().parents[2]
CLI = f"{PACKAGE}.cli"
LEAVING = f"{PACKAGE}.lab"  # the lab is leaving the product (its own package): not held to the CLI rule
UI_LIBRARIES = ("click", "rich")
HISTORY = (f"{PACKAGE}.store", f"{PACKAGE}.chain", f"{PACKAGE}.campaign.journal")  # the only modules with SQL
TIMESTAMPS = f"{PACKAGE}.timefmt"  # the only module parsing the history's timestamps (a Z is UTC)
SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|DROP|PRAGMA|BEGIN|WITH \w+ AS)\b")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = ROOT) -> dict[str, tuple[Path, ast.Module]]:
    """Module name -> (file, syntax tree) for every .py file of the package under ROOT."""
    out = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        out[module_name(path, root)] = (path, ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return out


def base_of(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` takes its names from (relative ones against NAME's package)."""
    if not node.level:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    parts = package.split(".")
    parts = parts[:len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def resolve(target: str, known: set[str]) -> str | None:
    """The package's module TARGET names (a name in a module resolves to the module), None outside the package."""
    while target:
        if target in known:
            return target
        target = target.rpartition(".")[0]
    return None


def imported(name: str, path: Path, tree: ast.Module, known: set[str]) -> set[str]:
    """The package's modules NAME imports, anywhere in it (inside functions too). `from X import Y` is an edge to
    the module X.Y where Y is a module, else to X (Y is a name defined by X)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = base_of(name, path, node)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out |= {dep for dep in (resolve(t, known) for t in targets) if dep is not None and dep != name}
    return out


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    mods = modules(root)
    return {name: imported(name, path, tree, set(mods)) for name, (path, tree) in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle (its modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def ui_imports(root: Path = ROOT) -> list[str]:
    """'module:line library' for each import of click or rich outside the command-line layer (and the lab)."""
    out = []
    for name, (path, tree) in modules(root).items():
        if name == CLI or name.startswith(CLI + ".") or name == LEAVING or name.startswith(LEAVING + "."):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                written = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                written = [node.module or ""]
            else:
                continue
            out += [f"{name}:{node.lineno} {w}" for w in written if w.split(".")[0] in UI_LIBRARIES]
    return out


def cli_importers(root: Path = ROOT) -> list[str]:
    """Modules outside the command-line layer that import it (the services never do)."""
    edges = graph(root)
    return sorted(name for name, deps in edges.items()
                  if not (name == CLI or name.startswith(CLI + "."))
                  and any(d == CLI or d.startswith(CLI + ".") for d in deps))


def test_the_package_has_no_import_circle():
    cycle = find_cycle(graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_only_the_command_line_imports_click_or_rich():
    assert ui_imports() == [], "click or rich outside orchestrator/cli/: " + "; ".join(ui_imports())


def test_no_service_imports_the_command_line():
    assert cli_importers() == []


def test_the_walk_sees_imports_inside_functions_and_relative_ones(tmp_path):
    """The checks themselves: a circle made only by an import inside a function, through `from . import`, is
    found and named; click imported by a service is reported."""
    pkg = tmp_path / PACKAGE
    (pkg / "cli").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cli" / "__init__.py").write_text("import click\nfrom .. import files\n")
    (pkg / "files.py").write_text("def f():\n    from . import service\n")
    (pkg / "service.py").write_text("from .files import f\nfrom rich.table import Table\n")
    assert find_cycle(graph(tmp_path)) == [f"{PACKAGE}.files", f"{PACKAGE}.service", f"{PACKAGE}.files"]
    assert ui_imports(tmp_path) == [f"{PACKAGE}.service:2 rich.table"]
    (pkg / "files.py").write_text("X = 1\n")
    (pkg / "cli" / "views.py").write_text("from . import options\n")
    (pkg / "cli" / "options.py").write_text("from .. import cli\n")  # the package __init__ itself: an edge
    assert find_cycle(graph(tmp_path)) is None
    (pkg / "cli" / "__init__.py").write_text("from . import views\n")
    assert find_cycle(graph(tmp_path)) == [f"{PACKAGE}.cli", f"{PACKAGE}.cli.views", f"{PACKAGE}.cli.options",
                                           f"{PACKAGE}.cli"]


@pytest.mark.parametrize("check", ["cycle", "ui"])
def test_the_checks_fail_on_the_old_shape(tmp_path, check):
    """Today's circles and imports, in miniature: cli.py <-> systemd.py, notify <-> notify_events (lazily)."""
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text("import click\nfrom .systemd import group\n")
    (pkg / "systemd.py").write_text("import click\ndef install():\n    from .cli import write_atomically\n")
    (pkg / "notify.py").write_text("import click\ndef after_run():\n    from . import notify_events\n")
    (pkg / "notify_events.py").write_text("from .notify import Notifier\n")
    if check == "cycle":
        assert find_cycle(graph(tmp_path)) == [f"{PACKAGE}.cli", f"{PACKAGE}.systemd", f"{PACKAGE}.cli"]
    else:
        assert ui_imports(tmp_path) == [f"{PACKAGE}.notify:1 click", f"{PACKAGE}.systemd:1 click"]
        assert cli_importers(tmp_path) == [f"{PACKAGE}.systemd"]


def misplaced(root: Path = ROOT) -> list[str]:
    """'module:line what' for SQL text outside the history's classes and for a hand-made parse of a Z timestamp
    (fromisoformat of a .replace("Z", ...)) outside timefmt."""
    out = []
    for name, (path, tree) in modules(root).items():
        for node in ast.walk(tree):
            if name not in HISTORY and isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and SQL.match(node.value):
                out.append(f"{name}:{node.lineno} SQL")
            if name != TIMESTAMPS and isinstance(node, ast.Call) and \
                    getattr(node.func, "attr", getattr(node.func, "id", None)) == "fromisoformat" and \
                    any(isinstance(a, ast.Call) and getattr(a.func, "attr", None) == "replace" and a.args
                        and isinstance(a.args[0], ast.Constant) and a.args[0].value == "Z" for a in node.args):
                out.append(f"{name}:{node.lineno} timestamp parsed by hand")
    return sorted(out)


def test_sql_only_in_the_history_and_timestamps_parsed_in_one_place():
    assert misplaced() == []


def test_the_check_finds_sql_and_hand_parsed_timestamps(tmp_path):
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "store.py").write_text('Q = "SELECT * FROM runs"\n')
    (pkg / "prometheus.py").write_text('def latest(db):\n    return db.execute("""\n  WITH latest AS (SELECT 1)""")\n')
    (pkg / "view.py").write_text("from datetime import datetime\n"
                                 "until = datetime.fromisoformat(text.replace('Z', '+00:00'))\n"
                                 "label = 'with nvidia module 570'\n")
    assert misplaced(tmp_path) == [f"{PACKAGE}.prometheus:2 SQL", f"{PACKAGE}.view:2 timestamp parsed by hand"]
