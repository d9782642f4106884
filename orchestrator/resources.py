"""Where the on-host parts (playbooks, roles, schemas) live: beside the package in a wheel, the repo root in a checkout."""

from __future__ import annotations

from functools import cache
from pathlib import Path

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
