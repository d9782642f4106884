"""NVLink domains: the hosts whose GPUs share one rack-scale NVLink fabric (a GB200/GB300 NVL72 rack's 18 trays),
joined by IMEX. Their driver versions cannot be mixed, so the domain, not the host, is the unit of change.

A host's domain as its GPUs report it (`reported`): "<cluster UUID>/<clique id>" of NVML's fabric information
(facts.interconnect.gpus[*].fabric), when
every live GPU that reports a cluster UUID reports the same one (an HGX board reports the zero UUID: read as null, no
multi-node domain). The inventory may declare it: the host variable `fleetctl_nvlink_domain` names the domain (the
controls nvlink.domain_declared and nvlink.domain_uniform hold the two together).

`group` joins hosts into domains by any of: the same reported domain, the same declared name, an address of a
host's IMEX node list that is another host's `ansible_host`, compared as addresses (so a tray that is unreachable,
with no facts, still belongs to its rack). A host joined to no other is its own domain: an HGX fleet's units of
change are its hosts, as before. A domain's name: the declared one, else the reported one, else the host's own name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from .. import resources
from ..errors import InputError

DECLARED_VAR = "fleetctl_nvlink_domain"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")


@dataclass(frozen=True)
class Domain:
    name: str
    members: tuple[str, ...]  # inventory order
    multi: bool               # a multi-node NVLink domain (reported or declared), not a host on its own


def reported(facts: Mapping[str, Any] | None) -> str | None:
    """The multi-node NVLink domain the host's GPUs report, or None (no facts, no cluster UUID, or GPUs that
    disagree: nvlink.domain_uniform and gpu.fabric name those)."""
    seen = set(cliques(facts).values())
    return seen.pop() if len(seen) == 1 else None


def cliques(facts: Mapping[str, Any] | None) -> dict[str, str]:
    """PCI bus id -> "<cluster UUID>/<clique id>" of each live GPU in a multi-node NVLink domain (the rule the hosts
    apply: module_utils/fleetctl_imex.py; an HGX board's zero UUID is none)."""
    return resources.module_utils("fleetctl_imex").gpu_cliques((facts or {}).get("interconnect"))


def declared(host: Any) -> str | None:
    value = host.vars.get(DECLARED_VAR)
    return str(value) if value not in (None, "") else None


def check_declared(fleet: Any) -> None:
    """An inventory's `fleetctl_nvlink_domain` values are names (InputError: one line, before anything runs)."""
    for h in fleet.hosts:
        value = h.vars.get(DECLARED_VAR)
        if value not in (None, "") and (isinstance(value, bool) or not isinstance(value, (str, int))
                                        or not _NAME.fullmatch(str(value))):
            raise InputError(f"inventory: host {h.name}: {DECLARED_VAR} {str(value)[:40]!r} is not a domain name "
                             f"(1-128 letters, digits and . _ : / -)")


def node_list(facts: Mapping[str, Any] | None) -> list[str]:
    return list(((facts or {}).get("imex") or {}).get("nodes") or [])


def group(fleet: Any, facts: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Domain]:
    """Every inventory host's domain (FACTS: host -> its facts, None or absent when not collected)."""
    names = [h.name for h in fleet.hosts]
    parent = {n: n for n in names}

    def root(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    def join(a: str, b: str) -> None:
        parent[root(b)] = root(a)

    address_key = resources.module_utils("fleetctl_imex").address_key  # fd00::1 is FD00:0:0::1
    by_address = {address_key(str(h.vars["ansible_host"])): h.name
                  for h in fleet.hosts if h.vars.get("ansible_host")}
    first: dict[tuple[str, str], str] = {}
    multi = set()
    for h in fleet.hosts:
        keys = [("declared", declared(h)), ("reported", reported(facts.get(h.name)))]
        for key in [k for k in keys if k[1]]:
            multi.add(h.name)
            join(first.setdefault(key, h.name), h.name)
        for address in map(address_key, node_list(facts.get(h.name))):
            if address in by_address:
                multi.update((h.name, by_address[address]))
                join(h.name, by_address[address])
    members: dict[str, list[str]] = {}
    for n in names:
        members.setdefault(root(n), []).append(n)
    out = {}
    hosts = {h.name: h for h in fleet.hosts}
    for group_members in members.values():
        is_multi = any(m in multi for m in group_members)
        name = (next((d for m in group_members if (d := declared(hosts[m]))), None)
                or next((r for m in group_members if (r := reported(facts.get(m)))), None)
                or group_members[0])
        domain = Domain(name, tuple(group_members), is_multi)
        out.update({m: domain for m in group_members})
    return out
