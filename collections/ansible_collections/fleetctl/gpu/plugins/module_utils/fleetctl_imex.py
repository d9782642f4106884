# -*- coding: utf-8 -*-
# IMEX facts (docs/interconnect.md) for the hosts of a multi-node NVLink domain (GB200/GB300 NVL72 racks): the
# readers of what the gpu_facts Collector runs and reads there. Pure Python 3.6+, standard library only: it runs on
# the managed host, and in-process under `fleetctl check`.
#
# Formats, each from NVIDIA's IMEX guide unless said (tests/testdata/imex/README.md cites the pages):
#   /etc/nvidia-imex/config.cfg     KEY=VALUE lines, "#" comments; IMEX_NODE_CONFIG_FILE names the node list
#                                   (default /etc/nvidia-imex/nodes_config.cfg), BIND_INTERFACE_IP this node's address.
#   nodes_config.cfg                one member address per line, the same file on every member.
#   /proc/devices                   "234 nvidia-caps-imex-channels": the IMEX channels' character device major;
#                                   /dev/nvidia-caps-imex-channels/channelN its nodes (made by the admin or the
#                                   driver's NVreg_CreateImexChannel0).
#   nvidia-imex --version           "IMEX version is: 570.86.15".
#   nvidia-imex-ctl -N -j -H        {"nodes": {"0": {"status": "READY", "host": "10.0.0.1", "hostName": "n1",
#                                   "version": "570.86.15", "connections": {"0": {"host": "10.0.0.1", "status":
#                                   "CONNECTED"}, ...}}, ...}, "status": "UP"}: an entry per configured member (one
#                                   whose daemon is down UNAVAILABLE, its connections INVALID); domain UP, DEGRADED or
#                                   DOWN; exit 255 when it cannot read its node list.
# NVML's fabric information (nvmlGpuFabricInfo_t, facts.interconnect.gpus[*].fabric) says whether there is a
# domain at all: a cluster UUID other than zero (an HGX board's GPUs report the zero UUID, a PCIe GPU none).
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ipaddress
import json
import re

CONFIG_FILE = "/etc/nvidia-imex/config.cfg"
DEFAULT_NODES_CONFIG = "/etc/nvidia-imex/nodes_config.cfg"
CHANNELS_DIR = "/dev/nvidia-caps-imex-channels"
ZERO_UUID = "00000000-0000-0000-0000-000000000000"
# Members of one IMEX domain at most: it lies within one NVLink domain, at most 576 GPUs (NVL576: 144 trays). A node
# list is read to its MAX_NODES-th address, a domain status of more members not at all (one problem each), and
# fleetctl's imex.domain judges no more: nothing grows past it.
MAX_NODES = 1024

_VERSION = re.compile(r"IMEX version is:\s*(\d{1,9}\.\d{1,9}(?:\.\d{1,9})?)")
_ADDRESS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.:_-]{0,252}$")  # an IP address (or a host name) in a node list
_CHANNEL = re.compile(r"^channel\d{1,7}$")
_MAJOR = re.compile(r"^\s*(\d{1,4}) nvidia-caps-imex-channels\s*$", re.M)


class ImexOutputError(ValueError):
    """Output of an IMEX command that does not say what the documented format says."""


def gpu_cliques(interconnect):
    """PCI bus id -> "<cluster UUID>/<clique id>" of each live GPU in a multi-node NVLink domain (facts.interconnect:
    NVML's fabric information); none on a host without one: the zero UUID of an HGX board or no fabric at all."""
    out = {}
    for gpu in (interconnect or {}).get("gpus") or []:
        fabric = gpu.get("fabric") or {}
        if not gpu.get("lost") and fabric.get("cluster_uuid") and fabric["cluster_uuid"] != ZERO_UUID:
            out[str(gpu.get("pci_bus_id"))] = "%s/%s" % (fabric["cluster_uuid"], fabric.get("clique_id"))
    return out


def nvlink_domains(interconnect):
    """The multi-node NVLink domains the host's live GPUs report, as sorted "<cluster UUID>/<clique id>" strings."""
    return sorted(set(gpu_cliques(interconnect).values()))


def parse_config(text):
    """config.cfg -> {KEY: VALUE}: blank lines and "#" comments skipped, a value's enclosing quotes dropped."""
    config = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = (part.strip() for part in line.split("=", 1))
        if len(value) > 1 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        config[key] = value
    return config


def nodes_config_file(config):
    """The node list a configuration names: IMEX_NODE_CONFIG_FILE, its default where absent or empty."""
    return config.get("IMEX_NODE_CONFIG_FILE") or DEFAULT_NODES_CONFIG


def parse_nodes(text):
    """nodes_config.cfg -> ([address, ...] in file order, [problem, ...]); blank lines and "#" comments skipped.
    Past MAX_NODES addresses, the first MAX_NODES and that one problem."""
    nodes, problems = [], []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not _ADDRESS.match(line):
            problems.append("line %d is not an address: %r" % (number, line[:80]))
        elif len(nodes) == MAX_NODES:
            problems.append("more than %d addresses (an IMEX domain holds at most %d)" % (MAX_NODES, MAX_NODES))
            break
        else:
            nodes.append(line)
    return nodes, problems


def parse_version(text):
    """`nvidia-imex --version` -> "570.86.15"; None when it does not say "IMEX version is: X"."""
    m = _VERSION.search(text or "")
    return m.group(1) if m else None


def parse_channels(proc_devices, names):
    """{"major", "count"} from /proc/devices and the names in /dev/nvidia-caps-imex-channels."""
    m = _MAJOR.search(proc_devices or "")
    return {"major": int(m.group(1)) if m else None, "count": len([n for n in names if _CHANNEL.match(n)])}


def address_key(address):
    """What a node list's entry is compared by: an IP address as one (FD00:0:0::1 is fd00::1), a host name
    whatever its case and a final dot (DNS names are)."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address.lower().rstrip(".")


def _text(value, limit=64):
    return value[:limit] if isinstance(value, str) and value else None


def parse_domain(text, own_addresses):
    """`nvidia-imex-ctl -N -j -H` -> ({"status", "nodes": [{address, hostname, status, version, connection}]},
    problem or None): the members in the order of their keys; "connection" is this host's (the member at one of
    OWN_ADDRESSES) connection to each, null for all when no member is this host (the problem). Raises
    ImexOutputError for what is not that JSON."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ImexOutputError("nvidia-imex-ctl -N -j: not JSON (%s): %r" % (e, text.strip()[:80]))
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), dict) or not _text(data.get("status")):
        raise ImexOutputError("nvidia-imex-ctl -N -j: no domain status and nodes in %r" % text.strip()[:80])
    if len(data["nodes"]) > MAX_NODES:
        raise ImexOutputError("nvidia-imex-ctl -N -j: %d nodes, more than an IMEX domain holds (%d)"
                              % (len(data["nodes"]), MAX_NODES))
    entries = []
    for key in sorted(data["nodes"], key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else 0, k)):
        entry = data["nodes"][key]
        if not isinstance(entry, dict) or not _text(entry.get("host"), 253) or not _text(entry.get("status")):
            raise ImexOutputError("nvidia-imex-ctl -N -j: node %r has no host and status" % key[:20])
        entries.append(entry)
    mine = set(address_key(a) for a in own_addresses)
    own = [e for e in entries if address_key(e["host"]) in mine]
    connections = own[0].get("connections") if own else None
    to = {}  # address_key -> this host's connection to it (the first listed)
    for c in (connections.values() if isinstance(connections, dict) else ()):
        if isinstance(c, dict) and isinstance(c.get("host"), str):
            to.setdefault(address_key(c["host"]), c)
    nodes = []
    for entry in entries:
        connection = to.get(address_key(entry["host"]))
        nodes.append({"address": entry["host"][:253], "hostname": _text(entry.get("hostName"), 253),
                      "status": entry["status"][:64], "version": _text(entry.get("version")),
                      "connection": _text(connection.get("status")) if connection else None})
    problem = None if own else "nvidia-imex-ctl -N -j: no member is this host (%s)" % ", ".join(own_addresses)[:200]
    return {"status": data["status"][:64], "nodes": nodes}, problem


def local_addresses(fib_trie, if_inet6):
    """This host's own addresses: the LOCAL /32 entries of /proc/net/fib_trie and the addresses of
    /proc/net/if_inet6 (32 hex digits each), as text."""
    found, last = [], None
    for line in (fib_trie or "").splitlines():
        m = re.match(r"^\s*\|-- (\d{1,3}(?:\.\d{1,3}){3})$", line)
        if m:
            last = m.group(1)
        elif last and re.match(r"^\s*/32 host LOCAL", line) and last not in found:
            found.append(last)
    for line in (if_inet6 or "").splitlines():
        m = re.match(r"^([0-9a-f]{32})\s", line)
        if m:
            found.append(str(ipaddress.IPv6Address(int(m.group(1), 16))))
    return found
