"""The packages' import rules: each package of orchestrator/ that declares MAY_IMPORT in its
__init__.py (one place) imports nothing of fleetctl beyond itself, orchestrator's own __init__ and what it declares
(a dotted prefix: "orchestrator.fleet" allows every module of the fleet). Every import counts, a function's or
TYPE_CHECKING's too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def declared(init: Path, name: str) -> tuple[str, ...] | None:
    """The tuple NAME is given in the module INIT, read with ast; None where it has none."""
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            return tuple(ast.literal_eval(node.value))
    return None


def rules(root: Path) -> dict[str, tuple[str, ...]]:
    """Package (dotted) -> its MAY_IMPORT and the shared helpers (orchestrator.SHARED), from each __init__.py
    under ROOT/orchestrator that declares MAY_IMPORT."""
    shared = declared(root / "orchestrator" / "__init__.py", "SHARED") or ()
    out = {}
    for init in sorted((root / "orchestrator").rglob("__init__.py")):
        may = declared(init, "MAY_IMPORT")
        if may is not None:
            out[".".join(init.relative_to(root).parent.parts)] = may + shared
    return out


def imports(root: Path, path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every fleetctl module PATH imports: `from X import y` counts X.y where it is a
    module, else X."""
    rel = path.relative_to(root).with_suffix("")
    package = list(rel.parts[:-1]) if rel.name != "__init__" else list(rel.parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "orchestrator"]
        elif isinstance(node, ast.ImportFrom):
            base = (package[:len(package) - node.level + 1] if node.level else []) + \
                (node.module.split(".") if node.module else [])
            full = ".".join(base)
            if base[:1] != ["orchestrator"]:
                continue
            for a in node.names:
                sub = Path(root, *base, a.name)
                out.append((node.lineno, f"{full}.{a.name}" if sub.with_suffix(".py").exists() or
                            (sub / "__init__.py").exists() else full))
    return out


def broken(root: Path) -> list[str]:
    """'path:line: imports X, which package P may not (it may: ...)' for every import against the rules."""
    declared = rules(root)
    out = []
    for path in sorted((root / "orchestrator").rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        owners = [p for p in declared if module == p + ".__init__" or module.startswith(p + ".")]
        if not owners:
            continue
        package = max(owners, key=len)
        allowed = (package, "orchestrator") + declared[package]
        for line, target in imports(root, path):
            if not any(target == a or (a != "orchestrator" and target.startswith(a + ".")) for a in allowed):
                out.append(f"{path.relative_to(root)}:{line}: imports {target}, which {package} may not (it may: "
                           f"{', '.join(declared[package])})")
    return out


def test_every_package_imports_only_what_its_init_declares():
    assert rules(ROOT), "no package declares MAY_IMPORT"
    assert broken(ROOT) == []


def test_an_import_a_package_does_not_declare_is_named_with_its_line(tmp_path):
    pkg = tmp_path / "orchestrator" / "low"
    pkg.mkdir(parents=True)
    (tmp_path / "orchestrator" / "__init__.py").write_text('SHARED = ("orchestrator.errors",)\n')
    (tmp_path / "orchestrator" / "high.py").write_text("")
    (tmp_path / "orchestrator" / "errors.py").write_text("")
    (pkg / "__init__.py").write_text("MAY_IMPORT = ()\n")
    (pkg / "ok.py").write_text("from .. import errors\nfrom . import other\n")
    (pkg / "other.py").write_text("def f():\n    from ..high import x\n")
    assert broken(tmp_path) == ["orchestrator/low/other.py:2: imports orchestrator.high, which orchestrator.low "
                                "may not (it may: orchestrator.errors)"]
