"""Where the on-host parts (playbooks, roles, schemas) live: beside the package in a wheel, the repo root in a checkout."""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from types import ModuleType

_PACKAGE = Path(__file__).resolve().parent


@cache
def root() -> Path:
    bundled = _PACKAGE / "_assets"
    return bundled if (bundled / "playbooks").is_dir() else _PACKAGE.parent


def playbook(name: str) -> Path:
    return root() / "playbooks" / name


def roles_dir() -> Path:
    return root() / "roles"


def schema_path(name: str) -> Path:
    return root() / "schemas" / f"{name}.schema.json"


def data_path(name: str) -> Path:
    return _PACKAGE / "data" / name


@cache
def module_utils(name: str) -> ModuleType:
    """A module_utils file the roles ship (roles/gpu_facts/module_utils/NAME.py), imported on the controller: the
    rules the hosts apply and the controller's are one copy."""
    spec = importlib.util.spec_from_file_location(f"fleetctl_roles_{name}",
                                                  roles_dir() / "gpu_facts" / "module_utils" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
