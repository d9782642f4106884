"""The lab network, per lab slot n (0..15; slots.py hands them out): bridge flbr<n> (10.<213+n>.0.1/16) in the root
namespace, one netns per host (slot 0: fl-<name>, slot n: fl<n>-<name>) with a veth (slot 0: flv<index>, slot n:
fl<n>v<index>). Slot 0 has the names a single lab always had: flbr0, 10.213.0.0/16, fl-<name>, flv<index>.

Lab traffic stays between the root namespace and the lab's own namespaces: no NAT, no default route out.
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

SLOTS = 16                       # 10.213.0.0/16 .. 10.228.0.0/16
FIRST_OCTET, SECOND_OCTET = 10, 213
PREFIX_LEN = 16
HOST_OFFSET = 10                 # the first host is .0.10
IFNAMSIZ = 15                    # a link name's characters at most (16 with the NUL)
NETNS_DIR = Path("/run/netns")
SYS_NET = Path("/sys/class/net")


class NetworkError(RuntimeError):
    pass


@dataclass(frozen=True)
class Names:
    """Every machine-wide name of the lab in SLOT: its bridge, subnet, namespaces and veths."""
    slot: int

    def __post_init__(self):
        if not 0 <= self.slot < SLOTS:
            raise NetworkError(f"lab slot {self.slot} is outside 0..{SLOTS - 1}")

    @property
    def bridge(self) -> str:
        return f"flbr{self.slot}"

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.ip_network(f"{FIRST_OCTET}.{SECOND_OCTET + self.slot}.0.0/{PREFIX_LEN}")

    @property
    def bridge_address(self) -> str:
        return f"{self.subnet.network_address + 1}/{PREFIX_LEN}"

    @property
    def netns_prefix(self) -> str:
        return "fl-" if self.slot == 0 else f"fl{self.slot}-"

    @property
    def veth_prefix(self) -> str:
        return "flv" if self.slot == 0 else f"fl{self.slot}v"

    def host_address(self, index: int) -> str:
        address = self.subnet.network_address + HOST_OFFSET + index
        if index < 0 or address not in self.subnet or address == self.subnet.broadcast_address:
            raise NetworkError(f"host index {index} is outside {self.subnet}")
        return str(address)

    def netns(self, host: str) -> str:
        return self.netns_prefix + host

    def veth(self, index: int) -> str:
        name = f"{self.veth_prefix}{index}"  # IFNAMSIZ: 15 characters at most, so by index, not by host name
        if len(name) > IFNAMSIZ:
            raise NetworkError(f"veth name {name} is longer than {IFNAMSIZ} characters")
        return name

    def is_veth(self, name: str) -> bool:
        """NAME is one of this slot's veths (flv12 is slot 0's, fl1v2 slot 1's; fl10v2 is not slot 1's)."""
        return re.fullmatch(re.escape(self.veth_prefix) + r"\d+", name) is not None

    def is_netns(self, name: str) -> bool:
        return name.startswith(self.netns_prefix)

    # what of this slot is on the machine now
    def namespaces(self) -> list[str]:
        return [n for n in netns_list() if self.is_netns(n)]

    def veths(self) -> list[str]:
        return sorted(p.name for p in SYS_NET.glob(self.veth_prefix + "*") if self.is_veth(p.name))

    def in_use(self) -> bool:
        """Anything of this slot on the machine: its bridge, a namespace, a veth."""
        return link_exists(self.bridge) or bool(self.namespaces()) or bool(self.veths())


def names(slot: int) -> Names:
    return Names(slot)


def slot_of_bridge(bridge: str) -> int | None:
    """The slot a recorded bridge name (flbr<n>) stands for; None for a name the lab never makes."""
    m = re.fullmatch(r"flbr(\d+)", bridge or "")
    return int(m[1]) if m and int(m[1]) < SLOTS else None


# Slot 0, the names a single lab has always had (docs and older lab.json files use them).
BRIDGE = Names(0).bridge                      # flbr0
BRIDGE_ADDRESS = Names(0).bridge_address      # 10.213.0.1/16
NETNS_PREFIX = Names(0).netns_prefix          # fl-
VETH_PREFIX = Names(0).veth_prefix            # flv


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


def link_exists(name: str) -> bool:
    return (SYS_NET / name).exists()


def netns_list() -> list[str]:
    return sorted(p.name for p in NETNS_DIR.glob("*")) if NETNS_DIR.is_dir() else []


def create_bridge(bridge: str, address: str) -> None:
    if not link_exists(bridge):
        ip_batch([f"link add {bridge} type bridge", f"addr add {address} dev {bridge}", f"link set {bridge} up"])


def create_hosts(bridge: str, hosts: list[tuple[str, str, str]]) -> None:
    """For each (netns, veth, address): the namespace, the veth on BRIDGE, eth0 inside with ADDRESS."""
    root_side, per_ns = [], []
    for ns, veth, address in hosts:
        root_side += [f"netns add {ns}", f"link add {veth} type veth peer name eth0 netns {ns}",
                      f"link set {veth} master {bridge}", f"link set {veth} up"]
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
