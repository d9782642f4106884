"""The controls of rack-scale NVLink domains (issue 34): imex.service, imex.version, imex.domain, gpu.fabric_clique
(a GPU's clique against the host's last passing audit), and, across the inventory, nvlink.domain_uniform and
nvlink.domain_declared, grouped by NVLink domain (domains.group).

The trays are the real H100's facts (tests/testdata/h100-580.159.04-audit) made into a GB200 NVL compute tray: 4 GPUs
that report one cluster UUID and clique, and IMEX as the host-facts schema describes it. The real H100 itself, on no
multi-node domain, is the HGX / PCIe host: nothing of this applies to it.
"""

from __future__ import annotations

import copy

import pytest

from orchestrator import audit, controls, plan, resources, schemas
from orchestrator.fleet import runner
from orchestrator.baseline import Baseline
from orchestrator.campaign import packages
from orchestrator.fleet.inventory import Fleet, Host
from orchestrator.history.store import Store
from tests.helpers.facts import RACK, TRAYS, imex_node, tray_facts

NEW = ("imex.service", "imex.version", "imex.domain", "gpu.fabric_clique", "nvlink.domain_uniform",
       "nvlink.domain_declared")


@pytest.fixture
def tray(device_facts):
    f = tray_facts(device_facts)
    assert schemas.first_error("host-facts", f) is None
    return f


def findings(facts, reference=None, peers=None):
    return {x["control"]: x for x in controls.evaluate(facts, {}, {"gpu.fabric_clique": reference}, peers)
            if x["control"] in NEW}


def judged(facts, reference=None):
    return {c: (x["status"], x["message"]) for c, x in findings(facts, reference).items()}


# ---- one host ---------------------------------------------------------------------------------------------------

def test_a_healthy_tray_passes_and_the_cross_host_controls_are_left_to_the_audit(tray):
    """What `fleetctl check` sees on the tray (no peers): the host-local controls judge, the others do not apply."""
    got = judged(tray)
    assert got["imex.service"] == ("pass", "nvidia-imex 570.86.15-1 running")
    assert got["imex.version"] == ("pass", "IMEX 570.86.15 matches the driver")
    assert got["imex.domain"] == ("pass", "IMEX domain UP: all 3 nodes READY and connected")
    assert got["gpu.fabric_clique"][0] == "pass" and f"4 GPUs in clique {RACK}/32766" in got["gpu.fabric_clique"][1]
    for c in ("nvlink.domain_uniform", "nvlink.domain_declared"):
        assert got[c] == ("not_applicable", "judged across the inventory by fleetctl audit, not on one host")


def test_an_hgx_or_pcie_host_gets_only_not_applicable_rows(device_facts):
    """The real H100 (no multi-node domain): facts from before issue 34 (no imex key) and from after (imex null)
    give the same findings on every other control."""
    before = controls.evaluate(device_facts, {})
    after_facts = dict(copy.deepcopy(device_facts), imex=None)
    assert schemas.first_error("host-facts", after_facts) is None
    after = controls.evaluate(after_facts, {})
    assert {f["control"]: f["status"] for f in after if f["control"] in NEW} == dict.fromkeys(NEW, "not_applicable")
    assert [f for f in before if f["control"] not in NEW] == [f for f in after if f["control"] not in NEW]
    assert plan.health_problems(after) == plan.health_problems(before) == []


@pytest.mark.parametrize("change, message", [
    ({"package": None, "package_version": None, "version": None, "running": False},
     "IMEX is not installed (no nvidia-imex package or binary) on a host of a multi-node NVLink domain: multi-node "
     "jobs cannot share GPU memory across its trays"),
    ({"running": False}, "nvidia-imex 570.86.15-1 is installed but not running"),
    ({"running": False, "enabled": False}, "nvidia-imex 570.86.15-1 is installed but not running nor enabled at boot"),
])
def test_imex_service_fails_saying_what_is_missing_and_leaves_the_tray_out_of_a_plan(tray, change, message):
    tray["imex"].update(change)
    got = findings(tray)["imex.service"]
    assert (got["status"], got["message"], got["severity"]) == ("fail", message, "critical")
    assert [f["control"] for f in plan.health_problems(controls.evaluate(tray, {}))] == ["imex.service"]


def test_imex_service_warns_when_it_would_not_start_after_a_reboot(tray):
    tray["imex"]["enabled"] = False
    assert judged(tray)["imex.service"] == (
        "warn",
        "nvidia-imex 570.86.15-1 runs, but nvidia-imex.service is not enabled: it will not start after a reboot")


def test_imex_version_is_the_binarys_else_the_packages(tray):
    tray["imex"].update(version="580.65.06")
    assert judged(tray)["imex.version"] == (
        "fail", "IMEX 580.65.06 does not match driver 570.86.15: nvidia-imex will not start against it")
    tray["imex"].update(version=None, package_version="580.65.06-1")  # the binary's answer unread: the package's
    tray["errors"]["imex.version"] = "nvidia-imex --version: exit 1"
    assert judged(tray)["imex.version"][0] == "fail" and "IMEX 580.65.06 does not" in judged(tray)["imex.version"][1]
    tray["imex"].update(version="570.86.15", package_version="580.65.06-1")  # a package moved, the binary not
    assert judged(tray)["imex.version"] == (
        "fail", "the nvidia-imex binary is 570.86.15 but its package nvidia-imex-570 is 580.65.06-1")


def test_imex_controls_are_errors_when_their_facts_were_not_read(tray):
    tray["imex"].update(package_version=None, domain=None)
    tray["errors"].update({"imex.package_version": "dpkg-query: timed out",
                           "imex.domain": "nvidia-imex-ctl -N -j -H: exit 255"})
    got = judged(tray)
    assert got["imex.version"] == ("error", "could not read the facts this control needs: imex.package_version: "
                                            "dpkg-query: timed out")
    assert got["imex.domain"] == ("error", "could not read the facts this control needs: imex.domain: "
                                           "nvidia-imex-ctl -N -j -H: exit 255")
    assert got["imex.service"][0] == "pass"
    tray["errors"] = {"imex": "IMEX facts: unexpected error"}  # the whole section
    assert {c: s for c, (s, _) in judged(tray).items() if c.startswith("imex.")} == \
        {"imex.service": "error", "imex.version": "error", "imex.domain": "error"}


def test_imex_domain_names_the_peers_not_ready_the_worst_first(tray):
    nodes = tray["imex"]["domain"]["nodes"]
    nodes[1].update(connection="INVALID")
    nodes[2].update(status="UNAVAILABLE", connection="INVALID", version=None)
    tray["imex"]["domain"]["status"] = "DEGRADED"
    got = findings(tray)["imex.domain"]
    assert (got["status"], got["message"]) == (
        "fail", "IMEX domain DEGRADED: 10.213.0.4 (gb200-03) UNAVAILABLE, 10.213.0.3 (gb200-02) connection INVALID")
    assert got["evidence"]["not_ready"] == ["10.213.0.4 (gb200-03) UNAVAILABLE",
                                            "10.213.0.3 (gb200-02) connection INVALID"]


def test_imex_domain_a_full_rack_down_shows_three_peers_and_a_count(tray):
    addresses = [f"10.213.0.{i}" for i in range(2, 20)]  # 18 trays
    tray["imex"]["nodes"] = addresses
    tray["imex"]["domain"] = {"status": "DOWN", "nodes": [imex_node(a, None, "UNAVAILABLE", "INVALID", None)
                                                         for a in addresses]}
    assert judged(tray)["imex.domain"] == (
        "fail", "IMEX domain DOWN: 10.213.0.2 UNAVAILABLE, 10.213.0.3 UNAVAILABLE, 10.213.0.4 UNAVAILABLE +15 more")


def test_imex_domain_a_node_list_naming_a_peer_the_domain_lacks_or_one_twice(tray):
    tray["imex"]["nodes"] = ["10.213.0.2", "10.213.0.3", "10.213.0.4", "10.213.0.9", "10.213.0.3"]
    assert judged(tray)["imex.domain"] == (
        "fail", "IMEX domain UP: 10.213.0.9 missing from the domain status; the node list "
                "(/etc/nvidia-imex/nodes_config.cfg) names 10.213.0.3 twice")


def test_imex_domain_compares_addresses_not_spellings(tray):
    """Issue 42: an IPv6 address is one address however it is written, a host name one name whatever its case."""
    tray["imex"]["nodes"] = ["fd00::2", "fd00::3", "GB200-03.rack"]
    tray["imex"]["domain"]["nodes"] = [imex_node("FD00:0:0::2", "gb200-01"), imex_node("fd00:0000::0003", "gb200-02"),
                                       imex_node("gb200-03.RACK", "gb200-03")]
    assert judged(tray)["imex.domain"] == ("pass", "IMEX domain UP: all 3 nodes READY and connected")
    tray["imex"]["nodes"].append("FD00:0::3")
    assert judged(tray)["imex.domain"] == (
        "fail", "the node list (/etc/nvidia-imex/nodes_config.cfg) names fd00::3 twice")


def test_imex_domain_past_its_cap_is_one_error_line_not_a_hang(tray):
    """Issue 42: a node list (or a domain status) longer than an IMEX domain can be is judged in linear time up to
    the cap (MAX_NODES) and refused past it, in one line."""
    cap = resources.module_utils("fleetctl_imex").MAX_NODES
    addresses = [f"fd00::{i:x}" for i in range(1, cap + 1)]
    tray["imex"]["nodes"] = addresses
    tray["imex"]["domain"]["nodes"] = [imex_node(a, None) for a in addresses]
    assert judged(tray)["imex.domain"] == ("pass", f"IMEX domain UP: all {cap} nodes READY and connected")
    tray["imex"]["nodes"] = addresses + ["10.0.0.1"]
    assert judged(tray)["imex.domain"] == (
        "error", f"the IMEX node list (/etc/nvidia-imex/nodes_config.cfg) names {cap + 1} nodes, more than an IMEX "
                 f"domain holds ({cap}): not judged")
    tray["imex"]["nodes"] = addresses[:3]
    tray["imex"]["domain"]["nodes"] = [imex_node(a, None) for a in addresses * 50]
    assert judged(tray)["imex.domain"] == (
        "error", f"the IMEX domain status names {50 * cap} nodes, more than an IMEX domain holds ({cap}): "
                 "not judged")


def test_gpu_fabric_clique_names_the_gpu_and_both_cliques(tray, device_facts):
    reference = dict(tray_facts(device_facts, clique=7), collected_at="2026-04-08T10:00:00Z")
    got = findings(tray, reference)["gpu.fabric_clique"]
    assert got["status"] == "fail" and got["severity"] == "high"
    assert got["message"] == ("4 GPUs not in the fabric clique of the last passing audit (2026-04-08T10:00:00Z): "
                              + "; ".join(f"GPU {i} (0008:0{i}:00.0): clique {RACK}/32766, was {RACK}/7"
                                          for i in range(4)))
    same = dict(copy.deepcopy(tray), collected_at="2026-04-08T10:00:00Z")
    assert judged(tray, same)["gpu.fabric_clique"] == ("pass", f"4 GPUs in clique {RACK}/32766, as at the last "
                                                               f"passing audit")


def test_a_tray_back_outside_its_clique_fails_though_it_reports_no_domain_now(tray):
    """The tray came back from its reboot without a cluster UUID: its IMEX facts are null now, the reference's are
    not, so the control still judges it."""
    reference = dict(copy.deepcopy(tray), collected_at="2026-04-08T10:00:00Z")
    for g in tray["interconnect"]["gpus"]:
        g["fabric"].update(cluster_uuid=None, clique_id=0)
    tray["gpus"][1]["lost"] = True  # a GPU off the bus is gpu.count's, not named here
    tray["interconnect"]["gpus"][1] = {"index": 1, "pci_bus_id": None, "lost": True, "nvlink": None, "fabric": None}
    tray["imex"] = None
    got = findings(tray, reference)["gpu.fabric_clique"]
    assert got["status"] == "fail"
    assert got["message"] == ("3 GPUs not in the fabric clique of the last passing audit (2026-04-08T10:00:00Z): "
                              + "; ".join(f"GPU {i} (0008:0{i}:00.0): clique none, was {RACK}/32766"
                                          for i in (0, 2, 3)))


# ---- the domain across the inventory ------------------------------------------------------------------------------

def audit_of(tmp_path, monkeypatch, facts_by_host, hostvars=None):
    """audit.collect over FACTS_BY_HOST (host -> facts; None: unreachable), each host with HOSTVARS[host]."""
    hostvars = hostvars or {}
    fleet = Fleet("hosts.ini", tuple(Host(n, ("all", "gpu"), {"ansible_host": TRAYS.get(n, n), **hostvars.get(n, {})})
                                     for n in facts_by_host), frozenset({"all", "gpu"}), {})
    base = Baseline(tmp_path / "b.yml", "b", "sha256:0", {"all": {}})
    monkeypatch.setattr(runner.Runner, "run_on_fleet", lambda *a, **k: {
        n: runner.HostOutcome(n, results={"fleetctl.gpu.gpu_facts": {"facts": f}}) if f is not None
        else runner.HostOutcome(n, "unreachable", "ssh: connect timed out") for n, f in facts_by_host.items()})
    with Store(tmp_path / "history.sqlite3") as store:
        entries = audit.collect(runner.Runner(), fleet, base, history=store)
    return {e["name"]: {f["control"]: f for f in e["findings"]} for e in entries}


def test_a_tray_on_another_driver_fails_the_whole_domain_naming_it_and_an_hgx_host_is_untouched(
        tmp_path, monkeypatch, device_facts):
    rack = {n: tray_facts(device_facts) for n in TRAYS}
    rack["gb200-03"] = tray_facts(device_facts, "580.65.06")
    hgx = dict(copy.deepcopy(device_facts), imex=None)
    got = audit_of(tmp_path, monkeypatch, {**rack, "h100-01": hgx, "h100-02": copy.deepcopy(hgx)})
    for n in TRAYS:
        f = got[n]["nvlink.domain_uniform"]
        assert (f["status"], f["message"]) == ("fail", "gb200-03 runs 580.65.06; the domain's other 2 hosts run "
                                                       "570.86.15"), n
        assert f["evidence"]["domain"] == f"{RACK}/32766"
    assert got["h100-01"]["nvlink.domain_uniform"]["status"] == "not_applicable"
    # a mixed domain stays one a campaign can repair: no health control fails on the odd tray for it
    assert plan.health_problems(list(got["gb200-01"].values())) == []


def test_a_uniform_domain_passes_and_a_split_one_without_majority_names_both_sides(tmp_path, monkeypatch, device_facts):
    rack = {n: tray_facts(device_facts) for n in TRAYS}
    got = audit_of(tmp_path, monkeypatch, rack)
    assert got["gb200-02"]["nvlink.domain_uniform"]["message"] == f"all 3 hosts of NVLink domain {RACK}/32766 run " \
                                                                  f"570.86.15"
    two = {"gb200-01": tray_facts(device_facts), "gb200-02": tray_facts(device_facts, "580.65.06")}
    got = audit_of(tmp_path, monkeypatch, two)
    assert got["gb200-01"]["nvlink.domain_uniform"]["message"] == (
        f"the 2 hosts of NVLink domain {RACK}/32766 run 2 driver versions: gb200-01 runs 570.86.15; gb200-02 runs "
        f"580.65.06")


def test_domains_are_compared_within_themselves_not_by_inventory_group(tmp_path, monkeypatch, device_facts):
    """Two racks in one inventory group, each on one version of its own: no finding (firmware would be compared
    across the group; the driver is compared across the NVLink domain)."""
    other = RACK[:-1] + "2"
    racks = {**{n: tray_facts(device_facts) for n in ("a-1", "a-2")},
             **{n: tray_facts(device_facts, "580.65.06", cluster=other) for n in ("b-1", "b-2")}}
    got = audit_of(tmp_path, monkeypatch, racks)
    assert {n: got[n]["nvlink.domain_uniform"]["message"] for n in racks} == {
        "a-1": f"all 2 hosts of NVLink domain {RACK}/32766 run 570.86.15",
        "a-2": f"all 2 hosts of NVLink domain {RACK}/32766 run 570.86.15",
        "b-1": f"all 2 hosts of NVLink domain {other}/32766 run 580.65.06",
        "b-2": f"all 2 hosts of NVLink domain {other}/32766 run 580.65.06"}


def test_an_unreachable_tray_is_left_out_of_the_comparison(tmp_path, monkeypatch, device_facts):
    rack = {"gb200-01": tray_facts(device_facts), "gb200-02": tray_facts(device_facts), "gb200-03": None}
    got = audit_of(tmp_path, monkeypatch, rack)
    f = got["gb200-01"]["nvlink.domain_uniform"]
    assert f["status"] == "pass" and f["evidence"]["versions"] == {"gb200-01": "570.86.15", "gb200-02": "570.86.15"}


def test_the_declared_domain_agrees_with_the_gpus(tmp_path, monkeypatch, device_facts):
    rack = {n: tray_facts(device_facts) for n in TRAYS}
    got = audit_of(tmp_path, monkeypatch, rack)
    assert got["gb200-01"]["nvlink.domain_declared"]["status"] == "not_applicable"  # no host declares one
    declared = {n: {"fleetctl_nvlink_domain": "rack-a"} for n in TRAYS}
    got = audit_of(tmp_path, monkeypatch, rack, declared)
    assert got["gb200-03"]["nvlink.domain_declared"]["message"] == \
        f"fleetctl_nvlink_domain rack-a on all 3 hosts whose GPUs report {RACK}/32766"


def test_a_declaration_that_contradicts_the_gpus_fails_naming_the_host(tmp_path, monkeypatch, device_facts):
    rack = {n: tray_facts(device_facts) for n in TRAYS}
    declared = {n: {"fleetctl_nvlink_domain": "rack-a"} for n in TRAYS}
    declared["gb200-02"] = {"fleetctl_nvlink_domain": "rack-b"}
    got = audit_of(tmp_path, monkeypatch, rack, declared)
    assert {n: got[n]["nvlink.domain_declared"]["message"] for n in TRAYS} == dict.fromkeys(TRAYS, (
        f"gb200-02: rack-b, GPUs reporting {RACK}/32766; the domain's other 2 hosts: rack-a, GPUs reporting "
        f"{RACK}/32766"))
    assert got["gb200-01"]["nvlink.domain_declared"]["severity"] == "medium"
    # an HGX host declared into the rack: its GPUs report no multi-node domain
    hgx = dict(copy.deepcopy(device_facts), imex=None)
    got = audit_of(tmp_path, monkeypatch, {**rack, "h100-01": hgx},
                   {**{n: {"fleetctl_nvlink_domain": "rack-a"} for n in TRAYS},
                    "h100-01": {"fleetctl_nvlink_domain": "rack-a"}})
    assert got["h100-01"]["nvlink.domain_declared"]["message"] == (
        f"h100-01: rack-a, GPUs reporting no multi-node NVLink domain; the domain's other 3 hosts: rack-a, GPUs "
        f"reporting {RACK}/32766")
    alone = audit_of(tmp_path, monkeypatch, {"h100-01": hgx}, {"h100-01": {"fleetctl_nvlink_domain": "rack-a"}})
    assert alone["h100-01"]["nvlink.domain_declared"]["message"] == \
        "h100-01 declares fleetctl_nvlink_domain rack-a, but the GPUs report no multi-node NVLink domain"


# ---- IMEX moves with the driver ---------------------------------------------------------------------------------

def test_imex_moves_with_the_driver_to_the_target_and_back(tray):
    before = packages.driver_versioned(tray["driver"]["packages"], "570.86.15")
    assert before == {"nvidia-driver-570-open": "570.86.15-1", "nvidia-imex-570": "570.86.15-1"}  # the rollback set
    assert packages.target_set(before, "570.86.15", "580.65.06") == {"nvidia-driver-580-open": "580.65.06",
                                                                     "nvidia-imex-580": "580.65.06"}
    after = plan.on_target(tray, "570.86.15", "580.65.06")
    assert {k: after["imex"][k] for k in ("package", "package_version", "version")} == \
        {"package": "nvidia-imex-580", "package_version": "580.65.06-1", "version": "580.65.06"}
    assert tray["imex"]["version"] == "570.86.15"  # the host's own facts are left as they are
    assert judged(after)["imex.version"][0] == "pass"


def test_an_imex_the_campaign_cannot_move_is_a_target_problem(tray):
    """IMEX not from a package (or of another version than the driver): the install step would leave it behind and
    it would refuse to start on the target."""
    tray["driver"]["packages"] = tray["driver"]["packages"][:1]
    tray["imex"].update(package=None, package_version=None)
    entry = {"groups": ["gpu"], "facts": tray}
    base = Baseline("b.yml", "b", "sha256:0", {"all": {}})
    assert [(f["control"], f["message"]) for f in plan.target_problems(entry, base, "570.86.15", "580.65.06")] == [
        ("imex.version", "IMEX 570.86.15 does not match driver 580.65.06: nvidia-imex will not start against it")]
