"""The interconnect controls (gpu.nvlink, gpu.fabric, gpu.topology, gpudirect.peermem) on facts shaped per
docs/interconnect.md, built on real captures:

- an 8-GPU HGX H100 board: the real H100's facts (tests/testdata/h100-580.159.04-audit) for each of 8 GPUs at the
  PCI slots of an HGX H100 board, 18 NVLink 4.0 links each to the NVSwitches, NV18 between every pair;
- the real 2x H200 as fleetctl's collector read it (tests/testdata/h200x2-580.159.04-audit), through NVML and
  through nvidia-smi.

The reference from history goes through a real SQLite history written with the store's API.
"""

from __future__ import annotations

import copy
import itertools
import json

import pytest

from orchestrator import audit, controls, schemas
from orchestrator.fleet import runner
from orchestrator.baseline import Baseline
from orchestrator.fleet.inventory import Fleet, Host
from orchestrator.history.store import Store
from tests.helpers.cli import fleetctl, runs

INTERCONNECT = ("gpu.nvlink", "gpu.fabric", "gpu.topology", "gpudirect.peermem")
HGX_SLOTS = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]  # a DGX/HGX H100 board's GPU buses
ERRORS_ZERO = {"replay": 0, "recovery": 0, "crc": 0, "crc_flit": 0, "crc_data": 0, "ecc_data": 0,
               "recovery_failed": None, "symbol": None, "effective": None}


def nvlink(up: int = 18, total: int = 18, remote: str = "switch") -> dict:
    return {"supported": True, "up": up, "total": total,
            "links": [{"link": i, "state": "up" if i < up else "down", "version": "4.0",
                       "remote": {"type": remote, "pci_bus_id": None} if i < up else {"type": None, "pci_bus_id": None},
                       "errors": dict(ERRORS_ZERO)} for i in range(total)]}


NO_NVLINK = {"supported": False, "up": 0, "total": 0, "links": []}
FABRIC_OK = {"state": "completed", "status": "success", "clique_id": 0,
             "cluster_uuid": "00000000-0000-0000-0000-000000000000", "health_mask": 0}


def pairs(n: int, link: str = "NV18") -> list[dict]:
    return [{"gpus": [a, b], "link": link, "nvlinks": controls.nvlinks(link)} for a, b in itertools.combinations(range(n), 2)]


@pytest.fixture(scope="module")
def h100_facts(testdata):
    report = json.loads((testdata / "h100-580.159.04-audit" / "audit-nvml.json").read_text())
    return report["hosts"][0]["facts"]


@pytest.fixture
def hgx(h100_facts):
    """8x H100 SXM on NVSwitches, fabric manager at the driver's version, every link up and clean."""
    f = copy.deepcopy(h100_facts)
    template = f["gpus"][0]
    f["gpus"] = [dict(copy.deepcopy(template), index=i, pci_bus_id=f"00000000:{bus}:00.0",
                      uuid=template["uuid"][:-2] + f"{i:02x}") for i, bus in enumerate(HGX_SLOTS)]
    f["host"]["pci_gpus"] = [g["pci_bus_id"] for g in f["gpus"]]
    f["fabric_manager"].update(nvswitch_present=True, package_version="580.159.04-1", running=True, enabled=True)
    f["interconnect"] = {"gpus": [{"index": g["index"], "pci_bus_id": g["pci_bus_id"], "nvlink": nvlink(),
                                   "fabric": dict(FABRIC_OK)} for g in f["gpus"]],
                         "topology": pairs(8), "peermem_loaded": True}
    f["sources"]["interconnect"] = "nvml"
    assert schemas.first_error("host-facts", f) is None
    return f


@pytest.fixture(params=["audit-nvml.json", "audit-smi.json"])
def h200x2(request, testdata):
    """A real healthy 2x H200 as fleetctl's collector read it, through NVML and through the nvidia-smi fallback
    (tests/testdata/h200x2-580.159.04-audit). The VM hides the NVSwitches from the guest: no fabric manager inside
    it, but the GPUs report their fabric registration and links to switches."""
    report = json.loads((testdata / "h200x2-580.159.04-audit" / request.param).read_text())
    return copy.deepcopy(report["hosts"][0]["facts"])


def findings(facts, pol=None, reference=None):
    return {x["control"]: x for x in controls.evaluate(facts, pol or {}, reference) if x["control"] in INTERCONNECT}


def statuses(facts, pol=None, reference=None):
    return {c: x["status"] for c, x in findings(facts, pol, reference).items()}


# ---- healthy hosts ---------------------------------------------------------------------------------

def test_a_healthy_hgx_h100_passes_and_peermem_is_only_checked_when_asked(hgx):
    assert statuses(hgx) == {"gpu.nvlink": "pass", "gpu.fabric": "pass", "gpu.topology": "pass",
                             "gpudirect.peermem": "not_applicable"}
    got = findings(hgx, {"interconnect": {"nvlink": {"links_up": 18}, "topology": "NV18", "peermem": True}})
    assert {c: x["status"] for c, x in got.items()} == dict.fromkeys(INTERCONNECT, "pass")
    assert got["gpu.topology"]["message"] == "all 28 GPU pairs NV18"
    assert "18 of 18 links up on 8 GPUs" in got["gpu.nvlink"]["message"]


def test_the_real_h200_pair_passes_although_its_raw_data_counters_count(h200x2):
    """Through NVML the legacy DL_CRC_DATA / DL_ECC_DATA counters read over a hundred per GPU on these healthy links
    after traffic (nvidia-smi nvlink -e says 0): shown in the evidence, never judged - a default that judged them
    would warn on every busy H200, whatever its limit, as they keep counting."""
    got = findings(h200x2, {"interconnect": {"nvlink": {"errors_warn": 0}, "topology": "NV18"}})
    assert {c: x["status"] for c, x in got.items()} == {"gpu.nvlink": "pass", "gpu.fabric": "pass",
                                                        "gpu.topology": "pass", "gpudirect.peermem": "not_applicable"}
    assert got["gpu.nvlink"]["message"] == "NVLink: 18 of 18 links up on 2 GPUs (expected: all links), 0 link errors"
    assert all(g["errors"] == 0 for g in got["gpu.nvlink"]["evidence"]["gpus"])
    if h200x2["sources"]["interconnect"] == "nvml":
        counted = {g["index"]: g["error_counters"] for g in got["gpu.nvlink"]["evidence"]["gpus"]}
        assert set(counted) == {0, 1} and all(set(c) == {"crc_data", "ecc_data"} and min(c.values()) > 100
                                              for c in counted.values()), counted
    # no fabric manager in the VM, yet the GPUs' fabric registration makes it an NVSwitch host
    assert h200x2["fabric_manager"]["nvswitch_present"] is False
    assert got["gpu.fabric"]["message"] == "fabric registration completed (success) on all 2 GPUs, clique 0"
    assert got["gpu.topology"]["message"] == "the GPU pair is NV18"
    # and the captured host has no nvidia_peermem: a baseline asking for GPUDirect RDMA catches it
    assert statuses(h200x2, {"interconnect": {"peermem": True}})["gpudirect.peermem"] == "fail"


def test_drift_planted_on_the_real_h200_is_found_by_its_control_alone(h200x2):
    before = copy.deepcopy(h200x2)
    gpu1 = h200x2["interconnect"]["gpus"][1]
    gpu1["nvlink"]["links"][7].update(state="down", remote={"type": None, "pci_bus_id": None})
    gpu1["nvlink"]["up"] = 17
    got = findings(h200x2, reference={"gpu.nvlink": before, "gpu.topology": before})
    assert {c: x["status"] for c, x in got.items()} == {"gpu.nvlink": "fail", "gpu.fabric": "pass",
                                                        "gpu.topology": "pass", "gpudirect.peermem": "not_applicable"}
    assert got["gpu.nvlink"]["message"] == "GPU 1 (0000:00:07.0): 17 of 18 NVLink links up; down: 7"
    h200x2["interconnect"]["topology"][0].update(link="PHB", nvlinks=0)  # as the collector says with no NVLink left
    for g in h200x2["interconnect"]["gpus"]:
        g["fabric"].update(state="in_progress", status=None, clique_id=None, cluster_uuid=None)
    got = findings(h200x2, reference={"gpu.nvlink": before, "gpu.topology": before})
    assert got["gpu.topology"]["message"] == (f"1 GPU pair lost NVLinks since the last passing audit "
                                              f"({before['collected_at']}): GPU 0-1 NV18 -> PHB")
    assert got["gpu.fabric"]["message"].startswith("all 2 GPUs: fabric registration in progress: CUDA programs fail "
                                                   "with error 802")


def test_every_interconnect_finding_matches_the_finding_schema(hgx, h200x2):
    broken = copy.deepcopy(hgx)
    broken["interconnect"]["gpus"][3]["nvlink"] = nvlink(up=17)
    broken["interconnect"]["gpus"][1]["fabric"].update(state="in_progress", status=None)
    for facts in (hgx, h200x2, broken):
        for finding in findings(facts, {"interconnect": {"topology": "NV18", "peermem": True}}).values():
            assert schemas.first_error("finding", finding) is None, finding


# ---- gpu.nvlink --------------------------------------------------------------------------------------

def test_a_link_down_fails_naming_the_gpu_its_slot_and_the_link(hgx):
    gpu3 = hgx["interconnect"]["gpus"][3]
    link7 = gpu3["nvlink"]["links"][7]
    link7.update(state="down", remote={"type": None, "pci_bus_id": None})
    gpu3["nvlink"]["up"] = 17
    got = findings(hgx)["gpu.nvlink"]
    assert got["status"] == "fail" and got["severity"] == "high"
    assert got["message"] == "GPU 3 (0000:5d:00.0): 17 of 18 NVLink links up; down: 7"
    assert got["remediation"] and "links_up" in got["remediation"]
    assert statuses(hgx) == {"gpu.nvlink": "fail", "gpu.fabric": "pass", "gpu.topology": "pass",
                             "gpudirect.peermem": "not_applicable"}


def test_the_baseline_sets_the_links_a_board_wires(hgx):
    for g in hgx["interconnect"]["gpus"]:
        g["nvlink"] = nvlink(up=12)  # a board that wires 12 of the 18 links each GPU reports
    assert statuses(hgx)["gpu.nvlink"] == "fail"  # without a value: every link reported
    assert statuses(hgx, {"interconnect": {"nvlink": {"links_up": 12}}})["gpu.nvlink"] == "pass"
    hgx["interconnect"]["gpus"][6]["nvlink"] = nvlink(up=11)
    got = findings(hgx, {"interconnect": {"nvlink": {"links_up": 12}}})["gpu.nvlink"]
    assert got["status"] == "fail"
    assert got["message"] == ("GPU 6 (0000:ba:00.0): 11 of 18 NVLink links up (12 expected by the baseline); "
                              "down: 11, 12, 13, 14, 15, 16, 17")


def test_error_counters_warn_by_default_and_fail_only_over_the_baseline_limit(hgx):
    links = hgx["interconnect"]["gpus"][2]["nvlink"]["links"]
    links[4]["errors"].update(replay=90, crc=8)
    assert statuses(hgx)["gpu.nvlink"] == "pass"  # 98: a few replays are what healthy links do
    links[5]["errors"].update(recovery=3)
    got = findings(hgx)["gpu.nvlink"]
    assert got["status"] == "warn"
    assert got["message"] == ("GPU 2 (0000:3a:00.0): 101 NVLink errors since the driver loaded "
                              "(replay 90, crc 8, recovery 3; most on link 4: 98), over 100")
    links[4]["errors"].update(crc=50000)
    assert statuses(hgx)["gpu.nvlink"] == "warn"  # counters alone never fail without a site limit
    got = findings(hgx, {"interconnect": {"nvlink": {"errors_fail": 10000}}})["gpu.nvlink"]
    assert got["status"] == "fail" and "over the limit of 10000" in got["message"]
    assert statuses(hgx, {"interconnect": {"nvlink": {"errors_warn": 1000000}}})["gpu.nvlink"] == "pass"


def test_counters_that_healthy_links_count_are_not_judged(hgx):
    for link in hgx["interconnect"]["gpus"][0]["nvlink"]["links"]:
        link["errors"].update(crc_data=5000, ecc_data=5000, crc_flit=7, symbol=10 ** 6)
    got = findings(hgx)["gpu.nvlink"]
    assert got["status"] == "pass"
    assert got["evidence"]["gpus"][0]["error_counters"] == {"crc_data": 90000, "ecc_data": 90000, "crc_flit": 126,
                                                            "symbol": 18 * 10 ** 6}


def test_gpus_without_nvlink_are_not_applicable(hgx):
    l40s = copy.deepcopy(hgx)
    for g in l40s["interconnect"]["gpus"][:4]:
        g["nvlink"], g["fabric"] = dict(NO_NVLINK), {**FABRIC_OK, "state": "not_supported", "status": None}
    l40s["interconnect"]["gpus"] = l40s["interconnect"]["gpus"][:4]
    l40s["interconnect"]["topology"] = pairs(4, "SYS")
    l40s["fabric_manager"].update(nvswitch_present=False, package_version=None, running=False)
    got = findings(l40s)
    assert got["gpu.nvlink"]["status"] == "not_applicable"
    assert got["gpu.nvlink"]["message"] == "no NVLink on this host's GPUs"
    assert got["gpu.fabric"]["message"] == "not an NVSwitch host: no GPU on an NVSwitch fabric"
    single = copy.deepcopy(l40s)
    single["interconnect"].update(gpus=single["interconnect"]["gpus"][:1], topology=[])
    got = findings(single)
    assert got["gpu.nvlink"]["message"] == "no NVLink on this GPU"
    assert (got["gpu.topology"]["status"], got["gpu.topology"]["message"]) == ("not_applicable", "fewer than 2 GPUs")


def test_an_unread_nvlink_state_is_an_error_not_a_guess(hgx):
    hgx["interconnect"]["gpus"][2]["nvlink"] = None
    hgx["errors"] = {"interconnect.gpus[2].nvlink": "NVML: Unknown Error"}
    got = findings(hgx)
    assert got["gpu.nvlink"]["status"] == "error"
    assert "interconnect.gpus[2].nvlink: NVML: Unknown Error" in got["gpu.nvlink"]["message"]
    # the other interconnect controls do not need it
    assert (got["gpu.fabric"]["status"], got["gpu.topology"]["status"]) == ("pass", "pass")
    # every other control ignores an interconnect read error
    others = {x["control"] for x in controls.evaluate(hgx, {}) if x["status"] == "error"}
    assert others == {"gpu.nvlink"}


def test_no_interconnect_facts_at_all(hgx):
    hgx["interconnect"] = None
    assert set(statuses(hgx, {"interconnect": {"peermem": True}}).values()) == {"not_applicable"}
    hgx["errors"] = {"interconnect": "nvidia-smi exited 9: NVIDIA-SMI has failed"}
    got = statuses(hgx, {"interconnect": {"peermem": True}})
    assert got == {"gpu.nvlink": "error", "gpu.fabric": "error", "gpu.topology": "error", "gpudirect.peermem": "error"}


# ---- gpu.fabric --------------------------------------------------------------------------------------

def test_a_fabric_stuck_in_progress_is_critical_and_says_what_cuda_does(hgx):
    for g in hgx["interconnect"]["gpus"]:
        g["fabric"].update(state="in_progress", status=None)
    hgx["fabric_manager"].update(package_version="580.95.05-1")
    got = findings(hgx)["gpu.fabric"]
    assert got["status"] == "fail" and got["severity"] == "critical"
    assert got["message"] == ("all 8 GPUs: fabric registration in progress: CUDA programs fail with error 802 until "
                              "the fabric manager completes it; check nv-fabricmanager (version must equal the "
                              "driver's); fabric manager 580.95.05-1 != driver 580.159.04")
    assert audit.blocking(got, "critical")


def test_one_gpu_not_started_and_one_failed_are_each_named(hgx):
    hgx["interconnect"]["gpus"][5]["fabric"].update(state="not_started", status=None)
    hgx["interconnect"]["gpus"][6]["fabric"].update(status="NVML_ERROR_INSUFFICIENT_RESOURCES")
    hgx["fabric_manager"]["running"] = False
    got = findings(hgx)["gpu.fabric"]
    assert got["status"] == "fail"
    assert got["message"].startswith("GPU 5 (0000:ab:00.0): fabric registration not started: CUDA programs fail with "
                                      "error 802")
    assert ("GPU 6 (0000:ba:00.0): fabric registration completed with status NVML_ERROR_INSUFFICIENT_RESOURCES"
            in got["message"])
    assert got["message"].endswith("nv-fabricmanager 580.159.04-1 is not running")


def test_a_fabric_nvml_cannot_read_is_an_error_with_its_reason(hgx):
    for i, g in enumerate(hgx["interconnect"]["gpus"]):
        g["fabric"] = None
    hgx["errors"] = {f"interconnect.gpus[{i}].fabric": "nvmlDeviceGetGpuFabricInfoV: NVML: Unknown Error"
                     for i in range(8)}
    got = findings(hgx)["gpu.fabric"]
    assert got["status"] == "error"
    assert got["message"].startswith("fabric state unread on an NVSwitch host: GPU 0 (0000:18:00.0): "
                                      "interconnect.gpus[0].fabric: nvmlDeviceGetGpuFabricInfoV: NVML: Unknown Error")
    # a status this fleetctl cannot name is not taken for success
    named = copy.deepcopy(hgx)
    named["interconnect"]["gpus"] = [dict(g, fabric=dict(FABRIC_OK)) for g in hgx["interconnect"]["gpus"]]
    named["interconnect"]["gpus"][4]["fabric"]["status"] = None
    named["errors"] = {"interconnect.gpus[4].fabric": "fabric status: unknown NVML return code 999"}
    got = findings(named)["gpu.fabric"]
    assert (got["status"], got["message"]) == ("error", "fabric state unread on an NVSwitch host: GPU 4 (0000:9a:00.0): "
                                                        "interconnect.gpus[4].fabric: fabric status: unknown NVML "
                                                        "return code 999")
    # the same driver on a PCIe host: nothing to check, so no error
    pcie = copy.deepcopy(hgx)
    for g in pcie["interconnect"]["gpus"]:
        g["nvlink"] = dict(NO_NVLINK)
    pcie["fabric_manager"].update(nvswitch_present=False)
    assert statuses(pcie)["gpu.fabric"] == "not_applicable"


def test_an_nvswitch_host_whose_gpus_have_no_fabric_state_is_left_to_fabricmanager_version(hgx):
    """HGX A100: NVSwitches and a fabric manager, but NVML reports no fabric registration before Hopper."""
    for g in hgx["interconnect"]["gpus"]:
        g["fabric"] = {"state": "not_supported", "status": None, "clique_id": None, "cluster_uuid": None,
                       "health_mask": None}
    got = findings(hgx)["gpu.fabric"]
    assert got["status"] == "not_applicable" and "fabricmanager.version" in got["message"]


def test_a_fabric_health_mask_condition_warns(hgx):
    hgx["interconnect"]["gpus"][1]["fabric"]["health_mask"] = (2 << 0) | (1 << 4)  # bandwidth ok, route unhealthy
    got = findings(hgx)["gpu.fabric"]
    assert (got["status"], got["message"]) == ("warn", "fabric registered, but its health mask reports: "
                                                        "GPU 1: route unhealthy")


# ---- gpu.topology ------------------------------------------------------------------------------------

def test_a_pair_that_fell_from_nv18_to_phb_fails_against_the_baseline(hgx):
    hgx["interconnect"]["topology"][0].update(link="PHB", nvlinks=0)
    got = findings(hgx, {"interconnect": {"topology": "NV18"}})["gpu.topology"]
    assert got["status"] == "fail" and got["severity"] == "high"
    assert got["message"] == "1 of 28 GPU pairs not NV18 (the baseline's): GPU 0-1 PHB"


def test_without_a_baseline_value_the_first_audit_becomes_the_reference(hgx):
    hgx["interconnect"]["topology"][0].update(link="PHB", nvlinks=0)
    got = findings(hgx)["gpu.topology"]
    assert got["status"] == "pass" and "this one becomes the reference" in got["message"]
    assert got["message"].startswith("28 GPU pairs: NV18 x 27, PHB x 1")


def test_without_a_baseline_value_a_pair_is_compared_with_the_last_passing_audit(hgx):
    before = copy.deepcopy(hgx)
    hgx["interconnect"]["topology"][0].update(link="PHB", nvlinks=0)
    hgx["interconnect"]["topology"][27].update(link="NV12", nvlinks=12)
    got = findings(hgx, reference={"gpu.topology": before})["gpu.topology"]
    assert got["status"] == "fail"
    assert got["message"] == (f"2 GPU pairs lost NVLinks since the last passing audit ({before['collected_at']}): "
                              "GPU 0-1 NV18 -> PHB, GPU 6-7 NV18 -> NV12")


def test_a_board_with_mixed_pairs_keeps_its_own_shape(hgx):
    """H100 NVL-style bridged pairs: NV12 inside a pair, SYS across. No single baseline value fits: history does."""
    for p in hgx["interconnect"]["topology"]:
        bridged = p["gpus"][0] // 2 == p["gpus"][1] // 2
        p.update(link="NV12" if bridged else "SYS", nvlinks=12 if bridged else 0)
    before = copy.deepcopy(hgx)
    assert statuses(hgx, reference={"gpu.topology": before})["gpu.topology"] == "pass"
    hgx["interconnect"]["topology"][0].update(link="SYS", nvlinks=0)  # pair 0-1 lost its bridge
    assert statuses(hgx, reference={"gpu.topology": before})["gpu.topology"] == "fail"


# ---- gpudirect.peermem ---------------------------------------------------------------------------------

def test_peermem(hgx):
    want = {"interconnect": {"peermem": True}}
    assert statuses(hgx, want)["gpudirect.peermem"] == "pass"
    hgx["interconnect"]["peermem_loaded"] = False
    got = findings(hgx, want)["gpudirect.peermem"]
    assert (got["status"], got["severity"]) == ("fail", "medium")
    assert got["message"].startswith("nvidia_peermem is not loaded") and "modprobe nvidia_peermem" in got["remediation"]
    assert statuses(hgx, {"interconnect": {"peermem": False}})["gpudirect.peermem"] == "not_applicable"
    assert statuses(hgx)["gpudirect.peermem"] == "not_applicable"


# ---- the reference from history ------------------------------------------------------------------------

def record_audit(store: Store, hosts: dict[str, dict], pol: dict) -> None:
    """One audit run as fleetctl records it: begin, every host's facts and findings, finish."""
    run_id, _ = store.begin_run("audit", ["fleetctl", "audit"], "hosts.ini", None, None)
    entries = [{"name": name, "groups": [], "reachable": True, "error": None, "facts": facts,
                "findings": controls.evaluate(facts, pol)} for name, facts in hosts.items()]
    store.finish_run(run_id, 0, {}, entries)


def test_the_reference_is_the_latest_audit_where_the_control_passed(tmp_path, hgx):
    """A board whose GPUs report 18 links but wire 16: the site's baseline said 16 when the host was accepted; with
    that value gone, the host is held to what it had then, not to all 18 - and a link lost later is caught."""
    wired = copy.deepcopy(hgx)
    for g in wired["interconnect"]["gpus"]:
        g["nvlink"] = nvlink(up=16)
    with Store(tmp_path / "history.sqlite3") as store:
        record_audit(store, {"hgx-01": wired, "hgx-02": hgx}, {"interconnect": {"nvlink": {"links_up": 16}}})
        failing = copy.deepcopy(wired)
        failing["interconnect"]["gpus"][0]["nvlink"] = nvlink(up=15)
        failing["collected_at"] = "2026-11-24T00:00:00Z"
        record_audit(store, {"hgx-01": failing}, {"interconnect": {"nvlink": {"links_up": 16}}})  # failed: no reference
        refs = store.passing_facts(["hgx-01", "hgx-02", "hgx-03"], controls.reference_controls())
    assert set(refs) == {"hgx-01", "hgx-02"} and set(refs["hgx-01"]) == {"gpu.nvlink", "gpu.topology"}
    assert refs["hgx-01"]["gpu.nvlink"] == wired  # the passing audit, not the later failing one
    assert refs["hgx-01"]["gpu.topology"] == failing  # its topology still passed in the later one

    assert statuses(wired)["gpu.nvlink"] == "fail"  # no value, no history: all 18 links
    assert statuses(wired, reference=refs["hgx-01"])["gpu.nvlink"] == "pass"
    got = findings(failing, reference=refs["hgx-01"])["gpu.nvlink"]
    assert got["status"] == "fail"
    assert got["message"] == "GPU 0 (0000:18:00.0): 15 of 18 NVLink links up (16 up at the last passing audit); down: 15, 16, 17"
    assert got["evidence"]["reference_collected_at"] == wired["collected_at"]


def test_gpus_are_matched_to_their_reference_by_uuid(hgx):
    """GPUs enumerate in another order after a change: each is held to what the same GPU (uuid) had."""
    before = copy.deepcopy(hgx)
    before["interconnect"]["gpus"][2]["nvlink"] = nvlink(up=16, total=18)  # this GPU had 16 (accepted then)
    now = copy.deepcopy(before)
    now["gpus"][2]["uuid"], now["gpus"][3]["uuid"] = before["gpus"][3]["uuid"], before["gpus"][2]["uuid"]
    # now GPU 3 is the one that had 16; GPU 2 had 18 and has 16
    got = findings(now, reference={"gpu.nvlink": before})["gpu.nvlink"]
    assert got["status"] == "fail"
    assert got["message"] == "GPU 2 (0000:3a:00.0): 16 of 18 NVLink links up; down: 16, 17"  # by PCI slot: 16, a pass
    now["interconnect"]["gpus"][2]["nvlink"], now["interconnect"]["gpus"][3]["nvlink"] = nvlink(), nvlink(up=16)
    assert statuses(now, reference={"gpu.nvlink": before})["gpu.nvlink"] == "pass"


def test_collect_hands_every_host_its_reference_with_one_query(tmp_path, hgx, monkeypatch):
    """audit.collect (audit, plan, upgrade, campaign precheck/verify): one history query for the whole fleet."""
    before = copy.deepcopy(hgx)
    fallen = copy.deepcopy(hgx)
    fallen["interconnect"]["topology"][0].update(link="PHB", nvlinks=0)
    names = [f"hgx-{i:02d}" for i in range(1, 6)]
    fleet = Fleet("hosts.ini", tuple(Host(n, ("all",)) for n in names), frozenset({"all"}), {})
    base = Baseline(tmp_path / "b.yml", "b", "sha256:0", {"all": {}})
    monkeypatch.setattr(runner.Runner, "run_on_fleet", lambda *a, **k: {
        n: runner.HostOutcome(n, results={"fleetctl.gpu.gpu_facts": {"facts": fallen if n == "hgx-01" else hgx}}) for n in names})
    with Store(tmp_path / "history.sqlite3") as store:
        record_audit(store, {n: before for n in names}, {})
        queries = []
        store.db.set_trace_callback(queries.append)
        entries = audit.collect(runner.Runner(), fleet, base, history=store)
        store.db.set_trace_callback(None)
    assert len([q for q in queries if q.lstrip().upper().startswith(("SELECT", "WITH"))]) == 1
    got = {e["name"]: {f["control"]: f for f in e["findings"]} for e in entries}
    assert got["hgx-01"]["gpu.topology"]["status"] == "fail"
    assert "GPU 0-1 NV18 -> PHB" in got["hgx-01"]["gpu.topology"]["message"]
    assert {got[n]["gpu.topology"]["status"] for n in names[1:]} == {"pass"}
    assert "none below the last passing audit" in got["hgx-02"]["gpu.topology"]["message"]


# ---- the baseline ------------------------------------------------------------------------------------------

def test_a_wrongly_typed_interconnect_key_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("schema_version: 1\ngroups:\n  all:\n    interconnect:\n      nvlink: {links_up: \"eighteen\"}\n")
    proc = fleetctl("audit", "-b", str(bad), home=tmp_path / "home", timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"fleetctl: error: {bad}: $.groups.all.interconnect.nvlink.links_up: 'eighteen' is not of type 'integer'\n"
    assert runs(tmp_path / "home") == []  # nothing recorded


def test_a_gpu_off_the_bus_is_gpu_counts_finding_not_an_unread_interconnect(h200x2):
    """The lost GPU is left out of the interconnect controls (gpu.count fails on it); the others are judged."""
    ic = h200x2["interconnect"]
    ic["gpus"][1] = {"index": 1, "pci_bus_id": None, "lost": True, "nvlink": None, "fabric": None}
    ic["topology"] = []
    got = statuses(h200x2, {})
    assert (got["gpu.nvlink"], got["gpu.fabric"], got["gpu.topology"]) == ("pass", "pass", "not_applicable")


def test_a_pcie_board_without_nvlink_bridges_is_not_failed_but_a_board_that_lost_its_links_is(hgx):
    """An A100/H100 PCIe card lists its NVLinks, every one inactive, when no bridge is fitted (NVML), or prints
    "all links are inActive" (nvidia-smi: no link listed). Without a baseline or a passing audit expecting links,
    that is a board without NVLink, not a failure; a GPU whose links were up at the last passing audit fails."""
    pcie = copy.deepcopy(hgx)
    pcie["interconnect"]["gpus"] = pcie["interconnect"]["gpus"][:2]
    pcie["interconnect"]["topology"] = pairs(2, "PHB")
    pcie["fabric_manager"].update(nvswitch_present=False, package_version=None, running=False)
    for g in pcie["interconnect"]["gpus"]:
        g["nvlink"] = nvlink(up=0, total=12)
        g["fabric"] = {**FABRIC_OK, "state": "not_supported", "status": None}
    got = findings(pcie)["gpu.nvlink"]
    assert got["status"] == "not_applicable" and "without NVLink bridges" in got["message"], got
    assert findings(pcie, {"interconnect": {"nvlink": {"links_up": 12}}})["gpu.nvlink"]["status"] == "fail"
    reference = copy.deepcopy(pcie)
    for g in reference["interconnect"]["gpus"]:
        g["nvlink"] = nvlink(up=12, total=12)
    assert findings(pcie, reference={"gpu.nvlink": reference})["gpu.nvlink"]["status"] == "fail"
    smi = copy.deepcopy(pcie)  # nvidia-smi lists no link at all
    smi["interconnect"]["gpus"][1]["nvlink"] = dict(NO_NVLINK)
    got = findings(smi, reference={"gpu.nvlink": reference})["gpu.nvlink"]
    assert got["status"] == "fail" and "GPU 1 (0000:2a:00.0): no NVLink link answers; 12 were up" in got["message"]
