"""The fleet: hosts, their groups and connection settings, from a real Ansible inventory (or localhost)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputError

LOCALHOST = "localhost"


@dataclass(frozen=True)
class Host:
    name: str
    groups: tuple[str, ...]  # inventory order: parents before children
    vars: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def connection(self) -> str:
        return str(self.vars.get("ansible_connection", "ssh"))

    @property
    def address(self) -> str:
        return str(self.vars.get("ansible_host", self.name))

    @property
    def port(self) -> int:
        return int(self.vars.get("ansible_port", 22))


@dataclass(frozen=True)
class Fleet:
    source: str  # path of the inventory, or "localhost" for the embedded default
    hosts: tuple[Host, ...]
    groups: frozenset[str]
    runner_inventory: Any  # what ansible-runner takes: a path or an inline inventory dict


def localhost() -> Fleet:
    hostvars = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    host = Host(LOCALHOST, ("all", "ungrouped"), hostvars)
    return Fleet(LOCALHOST, (host,), frozenset({"all", "ungrouped"}),
                 {"all": {"hosts": {LOCALHOST: hostvars}}})


def load(path: str | None, limit: str | None = None) -> Fleet:
    """Hosts of the inventory at PATH (restricted by an Ansible LIMIT pattern), or localhost when PATH is None."""
    if path is None:
        fleet = localhost()
        if limit and limit not in ("all", LOCALHOST, "ungrouped"):
            raise InputError(f"--limit {limit!r} matches no host (no inventory given: the fleet is localhost)")
        return fleet
    source = Path(path)
    if not source.exists():
        raise InputError(f"{path}: inventory not found")
    from ansible import constants as C
    from ansible.errors import AnsibleError
    from ansible.inventory.helpers import get_group_vars
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.utils.display import Display

    C.INVENTORY_UNPARSED_IS_FAILED = True  # a broken inventory is an error, not an empty fleet
    Display().verbosity = 0
    try:
        manager = InventoryManager(loader=DataLoader(), sources=[str(source.resolve())])
        if limit:
            manager.subset(limit)
        selected = manager.get_hosts()
    except AnsibleError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"{path}: not a valid Ansible inventory: {first}") from None
    if not selected:
        raise InputError(f"{path}: {'--limit ' + repr(limit) if limit else 'the inventory'} matches no host")
    hosts = []
    for h in selected:
        groups = sorted(h.get_groups(), key=lambda g: (g.depth, g.name))
        hostvars = get_group_vars(groups)
        hostvars.update(h.get_vars())
        hosts.append(Host(h.name, tuple(g.name for g in groups), hostvars))
    return Fleet(str(source), tuple(hosts), frozenset(manager.groups), str(source.resolve()))
