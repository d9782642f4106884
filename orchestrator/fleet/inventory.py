"""The fleet: hosts, their groups and connection settings, from a real Ansible inventory (or localhost)."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import inputs, schemas
from ..errors import InputError

LOCALHOST = "localhost"


def primary_group(groups: list[str] | tuple[str, ...]) -> str:
    """The most specific inventory group (parents come first): the one whose baseline policy wins, the one a
    host's peers (audit) and its control cohort (canary metrics) are drawn from."""
    named = [g for g in groups if g != "all"]
    return named[-1] if named else "all"


@dataclass(frozen=True)
class Host:
    name: str
    groups: tuple[str, ...]  # inventory order: parents before children
    vars: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def group(self) -> str:
        """Its most specific group (primary_group): whose baseline policy wins, whom it is compared with."""
        return primary_group(self.groups)

    @property
    def connection(self) -> str:
        return str(self.vars.get("ansible_connection", "ssh"))

    @property
    def address(self) -> str:
        return str(self.vars.get("ansible_host", self.name))

    @property
    def port(self) -> int:
        return int(self.vars.get("ansible_port", 22))

    @property
    def plain_ssh(self) -> bool:
        """Reached directly at a literal address: what fleetctl's own SSH pre-flight can check. Templated
        addresses and jump hosts are left to OpenSSH (with host key checking on)."""
        values = [str(self.vars.get(k, "")) for k in ("ansible_host", "ansible_port", "ansible_ssh_common_args",
                                                      "ansible_ssh_extra_args", "ansible_ssh_args")]
        return not any("{{" in v or re.search(r"(?i)Proxy(Jump|Command)|HostKeyAlias", v) for v in values)


@dataclass(frozen=True)
class Fleet:
    source: str  # path of the inventory, or "localhost" for the embedded default
    hosts: tuple[Host, ...]
    groups: frozenset[str]
    runner_inventory: Any  # what ansible-runner takes: a path or an inline inventory dict
    # Ansible's parse warnings, shown once every input is known good (an input error stays one line)
    parse_warnings: str = field(default="", compare=False)

    def only(self, names: list[str] | set[str]) -> Fleet:
        """The same fleet restricted to NAMES (inventory order kept)."""
        wanted = set(names)
        return Fleet(self.source, tuple(h for h in self.hosts if h.name in wanted), self.groups,
                     self.runner_inventory)

    def host(self, name: str) -> Host:
        return self.by_name[name]

    @functools.cached_property
    def by_name(self) -> dict[str, Host]:
        """{name: Host}, made once: a lookup per host of a 60,000-host fleet is not a scan of it."""
        return {h.name: h for h in self.hosts}


def localhost() -> Fleet:
    hostvars = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    host = Host(LOCALHOST, ("all", "ungrouped"), hostvars)
    return Fleet(LOCALHOST, (host,), frozenset({"all", "ungrouped"}),
                 {"all": {"hosts": {LOCALHOST: hostvars}}})


SAFE_NAME = re.compile(r"[A-Za-z0-9_.:\[\]-]+")  # host names and addresses (fullmatch): nothing a shell would read
HOST_KEY_CHECKING_VARS = ("ansible_host_key_checking", "ansible_ssh_host_key_checking")
SSH_ARG_VARS = ("ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_ssh_args")


def check_host(source: str, name: str, hostvars: dict[str, Any]) -> None:
    """An InputError (one line) for a host fleetctl must not work on as written."""
    # A name that is not one (an inventory that is really another file: /etc/shadow) is not echoed.
    where = f"{source}: host {name!r}" if SAFE_NAME.fullmatch(name) and len(name) <= 253 else f"{source}: a host"
    address = str(hostvars.get("ansible_host", name))
    if not SAFE_NAME.fullmatch(name) or not (SAFE_NAME.fullmatch(address) or "{{" in address):
        raise InputError(f"{where}: host names and ansible_host may hold letters, digits and . _ - : [ ] only")
    port = hostvars.get("ansible_port", 22)
    if "{{" not in str(port) and (not re.fullmatch(r"[0-9]{1,5}", str(port)) or not 0 < int(port) < 65536):
        shown = f" {port!r}" if schemas.quotable(port) else ""
        raise InputError(f"{where}: ansible_port{shown} is not a port number")
    for var in HOST_KEY_CHECKING_VARS:
        if var in hostvars and str(hostvars[var]).lower() in ("false", "no", "0", "off"):
            raise InputError(f"{where}: {var}={hostvars[var]} turns host key checking off; fleetctl keeps it on")
    args = " ".join(str(hostvars.get(v, "") or "") for v in SSH_ARG_VARS)
    if re.search(r"(?i)StrictHostKeyChecking[= ](no|off|accept-new)\b", args):
        raise InputError(f"{where}: StrictHostKeyChecking=no in its SSH arguments; fleetctl keeps host key checking on")


def load(path: str | None, limit: str | None = None) -> Fleet:
    """Hosts of the inventory at PATH (restricted by an Ansible LIMIT pattern), or localhost when PATH is None."""
    for flag, value in (("--inventory", path), ("--limit", limit)):
        if value is not None and not value.strip():  # "$HOSTS" unset: not the whole fleet, nor the current directory
            raise InputError(f"{flag} {value!r}: empty (a variable that is not set?)")
    for pattern in re.split(r"[,:]", limit or ""):
        regex = pattern.lstrip("!&")
        if not regex.startswith("~"):
            continue
        try:  # Ansible reads an invalid `~regex` as one that matches every host: a typo must not mean the whole fleet
            re.compile(regex[1:])
        except re.error as e:
            raise InputError(f"--limit {limit!r}: {pattern!r} is not a valid regular expression ({e})") from None
    if path is None:
        fleet = localhost()
        if limit and limit not in ("all", LOCALHOST, "ungrouped"):
            raise InputError(f"--limit {limit!r} matches no host (no inventory given: the fleet is localhost)")
        return fleet
    source = Path(path)
    from ansible import constants as C
    from ansible.errors import AnsibleError
    from ansible.inventory.helpers import get_group_vars
    from ansible.inventory.manager import IGNORED, InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.utils.display import Display

    # Before Ansible reads anything (here, and in ansible-playbook): every file it would read is a regular file of
    # a bounded size, and what it may read as YAML is neither too deep (libyaml's composer: a segfault) nor full of
    # aliases (the billion laughs), and groups are nested at most 64 deep (Ansible's time grows with the cube of the
    # depth). A FIFO, /dev/zero, a name too long: one line.
    inputs.check_inventory(path, lambda name: bool(IGNORED.search(os.fsencode(name))))

    C.INVENTORY_UNPARSED_IS_FAILED = True  # a broken inventory is an error, not an empty fleet
    Display().verbosity = 0
    warnings = io.StringIO()  # Ansible's parse warnings run to many lines: shown only when the fleet loads
    try:
        with contextlib.redirect_stderr(warnings):
            manager = InventoryManager(loader=DataLoader(), sources=[str(source.resolve())])
            if limit:
                manager.subset(limit)
            selected = manager.get_hosts()
    except AnsibleError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        more = f" (ansible-inventory -i {path} --list says why)" if warnings.getvalue() else ""
        raise InputError(f"{path}: not a valid Ansible inventory: {first}{more}") from None
    if not selected:
        raise InputError(f"{path}: {'--limit ' + repr(limit) if limit else 'the inventory'} matches no host")
    hosts = []
    for h in selected:
        groups = sorted(h.get_groups(), key=lambda g: (g.depth, g.name))
        hostvars = get_group_vars(groups)
        hostvars.update(h.get_vars())
        check_host(str(source), h.name, hostvars)
        hosts.append(Host(h.name, tuple(g.name for g in groups), hostvars))
    return Fleet(str(source), tuple(hosts), frozenset(manager.groups), str(source.resolve()), warnings.getvalue())
