"""The lab network: bridge flbr0 (10.213.0.1/16) in the root namespace, one netns fl-<name> per host with a veth.

Lab traffic stays between the root namespace and the lab's own namespaces: no NAT, no default route out.
"""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

BRIDGE = "flbr0"
BRIDGE_ADDRESS = "10.213.0.1/16"
FIRST_HOST = ipaddress.ip_address("10.213.0.10")
PREFIX_LEN = 16
NETNS_PREFIX = "fl-"
VETH_PREFIX = "flv"
NETNS_DIR = Path("/run/netns")


class NetworkError(RuntimeError):
    pass


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc


def ip_batch(commands: list[str], netns: str | None = None) -> None:
    """Run many `ip` commands in one process (ip [-n NETNS] -batch), failing on the first error."""
    if not commands:
        return
    proc = subprocess.run(["ip", *(["-n", netns] if netns else []), "-batch", "-"], input="\n".join(commands) + "\n", capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:
        raise NetworkError(f"ip -batch: {proc.stderr.strip() or proc.returncode}")


def host_address(index: int) -> str:
    network = ipaddress.ip_network(BRIDGE_ADDRESS, strict=False)
    address = FIRST_HOST + index
    if address not in network or address == network.broadcast_address:
        raise NetworkError(f"host index {index} is outside {network}")
    return str(address)


def netns_name(host: str) -> str:
    return NETNS_PREFIX + host


def veth_name(index: int) -> str:
    return f"{VETH_PREFIX}{index}"  # IFNAMSIZ: 15 characters at most, so by index, not by host name


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def netns_list() -> list[str]:
    return sorted(p.name for p in NETNS_DIR.glob("*")) if NETNS_DIR.is_dir() else []


def lab_netns() -> list[str]:
    return [n for n in netns_list() if n.startswith(NETNS_PREFIX)]


def create_bridge() -> None:
    if not link_exists(BRIDGE):
        ip_batch([f"link add {BRIDGE} type bridge", f"addr add {BRIDGE_ADDRESS} dev {BRIDGE}",
                  f"link set {BRIDGE} up"])


def create_hosts(hosts: list[tuple[str, int, str]]) -> None:
    """For each (name, index, address): netns fl-<name>, veth flv<index> on the bridge, eth0 inside with ADDRESS."""
    root_side, per_ns = [], []
    for name, index, address in hosts:
        ns, veth = netns_name(name), veth_name(index)
        root_side += [f"netns add {ns}", f"link add {veth} type veth peer name eth0 netns {ns}",
                      f"link set {veth} master {BRIDGE}", f"link set {veth} up"]
        per_ns.append((ns, [f"addr add {address}/{PREFIX_LEN} dev eth0", "link set eth0 up", "link set lo up"]))
    ip_batch(root_side)
    for ns, commands in per_ns:
        ip_batch(commands, netns=ns)


def netns_pids(ns: str) -> list[int]:
    proc = ip("netns", "pids", ns, check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def delete_netns(ns: str) -> None:
    ip("netns", "del", ns, check=False)


def delete_link(name: str) -> None:
    if link_exists(name):
        ip("link", "del", name, check=False)


def delete_bridge() -> None:
    delete_link(BRIDGE)


def lab_veths() -> list[str]:
    return sorted(p.name for p in Path("/sys/class/net").glob(VETH_PREFIX + "*"))
