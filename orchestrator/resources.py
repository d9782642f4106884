"""Where the on-host parts live (playbooks, schemas and the fleetctl.gpu Ansible collection with its roles and
modules): beside the package in a wheel, the repo root in a checkout."""

from __future__ import annotations

import importlib
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

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


@cache
def module(name: str) -> ModuleType:
    """A module of the collection (plugins/modules/NAME.py) imported as a Python module on this machine, for
    `fleetctl check` to run its code in-process (it imports Ansible only in its main())."""
    import importlib.util
    path = collection_dir() / "plugins" / "modules" / f"{name}.py"
    module_utils("fleetctl_gpus")  # ansible_collections on sys.path, for the module's own imports
    spec = importlib.util.spec_from_file_location(f"fleetctl_collection_{name}", path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


@cache
def role_defaults(name: str) -> dict[str, Any]:
    """The defaults of the collection's role NAME (roles/NAME/defaults/main.yml), read by libyaml where PyYAML has
    it (0.6 ms for gpu_facts' instead of 15: `fleetctl check` reads them on every run)."""
    import yaml
    return yaml.load((role_dir(name) / "defaults" / "main.yml").read_text(),
                     Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def xid_catalog() -> list[dict[str, Any]]:
    """The Xid table shipped with the gpu_facts role (one source of truth for both modules and `fleetctl check`)."""
    return role_defaults("gpu_facts")["gpu_facts_xid_catalog"]
