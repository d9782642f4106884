"""Where the on-host parts live (playbooks, schemas and the fleetctl.gpu Ansible collection with its roles and
modules): beside the package in a wheel, the repo root in a checkout."""

from __future__ import annotations

import importlib
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

_PACKAGE = Path(__file__).resolve().parent
COLLECTION = ("fleetctl", "gpu")  # namespace, name: its roles and modules are used by FQCN (fleetctl.gpu.gpu_facts)


@cache
def root() -> Path:
    bundled = _PACKAGE / "_assets"
    return bundled if (bundled / "playbooks").is_dir() else _PACKAGE.parent


def playbook(name: str) -> Path:
    return root() / "playbooks" / name


def collections_dir() -> Path:
    """The directory ANSIBLE_COLLECTIONS_PATH names: it holds ansible_collections/fleetctl/gpu."""
    return root() / "collections"


def collection_dir() -> Path:
    return collections_dir().joinpath("ansible_collections", *COLLECTION)


def role_dir(name: str) -> Path:
    return collection_dir() / "roles" / name


def schema_path(name: str) -> Path:
    return root() / "schemas" / f"{name}.schema.json"


def data_path(name: str) -> Path:
    return _PACKAGE / "data" / name


@cache
def module_utils(name: str) -> ModuleType:
    """A module_utils file of the collection (plugins/module_utils/NAME.py), imported on the controller under the
    name the hosts import it by: the rules the hosts apply and the controller's are one copy."""
    path = str(collections_dir())
    if path not in sys.path:
        sys.path.append(path)  # ansible_collections is a namespace package: this adds fleetctl.gpu to it
    return importlib.import_module(f"ansible_collections.{'.'.join(COLLECTION)}.plugins.module_utils.{name}")
