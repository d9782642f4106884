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
UI_LIBRARIES = ("click", "rich")
# the only modules with SQL
HISTORY = (f"{PACKAGE}.history.store", f"{PACKAGE}.history.chain", f"{PACKAGE}.campaign.journal",
           f"{PACKAGE}.history.ledger")  # the ledger: an index of the history beside it
TIMESTAMPS = f"{PACKAGE}.history.timefmt"  # the only module parsing the history's timestamps (a Z is UTC)
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
    """'module:line library' for each import of click or rich outside the command-line layer."""
    out = []
    for name, (path, tree) in modules(root).items():
        if name == CLI or name.startswith(CLI + "."):
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
    (pkg / "notify").mkdir(parents=True, exist_ok=True)
    (pkg / "notify" / "send.py").write_text("import click\ndef after_run():\n    from . import notify_events\n")
    (pkg / "notify" / "events.py").write_text("from .notify import Notifier\n")
    if check == "cycle":
        assert find_cycle(graph(tmp_path)) == [f"{PACKAGE}.cli", f"{PACKAGE}.systemd", f"{PACKAGE}.cli"]
    else:
        assert ui_imports(tmp_path) == [f"{PACKAGE}.notify.send:1 click", f"{PACKAGE}.systemd:1 click"]
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
    (pkg / "history").mkdir(parents=True, exist_ok=True)
    (pkg / "history" / "store.py").write_text('Q = "SELECT * FROM runs"\n')
    (pkg / "prometheus.py").write_text('def latest(db):\n    return db.execute("""\n  WITH latest AS (SELECT 1)""")\n')
    (pkg / "view.py").write_text("from datetime import datetime\n"
                                 "until = datetime.fromisoformat(text.replace('Z', '+00:00'))\n"
                                 "label = 'with nvidia module 570'\n")
    assert misplaced(tmp_path) == [f"{PACKAGE}.prometheus:2 SQL", f"{PACKAGE}.view:2 timestamp parsed by hand"]


# ---- exit codes and states: declared once (issue 33) ------------------------------------------------------------

EXIT_CODES = f"{PACKAGE}.exitcodes"  # the only module with an exit code's number
TRANSITIONS = f"{PACKAGE}.campaign.transitions"  # the only module naming a campaign or host state by its string
EXIT_CALLS = ("exit", "SystemExit", "Exit")  # sys.exit(N), raise SystemExit(N), ctx.exit(N), click's Exit(N)
EXIT_WORDS = re.compile(r"\bexit(?:s|ed|ing)?(?: with)? [0-9]+\b")  # "(exit 5)" in a help text or docstring


def _ints(node: ast.AST) -> list[ast.Constant]:
    return [c for c in ast.walk(node) if isinstance(c, ast.Constant) and type(c.value) is int]


def _named_exit(node: ast.AST) -> bool:
    """NODE names an exit code: a name, attribute, subscript key or keyword with "exit" in it, or a variable
    `code` (not an attribute: an HTTP status is e.code)."""
    if isinstance(node, ast.Subscript):
        key = node.slice
        return isinstance(key, ast.Constant) and isinstance(key.value, str) and "exit" in key.value.lower()
    if isinstance(node, ast.Constant):
        node = node.value
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else \
        node if isinstance(node, str) else ""
    return "exit" in name.lower() or (name == "code" and not isinstance(node, ast.Attribute))


def exit_literals(root: Path = ROOT) -> list[str]:
    """'module:line' for each integer literal that is an exit code outside exitcodes.py: the argument of an exit
    call; assigned to (or compared with) a name, attribute, key or keyword about an exit code; returned by a
    function annotated to return Exit; `return N` or `return N + M` alone; "exit N" in a string (a help text, a
    docstring, a message)."""
    out = set()
    for name, (path, tree) in modules(root).items():
        if name == EXIT_CODES:
            continue
        found: list[ast.Constant] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in EXIT_CALLS:
                found += [c for a in node.args for c in _ints(a)]
            if isinstance(node, ast.Call):
                found += [c for k in node.keywords if k.arg and _named_exit(k.arg) for c in _ints(k.value)]
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
                if any(_named_exit(t) for t in flat):
                    found += _ints(node.value)
            if isinstance(node, ast.Dict):
                found += [c for k, v in zip(node.keys, node.values) if k is not None and _named_exit(k) for c in _ints(v)]
            if isinstance(node, ast.Compare) and any(_named_exit(s) for s in [node.left, *node.comparators]):
                found += [c for s in [node.left, *node.comparators] for c in _ints(s) if s is c]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                exits = node.returns is not None and "Exit" in ast.unparse(node.returns)
                for r in ast.walk(node):
                    if isinstance(r, ast.Return) and r.value is not None:
                        if exits or all(isinstance(c, (ast.Constant, ast.BinOp, ast.operator)) for c in
                                         ast.walk(r.value)) and _ints(r.value):
                            found += _ints(r.value)
        out |= {f"{name}:{c.lineno}" for c in found}
        out |= {f"{name}:{s.lineno + s.value[:m.start()].count(chr(10))}" for s in ast.walk(tree)
                if isinstance(s, ast.Constant) and isinstance(s.value, str) for m in EXIT_WORDS.finditer(s.value)}
    return sorted(out)


def _strings(node: ast.AST) -> list[ast.Constant]:
    """NODE itself, or the elements of a literal tuple, list or set, that are string constants."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [c for c in items if isinstance(c, ast.Constant) and isinstance(c.value, str)]


def state_names(root: Path = ROOT) -> tuple[set[str], set[str]]:
    """(every host and campaign state, the steps' names), read off transitions.py's enums and host table (a row's
    state, HostState.X, names its step)."""
    path, tree = modules(root)[TRANSITIONS]
    members, steps = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name in ("HostState", "CampaignState"):
            members |= {a.targets[0].id: a.value.value for a in node.body
                        if isinstance(a, ast.Assign) and isinstance(a.value, ast.Constant)}
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Row" and node.args:
            steps.add(getattr(node.args[0], "attr", None))
    return set(members.values()), {members[s] for s in steps if s in members}


# State names that are also words of another vocabulary: flagged only where they are used as a state (compared
# with, or stored as, a `state`). Every other state name is flagged wherever it is written.
SHARED = {
    "done": "a run's status and a step's status (the runs and campaign_steps tables)",
    "failed": "a run's status, a step's status, a playbook outcome",
    "running": "a run's status; a daemon's (fabric manager, persistenced) in the facts",
    "held": "a driver package's apt hold (the facts)",
    "skipped": "a plan verdict (plan.classify)",
    "not_started": "the fabric manager's state (the facts)",
}  # and each state that names the step a host does next (the host table's step column): that step's name
# Deliberate exceptions: (module, name) -> why; they hold only as a key (a document's field) or, in notify_events,
# as the notification's name (the `event` argument of CampaignNotes.event, and of its declaration, Note(event, ...)).
EXCEPTIONS = {
    (f"{PACKAGE}.campaign.readmodel", "soaking"): "the campaign document's soak.soaking field (a boolean)",
    (f"{PACKAGE}.cli.campaign_view", "soaking"): "reads that field",
    (f"{PACKAGE}.report", "rolled_back"): "the compliance report's field: hosts a campaign rolled back",
    (f"{PACKAGE}.report", "rollback_failed"): "the compliance report's field: hosts whose rollback failed",
    (f"{PACKAGE}.notify.events", "rolled_back"): "a notification's name (notification.schema.json)",
    (f"{PACKAGE}.notify.events", "halted"): "a notification's name (notification.schema.json)",
    (f"{PACKAGE}.notify.events", "aborted"): "a notification's name (notification.schema.json)",
    (f"{PACKAGE}.notify.events", "done"): "a notification's name (notification.schema.json)",
}
STATE_KEYS = ("state", "campaign_state", "state_from")


def _reads_state(node: ast.AST) -> bool:
    """X["state"], X.state, or a variable named state or *_state."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value in STATE_KEYS
    if isinstance(node, ast.Attribute):
        return node.attr == "state"
    return isinstance(node, ast.Name) and (node.id == "state" or node.id.endswith("_state"))


def state_literals(root: Path = ROOT) -> list[str]:
    """'module:line name' for each campaign or host state written as a string outside transitions.py."""
    states, steps = state_names(root)
    shared = (set(SHARED) | steps) & states
    out = set()
    for name, (path, tree) in modules(root).items():
        if name == TRANSITIONS:
            continue
        allowed: set[int] = set()  # ids of the constants an exception covers
        literals = {}  # module-level NAME = ("a", "b") -> its strings (a comparison through a name is one too)
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                allowed |= {id(k) for k in node.keys if k is not None}
            if isinstance(node, ast.Subscript):
                allowed.add(id(node.slice))
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("event", "ended") and len(node.args) > 1:
                allowed.add(id(node.args[1]))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Note" and node.args:
                allowed.add(id(node.args[0]))
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                literals[node.targets[0].id] = _strings(node.value)
        used_as_state: list[ast.Constant] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(_reads_state(s) for s in sides):
                    for s in sides:
                        used_as_state += literals.get(s.id, []) if isinstance(s, ast.Name) else _strings(s)
            elif isinstance(node, ast.Assign) and any(_reads_state(t) for t in node.targets):
                used_as_state += _strings(node.value)
            elif isinstance(node, ast.Dict):
                used_as_state += [c for k, v in zip(node.keys, node.values)
                                  if isinstance(k, ast.Constant) and k.value in STATE_KEYS for c in _strings(v)]
            elif isinstance(node, ast.Call):
                used_as_state += [c for k in node.keywords if k.arg in STATE_KEYS for c in _strings(k.value)]
        as_state = {id(c) for c in used_as_state}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in states):
                continue
            if node.value in shared and id(node) not in as_state:
                continue
            if (name, node.value) in EXCEPTIONS and id(node) in allowed:
                continue
            out.add(f"{name}:{node.lineno} {node.value}")
    return sorted(out)


def test_no_exit_code_number_outside_the_enum():
    assert exit_literals() == [], "exit codes are orchestrator/exitcodes.Exit members: " + "; ".join(exit_literals())


def test_no_state_written_as_a_string_outside_the_state_machine():
    assert state_literals() == [], "states are transitions.HostState/CampaignState members: " + "; ".join(
        state_literals())


def test_the_checks_find_exit_codes_and_states_written_as_numbers_and_strings(tmp_path):
    """Today's shapes, in miniature: each is found; the same words as a run's status, a step's name, a document's
    field or a notification's name are not."""
    pkg = tmp_path / PACKAGE
    (pkg / "campaign").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "campaign" / "__init__.py").write_text("")
    (pkg / "campaign" / "transitions.py").write_text(
        "class HostState(StrEnum):\n    DRAIN = 'drain'\n    DONE = 'done'\n    HELD = 'held'\n"
        "class CampaignState(StrEnum):\n    SOAKING = 'soaking'\n    HALTED = 'halted'\n"
        "TABLE = (Row(HostState.DRAIN, HostState.DONE),)\n")
    (pkg / "exitcodes.py").write_text("class Exit(IntEnum):\n    OK = 0\n")
    (pkg / "cli.py").write_text(
        "import sys\n"
        "EXIT_USAGE = 2\n"                                          # 2
        "def main(ok):\n"
        "    sys.exit(0 if ok else 1)\n"                            # 4
        "def verdict() -> tuple[Exit, str]:\n"
        "    return 1, 'broken'\n"                                  # 6
        "def code(signum):\n"
        "    return 128 + 2\n"                                      # 8
        "summary = {'exit_code': 3, 'hosts': 1}\n"                  # 9
        "style = 'red' if summary['exit_code'] == 1 else 'green'\n"  # 10
        "def count(rows):\n"
        "    return 0 if not rows else len(rows)\n"
        "HELP = 'No wave starts after it (exit 5).'\n"            # 13
        "WORDS = f'exit {Exit.HALTED:d}; its exit code'\n"
        "def plan():\n"
        "    \"\"\"Plan the waves; an unreachable host\n"
        "    makes it exit 3.\"\"\"\n")                             # 17
    (pkg / "engine.py").write_text(
        "INTERRUPTIBLE = ('running', 'soaking')\n"                  # 1: soaking, anywhere
        "def f(c, r, journal):\n"
        "    if c['state'] == 'halted' or r.state in ('done', 'failed'):\n"  # 3: halted, done
        "        journal.note(state='held')\n"                      # 4: held
        "    host = {'state': 'drain', 'run': 'done'}\n"            # 5: drain as a state, done as a status
        "    journal.step_detail(c, 'drain')\n"                     # a step's name
        "    return {'soaking': True}['soaking'], c['status'] == 'done'\n")  # a field, a run's status
    (pkg / "notify").mkdir(parents=True, exist_ok=True)
    (pkg / "notify" / "events.py").write_text("def f(self, r):\n    return self.event(r, 'halted', 'critical')\n")
    assert exit_literals(tmp_path) == [f"{PACKAGE}.cli:{n}" for n in (10, 13, 17, 2, 4, 6, 8, 9)]
    assert state_literals(tmp_path) == [f"{PACKAGE}.engine:1 soaking", f"{PACKAGE}.engine:3 done",
                                        f"{PACKAGE}.engine:3 halted", f"{PACKAGE}.engine:4 held",
                                        f"{PACKAGE}.engine:5 drain", f"{PACKAGE}.engine:7 soaking"]
