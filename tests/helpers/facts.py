"""Host facts as a real H100 reported them (tests/testdata/h100-580.159.04-audit), changed: on another driver, a GB200
compute tray; and the plan's entry for a host."""

from __future__ import annotations

import copy

from orchestrator import audit, baseline as baseline_mod
from orchestrator.fleet.inventory import Host
from orchestrator.fleet.runner import HostOutcome

DEFAULT = baseline_mod.load(None)


def on(facts, version):
    """The same host, running VERSION (module and userspace), with nouveau blacklisted: the captured H100 VM has no
    blacklist, which puts its next boot at risk (excluded from waves)."""
    f = copy.deepcopy(facts)
    f["driver"].update(module_version=version, userspace_version=version, branch=version.split(".")[0])
    f["nouveau"].update(blacklisted=True, blacklist_files=["/etc/modprobe.d/blacklist-nouveau.conf"])
    return f


def entry(name, groups, facts=None, base=DEFAULT, status="ok", message=""):
    """What the plan builds from one host: audit.evaluate_host on the gpu_facts result."""
    outcome = HostOutcome(name, status, message, {"fleetctl.gpu.gpu_facts": {"facts": facts}} if status == "ok" else {})
    return audit.evaluate_host(Host(name, ("all", *groups)), outcome, base)


RACK = "8c6a8c1e-58f4-4d0c-9c57-6a3f0d2a1b01"
TRAYS = {"gb200-01": "10.213.0.2", "gb200-02": "10.213.0.3", "gb200-03": "10.213.0.4"}


def imex_node(address: str, hostname: str | None, status: str = "READY", connection: str | None = "CONNECTED",
              version: str | None = "570.86.15") -> dict:
    return {"address": address, "hostname": hostname, "status": status, "version": version, "connection": connection}


def tray_facts(base: dict, version: str = "570.86.15", clique: int = 32766, cluster: str = RACK) -> dict:
    """A GB200 compute tray on VERSION: 4 GPUs in CLUSTER's clique CLIQUE, IMEX of the driver's version running, its
    domain UP with the three trays READY and connected."""
    f = on(base, version)
    branch = version.split(".")[0]
    template = f["gpus"][0]
    f["gpus"] = [dict(copy.deepcopy(template), index=i, pci_bus_id=f"00000008:0{i}:00.0", name="NVIDIA GB200",
                      uuid=template["uuid"][:-2] + f"{i:02x}") for i in range(4)]
    f["host"]["pci_gpus"] = [g["pci_bus_id"] for g in f["gpus"]]
    f["interconnect"] = {"gpus": [{"index": g["index"], "pci_bus_id": g["pci_bus_id"], "nvlink": None,
                                   "fabric": {"state": "completed", "status": "success", "clique_id": clique,
                                              "cluster_uuid": cluster, "health_mask": 0}} for g in f["gpus"]],
                         "topology": None, "peermem_loaded": False}
    f["driver"]["packages"] = [
        {"name": f"nvidia-driver-{branch}-open", "version": f"{version}-1", "manager": "dpkg", "role": "driver",
         "held": True},
        {"name": f"nvidia-imex-{branch}", "version": f"{version}-1", "manager": "dpkg", "role": "imex", "held": True}]
    f["imex"] = {"package": f"nvidia-imex-{branch}", "package_version": f"{version}-1", "version": version,
                 "running": True, "enabled": True, "config_file": "/etc/nvidia-imex/config.cfg",
                 "nodes_config_file": "/etc/nvidia-imex/nodes_config.cfg", "nodes": list(TRAYS.values()),
                 "channels": {"major": 234, "count": 1},
                 "domain": {"status": "UP", "nodes": [imex_node(a, n, version=version) for n, a in TRAYS.items()]}}
    return f
