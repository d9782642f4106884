"""The blessed matrix: load, validate, and resolve the policy that applies to one host."""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import inputs, resources, schemas
from .errors import InputError, yaml_error

DEFAULT_PATH = resources.data_path("default-baseline.yml")


@dataclass(frozen=True)
class Baseline:
    path: Path
    name: str
    digest: str  # sha256 of the file's bytes, so an auditor can check it with sha256sum
    groups: dict[str, dict[str, Any]]

    def policy_for(self, host_groups: list[str]) -> dict[str, Any]:
        """'all' first, then the host's groups in inventory order (parents before children); later wins."""
        policy: dict[str, Any] = {}
        for group in ["all"] + [g for g in host_groups if g != "all"]:
            if group in self.groups:
                policy = deep_merge(policy, self.groups[group])
        return policy

    def check_groups(self, known_groups: set[str]) -> None:
        unknown = sorted(set(self.groups) - known_groups - {"all"})
        if unknown:
            raise InputError(f"{self.path}: $.groups.{unknown[0]}: group '{unknown[0]}' is not in the inventory")

    def xid_overrides(self) -> dict[str, dict[str, Any]]:
        """Overrides of the 'all' group: the ones that travel to every host's collector."""
        return self.groups.get("all", {}).get("xid", {}).get("overrides", {})


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def non_string_key(node: Any, where: str = "$") -> tuple[str | None, Any]:
    """(JSON path, key) of the first mapping key YAML did not read as a string (94:, null:, 2024-01-01:), or
    (None, None). The schema's key patterns only look at strings, and the rest of fleetctl expects strings."""
    if isinstance(node, dict):
        for key, value in node.items():
            if not isinstance(key, str):
                return where, key
            found = non_string_key(value, f"{where}.{key}")
            if found[0]:
                return found
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found = non_string_key(value, f"{where}[{i}]")
            if found[0]:
                return found
    return None, None


def load(path: str | Path | None) -> Baseline:
    if isinstance(path, str) and not path.strip():  # "$BASELINE" unset: not silently the embedded one
        raise InputError(f"--baseline {path!r}: empty (a variable that is not set?)")
    path = Path(path) if path is not None else DEFAULT_PATH
    raw = inputs.read_regular(path, "baseline", inputs.MAX_DOCUMENT_BYTES)  # a FIFO, /dev/zero...: one line
    try:
        doc = inputs.load_yaml(raw, path)  # YAML too deep or full of aliases: one line
        schemas.check("baseline", doc, inputs.shown(path))
    except yaml.YAMLError as e:
        raise yaml_error(inputs.shown(path), e) from None
    except RecursionError:
        raise InputError(f"{inputs.shown(path)}: nested too deeply to be a baseline") from None
    where, key = non_string_key(doc)
    if where:
        raise InputError(f"{inputs.shown(path)}: {where}: key {key} is not a string (quote it in the YAML)")
    return Baseline(path=path, name=doc.get("name", path.stem), digest="sha256:" + hashlib.sha256(raw).hexdigest(),
                    groups=doc["groups"])
