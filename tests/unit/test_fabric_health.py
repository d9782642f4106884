"""NVSwitch SXids from the kernel log and InfiniBand / RoCE ports from sysfs (issue 24): parsed from real log lines
(tests/testdata/kernel-log/README.md says where each came from) and from a sysfs tree in the kernel's documented
formats, judged by nvswitch.sxid, interconnect.ib.ports and interconnect.ib.rate on the real 2x H200's facts."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from ansible_collections.fleetctl.gpu.plugins.module_utils import fleetctl_infiniband as ib
from ansible_collections.fleetctl.gpu.plugins.module_utils import fleetctl_kernel_log as klog
from orchestrator import controls

DATA = Path(__file__).resolve().parents[1] / "testdata"
SXID_LOG = (DATA / "kernel-log" / "sxid-forms.dmesg").read_text()


def real_facts() -> dict:
    """The real 2x H200's facts (driver 580.159.04; its NVLinks go to NVSwitches) with this issue's keys added."""
    facts = json.loads((DATA / "h200x2-580.159.04-audit" / "audit-nvml.json").read_text())["hosts"][0]["facts"]
    return dict(copy.deepcopy(facts), sxid={"events": []}, infiniband=None)


def finding(facts: dict, control: str, policy: dict | None = None) -> dict:
    return next(f for f in controls.evaluate(facts, policy or {}) if f["control"] == control)


# ---- SXids -------------------------------------------------------------------------------------------------------

def test_sxid_lines_of_real_logs_become_one_event_per_error():
    events = klog.sxid_events(klog.parse_bracketed(SXID_LOG))
    ltssm = [e for e in events if e["code"] == 20034]
    # five headlines or orphan Severity lines (gpud's README excerpt); Data / Severity lines fold into their headline
    assert [(e["device"], e["link"], e["fatal"], e["fatal_from"]) for e in ltssm] == [
        ("nvswitch1", 48, True, "log"), ("nvswitch0", 63, True, "log"), ("nvswitch2", None, True, "log"),
        ("nvswitch2", 37, True, "log"), ("nvswitch0", 62, True, "log")]
    assert ltssm[0]["pci"] == "0000:06:00.0" and ltssm[0]["severity"] == "critical"
    assert ltssm[0]["mnemonic"] == "NVSWITCH_ERR_HW_DLPL_LTSSM_FAULT_UP" and ltssm[0]["message"] == "LTSSM Fault Up"
    minion = [e for e in events if e["code"] == 22013]  # nvtrust#124: one orphan Data line, then links 44 and 45
    assert [(e["link"], e["fatal"], e["fatal_from"]) for e in minion] == [(None, False, "table"), (44, False, "log"),
                                                                         (45, False, "log")]
    heartbeat = next(e for e in events if e["code"] == 19084)
    assert heartbeat["message"] == "AN1 Heartbeat Timeout Error" and heartbeat["link"] == 29  # "(First)" dropped
    priv = next(e for e in events if e["code"] == 12028)  # a Data line alone: the table's class
    assert (priv["fatal"], priv["class"], priv["severity"]) == (False, "non_fatal", "medium")
    timeout = next(e for e in events if e["code"] == 10002)  # "Severity 5": neither 0 nor 1, the guide gives no class
    assert (timeout["fatal"], timeout["class"], timeout["severity"]) == (None, "notable", "high")
    assert len(events) == 11
    # the Xid among them is still read once (79 and its "fallen off the bus" line)
    assert [e["code"] for e in klog.xid_events(klog.parse_bracketed(SXID_LOG), {})] == [79]


def test_every_sxid_table_entry_names_its_source_and_a_real_class():
    for code, (mnemonic, meaning, klass, source) in klog.SXID_TABLE.items():
        assert 10000 <= code < 40000 and mnemonic and meaning, code
        assert klass in ("non_fatal", "fatal", "always_fatal", "notable"), code
        assert "Fabric Manager User Guide" in source, code


def test_sxid_events_after_a_sequence_number_and_odd_lines():
    lines = ["6,10,100,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 63 LTSSM Fault Up",
             "6,11,200,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 02 sourcetrack timeout error",
             "6,12,300,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): " + "9" * 5000 + ", Fatal, Link 1 x",
             "6,13,400,-;nvidia-nvswitch0: SXid (PCI:zzzz): 20034, Fatal",
             "6,14,500,-;nvidia-nvswitch9: SXid (PCI:0000:09:00.0): 31999, something new",
             "6,15,600,-;nvidia-nvswitch9: SXid (PCI:0000:09:00.0): 31999, Data {0x0}",
             "garbage ; \x00 nvidia-nvswitch SXid"]
    events = klog.sxid_events(klog.parse_kmsg("\n".join(lines)), since_seq=10)
    assert [(e["code"], e["seq"], e["fatal"]) for e in events] == [(24007, 11, True), (31999, 14, None)]
    assert events[1]["name"] == "unknown SXid 31999" and events[1]["message"] == "something new"
    assert events[1]["source"] == "not in fleetctl's SXid table"


def nvswitch_facts(log: str = SXID_LOG) -> dict:
    facts = real_facts()
    facts["fabric_manager"] = dict(facts["fabric_manager"], nvswitch_present=True)
    facts["sxid"] = {"events": klog.sxid_events(klog.parse_bracketed(log))}
    return facts


def test_a_fatal_sxid_fails_the_nvswitch_host_naming_code_meaning_and_links():
    f = finding(nvswitch_facts(), "nvswitch.sxid")
    assert f["status"] == "fail" and f["severity"] == "critical"
    assert f["message"].startswith("5 fatal NVSwitch SXid error(s): 20034 (LTSSM fault up: the link went down from "
                                   "active) on nvswitch0 links 62, 63, nvswitch1 link 48, nvswitch2 link 37")
    assert f["message"].endswith("; 6 non-fatal besides")
    assert f["evidence"]["count"] == 11


def test_non_fatal_sxids_warn_and_a_clean_log_passes():
    non_fatal = "\n".join(line for line in SXID_LOG.splitlines() if "22013" in line)
    f = finding(nvswitch_facts(non_fatal), "nvswitch.sxid")
    assert f["status"] == "warn"
    assert f["message"] == "3 non-fatal NVSwitch SXid error(s): 22013 (MINION link DLREQ interrupt) on nvswitch3 links 44, 45"
    assert finding(nvswitch_facts(""), "nvswitch.sxid")["status"] == "pass"


def test_sxid_control_without_nvswitches_and_with_an_unread_log():
    facts = real_facts()  # the real 2x H200: NVLinks to NVSwitches, no SXid in its log
    assert finding(facts, "nvswitch.sxid")["message"] == "no NVSwitch SXid errors in the kernel log since boot"
    h100 = json.loads((DATA / "h100-580.159.04-audit" / "audit-nvml.json").read_text())["hosts"][0]["facts"]
    f = finding(dict(h100, sxid={"events": []}), "nvswitch.sxid")  # the real single H100 VM: no NVSwitch
    assert (f["status"], f["message"]) == ("not_applicable", "not an NVSwitch host: no NVSwitch device and no SXid "
                                                             "in the kernel log")
    unread = nvswitch_facts("")
    unread["errors"] = dict(unread["errors"], sxid="kernel log unreadable: /dev/kmsg: Permission denied")
    f = finding(unread, "nvswitch.sxid")
    assert f["status"] == "error" and "Permission denied" in f["message"]
    del facts["sxid"]  # facts of an older collector
    assert finding(facts, "nvswitch.sxid")["status"] == "not_applicable"


# ---- InfiniBand / RoCE ports -----------------------------------------------------------------------------------

def write_port(root: Path, device: str, state: str = "4: ACTIVE", phys: str = "5: LinkUp",
               rate: str = "400 Gb/sec (4X NDR)", layer: str = "InfiniBand", **counters: int) -> Path:
    """One port as drivers/infiniband/core/sysfs.c writes it (Documentation/ABI/stable/sysfs-class-infiniband)."""
    port = root / device / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    for name, text in (("state", state), ("phys_state", phys), ("rate", rate), ("link_layer", layer)):
        (port / name).write_text(text + "\n")
    for name in ib.COUNTERS:
        (port / "counters" / name).write_text(f"{counters.get(name, 0)}\n")
    return port


def hgx_ports(root: Path, **odd: dict) -> dict:
    for i in range(8):
        write_port(root, f"mlx5_{i}", **odd.get(f"mlx5_{i}", {}))
    errors: dict = {}
    facts = real_facts()
    facts["infiniband"] = ib.read_infiniband(errors, str(root))
    facts["errors"] = dict(facts["errors"], **errors)
    return facts


IB_POLICY = {"interconnect": {"ib": {"ports": 8, "rate": 400}}}


def test_ib_ports_read_in_the_kernels_formats(tmp_path):
    facts = hgx_ports(tmp_path, mlx5_3={"state": "1: DOWN", "phys": "3: Disabled", "link_downed": 1})
    ports = facts["infiniband"]["ports"]
    assert len(ports) == 8 and ports[0] == {
        "device": "mlx5_0", "port": 1, "state": "ACTIVE", "state_code": 4, "phys_state": "LinkUp",
        "phys_state_code": 5, "rate": "400 Gb/sec (4X NDR)", "rate_gbps": 400.0, "width": 4, "speed": "NDR",
        "link_layer": "InfiniBand",
        "counters": {"link_downed": 0, "symbol_error": 0, "link_error_recovery": 0, "port_rcv_errors": 0}}
    assert (ports[3]["state"], ports[3]["phys_state_code"], ports[3]["counters"]["link_downed"]) == ("DOWN", 3, 1)
    assert ib.parse_rate("2.5 Gb/sec (1X SDR)") == (2.5, 1, "SDR")


def test_a_port_down_fails_both_controls_naming_it(tmp_path):
    facts = hgx_ports(tmp_path, mlx5_3={"state": "1: DOWN", "phys": "3: Disabled", "link_downed": 1})
    ports = finding(facts, "ib.ports", IB_POLICY)
    assert ports["status"] == "fail"
    assert ports["message"] == ("7 of 8 InfiniBand/RoCE ports ACTIVE, the baseline expects 8; not active: "
                                "mlx5_3 port 1 DOWN (Disabled)")
    rate = finding(facts, "ib.rate", IB_POLICY)
    assert rate["status"] == "fail"
    assert rate["message"] == "down: mlx5_3 port 1 DOWN (Disabled); error counters: mlx5_3 port 1: link_downed 1"


def test_a_port_trained_down_fails_the_rate_and_counters_warn(tmp_path):
    slow = hgx_ports(tmp_path / "a", mlx5_5={"rate": "200 Gb/sec (4X HDR)"})
    assert finding(slow, "ib.ports", IB_POLICY)["status"] == "pass"
    f = finding(slow, "ib.rate", IB_POLICY)
    assert (f["status"], f["message"]) == ("fail", "below 400 Gb/s: mlx5_5 port 1 200 Gb/sec (4X HDR)")
    noisy = hgx_ports(tmp_path / "b", mlx5_1={"symbol_error": 12})
    f = finding(noisy, "ib.rate", IB_POLICY)
    assert f["status"] == "warn" and f["message"].endswith("mlx5_1 port 1: symbol_error 12")
    clean = hgx_ports(tmp_path / "c")
    assert [finding(clean, c, IB_POLICY)["status"] for c in ("ib.ports", "ib.rate")] == \
        ["pass", "pass"]
    assert [finding(clean, c)["status"] for c in ("ib.ports", "ib.rate")] == \
        ["not_applicable", "not_applicable"]  # the baseline asks nothing


def test_the_real_h100_vm_has_an_empty_infiniband_class(tmp_path):
    """tests/testdata/h100-580.159.04-health/sysfs.json: /sys/class/infiniband exists and holds nothing."""
    assert json.loads((DATA / "h100-580.159.04-health" / "sysfs.json").read_text())["infiniband"] == []
    (tmp_path / "infiniband").mkdir()
    errors: dict = {}
    assert ib.read_infiniband(errors, str(tmp_path / "infiniband")) is None
    assert ib.read_infiniband(errors, str(tmp_path / "absent")) is None and errors == {}
    facts = real_facts()
    assert finding(facts, "ib.rate")["status"] == "not_applicable"
    f = finding(facts, "ib.ports", IB_POLICY)
    assert f["status"] == "fail" and "no InfiniBand / RoCE device in /sys/class/infiniband" in f["message"]


def test_unreadable_and_odd_port_files_give_errors_not_tracebacks(tmp_path):
    port = write_port(tmp_path, "mlx5_0", rate="fast")
    (port / "state").unlink()
    (port / "state").mkdir()  # reading it fails (EISDIR), as an unreadable file would
    (port / "counters" / "symbol_error").write_text("lots\n")
    (port / "link_layer").unlink()
    (tmp_path / "mlx5_1").mkdir()  # a device without ports/
    errors: dict = {}
    facts = ib.read_infiniband(errors, str(tmp_path))
    first, second = facts["ports"]
    assert (first["state"], first["rate"], first["rate_gbps"], first["link_layer"]) == (None, "fast", None, None)
    assert first["counters"]["symbol_error"] is None and first["phys_state"] == "LinkUp"
    assert "state:" in errors["infiniband.ports[0]"] and "rate: unexpected 'fast'" in errors["infiniband.ports[0]"]
    assert second["port"] is None and "infiniband.ports[1]" in errors
    whole = real_facts()
    whole["infiniband"], whole["errors"] = facts, dict(whole["errors"], **errors)
    f = finding(whole, "ib.ports", IB_POLICY)
    assert f["status"] == "error" and "infiniband.ports[0]" in f["message"]
