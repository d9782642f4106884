"""Rack-scale NVLink domains (a GB200 NVL72 rack's trays): the IMEX service that joins a host into its domain, and the
domain as the inventory sees it (one driver version on every host, the inventory's name for it). Hosts whose GPUs
report no multi-node NVLink domain (facts.imex null: HGX boards, PCIe GPUs) have nothing here to judge."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..fleet import domains
from .. import resources
from .base import Check, failed, not_applicable, passed, running_version, unread_message, version_tuple, warned
from .registry import control

NO_DOMAIN = "no multi-node NVLink domain: the GPUs report no cluster UUID"
ACROSS = "judged across the inventory by fleetctl audit, not on one host"
SHOWN = 3  # hosts or peers a message names before "+N more"


def imex_of(facts: dict[str, Any]) -> dict[str, Any] | None:
    return facts.get("imex")  # absent from facts collected before issue 34


def upstream(version: str | None) -> str | None:
    """'570.86.15-1' -> '570.86.15'."""
    return resources.module_utils("fleetctl_packaging").upstream_version(version) if version else None


def imex_utils() -> Any:
    """The host's IMEX readers (module_utils/fleetctl_imex.py): how addresses compare, how many nodes a domain has."""
    return resources.module_utils("fleetctl_imex")


def shown(items: list[str]) -> str:
    return ", ".join(items[:SHOWN]) + (f" +{len(items) - SHOWN} more" if len(items) > SHOWN else "")


@control("imex.service", "IMEX installed and running", "critical", ("imex.package", "imex.running"),
         "install nvidia-imex-<branch> at exactly the driver's version, list every tray of the rack in "
         "/etc/nvidia-imex/nodes_config.cfg, then systemctl enable --now nvidia-imex; its log is "
         "/var/log/nvidia-imex.log", roles=("health", "restored_on_rollback", "domain_formed"))
def imex_service(facts, policy):
    """Fails when the host's GPUs are in a multi-node NVLink domain and IMEX is not installed (no nvidia-imex package
    nor binary) or not running, saying which; warns when it runs but nvidia-imex.service is not enabled (it would not
    come back after a reboot). A tray without IMEX breaks every multi-node job of its rack."""
    imex = imex_of(facts)
    if imex is None:
        return not_applicable(NO_DOMAIN)
    evidence = {k: imex.get(k) for k in ("package", "package_version", "version", "running", "enabled")}
    if imex["package"] is None and imex["version"] is None:
        return failed("IMEX is not installed (no nvidia-imex package or binary) on a host of a multi-node NVLink "
                      "domain: multi-node jobs cannot share GPU memory across its trays", **evidence)
    what = f"nvidia-imex {imex['package_version'] or imex['version']}"
    if not imex["running"]:
        return failed(f"{what} is installed but not running"
                      + (" nor enabled at boot" if imex["enabled"] is False else ""), **evidence)
    if imex["enabled"] is False:
        return warned(f"{what} runs, but nvidia-imex.service is not enabled: it will not start after a reboot",
                      **evidence)
    return passed(f"{what} running", **evidence)


@control("imex.version", "IMEX matches the driver", "critical", ("imex.package_version", "driver.module_version"),
         "install nvidia-imex-<branch> of exactly the driver's version and restart nvidia-imex",
         roles=("target", "restored_on_rollback"))
def imex_version(facts, policy):
    """Fails when IMEX's version (what `nvidia-imex --version` says, else its package's upstream version) is not the
    running driver's: IMEX refuses to start against another driver ("NvGpu Library version ... is not matching with
    current GPU driver version"). Not applicable without IMEX installed (imex.service says so)."""
    imex = imex_of(facts)
    if imex is None:
        return not_applicable(NO_DOMAIN)
    driver = running_version(facts)
    version = imex["version"] or upstream(imex["package_version"])
    if version is None:
        return not_applicable("IMEX is not installed (imex.service)")
    if driver is None:
        return not_applicable("no driver loaded")
    evidence = {"imex": version, "package_version": imex["package_version"], "driver": driver}
    if version != driver:
        return failed(f"IMEX {version} does not match driver {driver}: nvidia-imex will not start against it",
                      **evidence)
    packaged = upstream(imex["package_version"])
    if packaged and packaged != version:
        return failed(f"the nvidia-imex binary is {version} but its package {imex['package']} is "
                      f"{imex['package_version']}", **evidence)
    return passed(f"IMEX {version} matches the driver", **evidence)


def _peer(node: dict[str, Any] | None, address: str) -> tuple[int, str]:
    """(rank, what) of a node of the node list as this host's IMEX sees it: 0 when it is READY and connected, higher
    the worse (missing from the domain status, then not READY, then not connected)."""
    name = f"{address} ({node['hostname']})" if node and node.get("hostname") else address
    if node is None:
        return 3, f"{name} missing from the domain status"
    if node["status"] != "READY":
        return 2, f"{name} {node['status']}"
    if node.get("connection") != "CONNECTED":
        return 1, f"{name} connection {node.get('connection') or 'unknown'}"
    return 0, name


@control("imex.domain", "IMEX domain formed with every peer", "high", ("imex.nodes", "imex.domain"),
         "on each peer named: systemctl status nvidia-imex and /var/log/nvidia-imex.log (a peer on another driver "
         "cannot join); `nvidia-imex-ctl -N` shows the domain; every tray's nodes_config.cfg must list the same "
         "addresses, once each", roles=("interconnect", "judged_by_verify", "domain_formed"))
def imex_domain(facts, policy):
    """Fails when a node of the IMEX node list (nodes_config.cfg) is missing from the domain status of
    `nvidia-imex-ctl -N`, not READY, or not CONNECTED to this host, naming the peers (address, host name, state:
    "10.213.0.4 (gb200-03) UNAVAILABLE"), the worst first; when the node list names an address twice; or when the
    domain is not UP although every node is. Addresses are compared as addresses (fd00::1 is FD00:0:0::1), host
    names whatever their case. A node list or domain status of more nodes than an IMEX domain holds (1024) is an
    error, not judged."""
    imex = imex_of(facts)
    if imex is None:
        return not_applicable(NO_DOMAIN)
    if imex["nodes"] is None or imex["domain"] is None:
        missing = "imex.nodes" if imex["nodes"] is None else "imex.domain"
        return Check("error", f"could not read the IMEX {'node list' if missing == 'imex.nodes' else 'domain'}: "
                              f"{unread_message(facts, missing)}")
    domain, utils = imex["domain"], imex_utils()
    for what, listed in ((f"node list ({imex['nodes_config_file']})", imex["nodes"]),
                         ("domain status", domain["nodes"])):
        if len(listed) > utils.MAX_NODES:
            return Check("error", f"the IMEX {what} names {len(listed)} nodes, more than an IMEX domain holds "
                                  f"({utils.MAX_NODES}): not judged")
    status: dict[str, Any] = {}
    for n in domain["nodes"]:
        status.setdefault(utils.address_key(n["address"]), n)
    listed = Counter(utils.address_key(a) for a in imex["nodes"])
    first = {utils.address_key(a): a for a in reversed(imex["nodes"])}  # each address as the list first writes it
    judged = sorted((_peer(status.get(key), first[key]) for key in listed), key=lambda p: -p[0])
    bad = [what for rank, what in judged if rank]
    twice = sorted(first[key] for key, count in listed.items() if count > 1)
    evidence = {"status": domain["status"], "nodes": len(judged), "not_ready": bad, "listed_twice": twice}
    problems = ([f"IMEX domain {domain['status']}: {shown(bad)}"] if bad else []) + (
        [f"the node list ({imex['nodes_config_file']}) names {', '.join(twice)} twice"] if twice else [])
    if not problems and domain["status"] != "UP":
        problems.append(f"IMEX domain {domain['status']} although all {len(judged)} nodes are READY and connected")
    if problems:
        return failed("; ".join(problems), **evidence)
    return passed(f"IMEX domain UP: all {len(judged)} nodes READY and connected", **evidence)


# ---- the domain across the inventory ------------------------------------------------------------------------------

def driver_census(members: dict[Any, dict[str, Any] | None]) -> dict[str, str | None]:
    """The running driver of each host of an NVLink domain that has facts: {host: version, None when none runs}."""
    return {h.name: running_version(f) for h, f in members.items() if f is not None}


def _runs(hosts: list[str], version: str | None) -> str:
    verb = "runs" if len(hosts) == 1 else "run"
    return f"{shown(hosts)} {verb} {version or 'no driver'}"


@control("nvlink.domain_uniform", "One driver version across the NVLink domain", "critical", (),
         "move the odd hosts to the domain's version, or the whole domain to one version: fleetctl plan lays a "
         "domain into one wave whole", peers=driver_census, peers_by="nvlink_domain")
def nvlink_domain_uniform(facts, policy, peers):
    """Fails when the hosts of the host's NVLink domain (domains.group: the same reported or declared domain, or named
    in each other's IMEX node list) do not all run the same driver version, naming the odd hosts and what the others
    run ("gb200-03 runs 580.65.06; the domain's other 2 hosts run 570.86.15"); every host of a mixed domain fails, as
    the rack's IMEX domain breaks for all. Judged across the inventory by the audit (not by fleetctl check)."""
    if imex_of(facts) is None:
        return not_applicable(NO_DOMAIN)
    if peers is None:
        return not_applicable(ACROSS)
    domain, versions = peers
    evidence = {"domain": domain, "versions": versions}
    if len(versions) < 2:
        return not_applicable(f"no other host of NVLink domain {domain} to compare with", **evidence)
    by_version: dict[str | None, list[str]] = {}
    for host, version in versions.items():
        by_version.setdefault(version, []).append(host)
    if len(by_version) == 1:
        only = next(iter(by_version)) or "no driver"
        return passed(f"all {len(versions)} hosts of NVLink domain {domain} run {only}", **evidence)
    ranked = sorted(by_version.items(), key=lambda kv: (-len(kv[1]), version_tuple(kv[0])))
    (most, majority), odd = ranked[0], ranked[1:]
    if 2 * len(majority) > len(versions):
        return failed("; ".join(_runs(hosts, v) for v, hosts in odd)
                      + f"; the domain's other {len(majority)} hosts run {most or 'no driver'}", **evidence)
    return failed(f"the {len(versions)} hosts of NVLink domain {domain} run {len(ranked)} driver versions: "
                  + "; ".join(_runs(hosts, v) for v, hosts in ranked), **evidence)


def declarations(members: dict[Any, dict[str, Any] | None]) -> dict[str, tuple[str | None, str | None]]:
    """{host: (its fleetctl_nvlink_domain, the domain its GPUs report)} of the hosts of an NVLink domain with facts."""
    return {h.name: (domains.declared(h), domains.reported(f)) for h, f in members.items() if f is not None}


def _pair(pair: tuple[str | None, str | None]) -> str:
    declared, reported = pair
    return (f"{declared or f'no {domains.DECLARED_VAR}'}, GPUs reporting "
            f"{reported or 'no multi-node NVLink domain'}")


@control("nvlink.domain_declared", "The inventory's NVLink domain as the GPUs report it", "medium", (),
         f"set {domains.DECLARED_VAR} to the same name on exactly the hosts whose GPUs report that domain (a rack's "
         f"trays), or leave it out", peers=declarations, peers_by="nvlink_domain")
def nvlink_domain_declared(facts, policy, peers):
    """Fails when the inventory variable `fleetctl_nvlink_domain` disagrees with what the GPUs report: the hosts of one
    reported domain declare different names (or some none), or a host is declared into a domain its GPUs do not report
    (another one, or none: an HGX host); names the odd hosts. Not applicable where no host of the domain declares one;
    judged across the inventory by the audit (not by fleetctl check)."""
    if peers is None:
        return not_applicable(ACROSS)
    domain, pairs = peers
    if not any(declared for declared, _ in pairs.values()):
        return not_applicable(f"no host of NVLink domain {domain} sets {domains.DECLARED_VAR}")
    evidence = {"domain": domain, "hosts": {h: {"declared": d, "reported": r} for h, (d, r) in pairs.items()}}
    by_pair: dict[tuple[str | None, str | None], list[str]] = {}
    for host, pair in pairs.items():
        by_pair.setdefault(pair, []).append(host)
    ranked = sorted(by_pair.items(), key=lambda kv: -len(kv[1]))
    (most, majority), odd = ranked[0], ranked[1:]
    if not odd:
        if most[1] is None:
            return failed(f"{shown(majority)} {'declares' if len(majority) == 1 else 'declare'} "
                          f"{domains.DECLARED_VAR} {most[0]}, but the GPUs report no multi-node NVLink domain",
                          **evidence)
        return passed(f"{domains.DECLARED_VAR} {most[0]} on all {len(majority)} hosts whose GPUs report {most[1]}",
                      **evidence)
    if 2 * len(majority) > len(pairs):
        return failed("; ".join(f"{shown(hosts)}: {_pair(pair)}" for pair, hosts in odd)
                      + f"; the domain's other {len(majority)} hosts: {_pair(most)}", **evidence)
    return failed(f"the hosts of NVLink domain {domain} disagree: "
                  + "; ".join(f"{shown(hosts)}: {_pair(pair)}" for pair, hosts in ranked), **evidence)
