"""NVLink domains as the unit of change: how hosts are joined into domains (orchestrator/fleet/domains.py) and how the
plan lays whole domains into waves, leaves a domain out whole and counts its failure budget in domains."""

from __future__ import annotations

import json

import pytest

from orchestrator.fleet import domains
from orchestrator import plan
from orchestrator.fleet.inventory import Fleet, Host
from tests.helpers.cli import fleetctl, runs
from tests.helpers.facts import DEFAULT, entry, on

RACK_A, RACK_B = "8c6a8c1e-58f4-4d0c-9c57-6a3f0d2a1b01", "8c6a8c1e-58f4-4d0c-9c57-6a3f0d2a1b02"


def tray(uuid: str | None, clique: int = 32766, gpus: int = 4, nodes: list[str] | None = None) -> dict:
    """Facts of one tray: its GPUs' NVML fabric information (the zero UUID of an HGX board reads as None)."""
    fabric = {"state": "completed", "status": "success", "cluster_uuid": uuid, "clique_id": clique if uuid else 0,
              "health_mask": 0}
    return {"interconnect": {"gpus": [{"pci_bus_id": f"00000008:0{i}:00.0", "fabric": dict(fabric)}
                                      for i in range(gpus)]},
            "imex": {"nodes": nodes} if nodes is not None else None}


def fleet_of(*hosts: Host) -> Fleet:
    return Fleet("test", hosts, frozenset({"all"}), {})


def test_trays_reporting_one_cluster_and_clique_are_one_domain_and_an_hgx_host_is_its_own():
    fleet = fleet_of(*(Host(f"gb-{i}", ("all",)) for i in range(1, 5)), Host("h100-1", ("all",)))
    facts = {"gb-1": tray(RACK_A), "gb-2": tray(RACK_A), "gb-3": tray(RACK_B), "gb-4": tray(RACK_A, clique=7),
             "h100-1": tray(None, gpus=8)}
    got = domains.group(fleet, facts)
    assert got["gb-1"] == got["gb-2"] == domains.Domain(f"{RACK_A}/32766", ("gb-1", "gb-2"), True)
    assert got["gb-3"].members == ("gb-3",) and got["gb-3"].multi      # a domain of one tray is still a domain
    assert got["gb-4"].name == f"{RACK_A}/7"                            # another clique of the cluster: another domain
    assert got["h100-1"] == domains.Domain("h100-1", ("h100-1",), False)
    assert domains.reported(facts["h100-1"]) is None and domains.reported(None) is None


def test_an_unreachable_tray_belongs_to_its_rack_by_the_node_list_or_the_declared_name():
    addresses = {"gb-1": "10.0.0.1", "gb-2": "10.0.0.2", "gb-3": "10.0.0.3", "gb-4": "10.0.0.4"}
    fleet = fleet_of(*(Host(n, ("all",), {"ansible_host": a}) for n, a in addresses.items()),
                     Host("gb-5", ("all",), {"fleetctl_nvlink_domain": "rack-z"}),
                     Host("gb-6", ("all",), {"fleetctl_nvlink_domain": "rack-z"}))
    nodes = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    facts = {"gb-1": tray(RACK_A, nodes=nodes), "gb-2": tray(RACK_A, nodes=nodes), "gb-3": None, "gb-4": None}
    got = domains.group(fleet, facts)
    assert got["gb-3"].members == ("gb-1", "gb-2", "gb-3")  # no facts: its peers' node list names its address
    assert got["gb-4"] == domains.Domain("gb-4", ("gb-4",), False)
    assert got["gb-5"] == got["gb-6"] == domains.Domain("rack-z", ("gb-5", "gb-6"), True)


def test_a_node_list_names_an_address_however_it_is_written():
    """Issue 42: fd00::3 in the inventory and FD00:0:0::3 in a node list are one address."""
    fleet = fleet_of(Host("gb-1", ("all",), {"ansible_host": "fd00::1"}),
                     Host("gb-3", ("all",), {"ansible_host": "fd00::3"}),
                     Host("gb-4", ("all",), {"ansible_host": "GB-4"}))
    facts = {"gb-1": tray(RACK_A, nodes=["FD00:0:0::1", "fd00:0000::3", "gb-4"]), "gb-3": None, "gb-4": None}
    assert domains.group(fleet, facts)["gb-3"].members == ("gb-1", "gb-3", "gb-4")


@pytest.fixture
def racks(device_facts):
    """Two racks of three trays and two HGX hosts, all on 550.163.01, as plan entries and their domains."""
    names = [f"gb-{i}" for i in range(1, 7)] + ["h100-1", "h100-2"]
    entries = [entry(n, ["gpu"], on(device_facts, "550.163.01")) for n in names]
    rack = {n: domains.Domain("rack-a" if i < 3 else "rack-b", tuple(names[:3] if i < 3 else names[3:6]), True)
            for i, n in enumerate(names[:6])}
    rack.update({n: domains.Domain(n, (n,), False) for n in names[6:]})
    return entries, rack


def test_the_ramp_counts_domains_and_a_domain_moves_in_one_wave_whole(racks):
    entries, rack = racks
    p = plan.build("570.86.15", plan.parse_ramp("1,100%"), entries, DEFAULT, rack)
    waves = [[h["name"] for h in w["hosts"]] for w in p["waves"]]
    assert waves[0] == ["gb-1", "gb-2", "gb-3"]                       # the canary: one whole domain
    assert sorted(waves[1]) == ["gb-4", "gb-5", "gb-6", "h100-1", "h100-2"]
    assert [h["domain"] for h in p["waves"][0]["hosts"]] == ["rack-a"] * 3
    assert p["waves"][0]["budget"]["rule"] == "canary: any failed domain fails the wave"
    # 3 units in wave 2 (rack-b and the two HGX hosts): max(2, 10% of 3) = 2 failed units
    assert p["waves"][1]["budget"]["fail_at"] == 2 and p["waves"][1]["budget"]["unit"] == "domain"


def test_a_domain_with_one_tray_that_cannot_take_part_is_left_out_whole_with_that_tray_named(racks):
    entries, rack = racks
    entries[4] = entry("gb-5", ["gpu"], status="unreachable", message="ssh: connect timed out")
    p = plan.build("570.86.15", plan.parse_ramp("1,100%"), entries, DEFAULT, rack,
                   [{"name": "h100-2", "code": "in_campaign", "reason": "in campaign 3 (host lock)"}])
    moved = [h["name"] for w in p["waves"] for h in w["hosts"]]
    assert moved == ["gb-1", "gb-2", "gb-3", "h100-1"]
    left = {h["name"]: (h["code"], h["reason"]) for h in p["excluded"]}
    assert left["gb-5"][0] == "unreachable" and left["h100-2"][0] == "in_campaign"
    assert left["gb-4"] == left["gb-6"] == ("domain_left_out", "NVLink domain rack-b is left out whole: gb-5: "
                                                               "unreachable: ssh: connect timed out")


def test_without_domains_the_plan_is_as_it_always_was(racks):
    entries, rack = racks
    hgx = {n: domains.Domain(n, (n,), False) for n in rack}
    assert plan.build("570.86.15", plan.parse_ramp("1,100%"), entries, DEFAULT, hgx) == \
        plan.build("570.86.15", plan.parse_ramp("1,100%"), entries, DEFAULT)
    p = plan.build("570.86.15", plan.parse_ramp("1,100%"), entries, DEFAULT)
    assert [w["size"] for w in p["waves"]] == [1, 7] and p["waves"][0]["budget"]["unit"] == "host"
    assert p["waves"][0]["budget"]["rule"] == "canary: any failed host fails the wave"


def test_a_domain_only_partly_in_the_inventory_or_the_limit_is_left_out_whole(racks):
    entries, rack = racks
    for e in entries[:3]:  # rack-a's node list names a fourth tray that --limit left out
        e["facts"] = dict(e["facts"], imex={
            "package": "nvidia-imex-550", "package_version": "550.163.01-1", "version": "550.163.01", "running": True,
            "enabled": True, "config_file": "/etc/nvidia-imex/config.cfg",
            "nodes_config_file": "/etc/nvidia-imex/nodes_config.cfg",
            "nodes": ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.9"], "channels": {"major": 234, "count": 1},
            "domain": None})
        e["facts"]["driver"] = dict(e["facts"]["driver"], packages=e["facts"]["driver"]["packages"] + [
            {"name": "nvidia-imex-550", "version": "550.163.01-1", "manager": "dpkg", "role": "imex", "held": True}])
    p = plan.build("570.86.15", plan.parse_ramp("1,100%"), entries, DEFAULT, rack)
    left = {h["name"]: h["reason"] for h in p["excluded"]}
    assert sorted(left) == ["gb-1", "gb-2", "gb-3"]
    assert left["gb-1"] == ("NVLink domain rack-a is left out whole: its IMEX node list names 4 hosts, 3 of them in "
                            "this inventory and --limit")


@pytest.mark.parametrize("value", [["rack-a"], {"a": 1}, "rack a", "x" * 129, True, "-rack"])
def test_a_declared_domain_that_is_not_a_name_is_one_line_and_an_input_error(value, tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"hosts": {"gb-1": {"ansible_connection": "local",
                                                                "fleetctl_nvlink_domain": value}}}}))
    proc = fleetctl("plan", "--to", "570.86.15", "-i", str(inventory), home=tmp_path / "home")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "gb-1: fleetctl_nvlink_domain" in proc.stderr, proc.stderr
    assert runs(tmp_path / "home") == []  # nothing recorded
