"""gpu_facts parsing, checked against real captures from an H100 host (tests/testdata/h100-580.159.04)
and against real-world kernel log forms (tests/testdata/kernel-log). Expected values come from a second
real source where there is one (nvidia-smi CSV query, the pynvml dump), not from the code under test."""
import copy
import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator

from ansible_collections.fleetctl.gpu.plugins.module_utils import fleetctl_gpus as gpus_utils
from ansible_collections.fleetctl.gpu.plugins.module_utils import fleetctl_kernel_log as klog

REPO = Path(__file__).resolve().parents[2]
H100 = "h100-580.159.04"
SCHEMA_PATH = REPO / "schemas" / "host-facts.schema.json"


# ---- helpers --------------------------------------------------------------------------------------

def read(testdata, *parts):
    return (testdata.joinpath(*parts)).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def schema():
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def def_validator(schema, name):
    """A validator for one of the schema's $defs, resolving its internal references."""
    return Draft202012Validator({"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": "#/$defs/" + name})


@pytest.fixture(scope="module")
def catalog():
    return yaml.safe_load((REPO / "collections/ansible_collections/fleetctl/gpu/roles/gpu_facts/defaults/main.yml").read_text())["gpu_facts_xid_catalog"]


@pytest.fixture(scope="module")
def smi(testdata):
    return gpus_utils.parse_smi_xml(read(testdata, H100, "nvidia-smi-q-x.xml"))


@pytest.fixture(scope="module")
def csv_rows(testdata):
    """nvidia-smi --query-gpu ... --format=csv, as dicts keyed by the CSV header."""
    with open(testdata / H100 / "nvidia-smi-query.csv", newline="") as f:
        return list(csv.DictReader(f, skipinitialspace=True))


@pytest.fixture(scope="module")
def nvml_dump(testdata):
    return json.loads(read(testdata, H100, "pynvml-dump.json"))


def on_off(text):
    return {"Enabled": True, "Disabled": False}[text]


# ---- nvidia-smi -q -x on the real H100 capture ----------------------------------------------------

def test_smi_xml_system_matches_smi_version_and_nvml(smi, testdata, nvml_dump):
    system, gpus = smi
    version = dict(line.split(":", 1) for line in read(testdata, H100, "nvidia-smi-version.txt").splitlines() if ":" in line)
    version = {k.strip(): v.strip() for k, v in version.items()}
    assert system["driver_version"] == version["DRIVER version"] == nvml_dump["driver"] == "580.159.04"
    assert system["cuda_driver_version"] == version["CUDA Version"] == "13.0"
    major, minor = system["cuda_driver_version"].split(".")
    assert int(major) * 1000 + int(minor) * 10 == nvml_dump["cuda"]  # NVML reports CUDA as 1000*major + 10*minor
    assert system["nvml_version"] is None  # nvidia-smi -q -x does not give NVML's version
    assert len(gpus) == nvml_dump["count"] == 1


def test_smi_xml_gpu_equals_csv_query(smi, csv_rows):
    _, gpus = smi
    assert len(gpus) == len(csv_rows)
    for gpu, row in zip(gpus, csv_rows):
        assert gpu["index"] == int(row["index"])
        assert gpu["name"] == row["name"]
        assert gpu["uuid"] == row["uuid"]
        assert gpu["serial"] == row["serial"]
        assert gpu["pci_bus_id"] == row["pci.bus_id"].lower()
        assert gpu["pci_bus_id"] == gpu["pci_bus_id"].lower()
        assert gpu["vbios"] == row["vbios_version"]
        assert gpu["persistence_mode"] is on_off(row["persistence_mode"])
        assert gpu["ecc"]["enabled"] is on_off(row["ecc.mode.current"])
        assert gpu["mig"]["current"] is on_off(row["mig.mode.current"])
        assert gpu["pcie"]["gen"] == int(row["pcie.link.gen.current"])
        assert gpu["pcie"]["gen_max"] == int(row["pcie.link.gen.max"])
        assert gpu["pcie"]["width"] == int(row["pcie.link.width.current"])
        assert gpu["pcie"]["width_max"] == int(row["pcie.link.width.max"])
        assert gpu["clock_event_reasons"]["mask"] == int(row["clocks_event_reasons.active"], 16)


def test_smi_xml_gpu_equals_pynvml_dump(smi, nvml_dump):
    _, gpus = smi
    gpu, dump = gpus[0], nvml_dump["gpus"][0]
    assert gpu["name"] == dump["name"]
    assert gpu["uuid"] == dump["uuid"]
    assert gpu["serial"] == dump["serial"]
    assert gpu["pci_bus_id"] == dump["pci"].lower()
    assert gpu["vbios"] == dump["vbios"]
    assert gpu["persistence_mode"] is bool(dump["persistence"])
    assert [gpu["ecc"]["enabled"], gpu["ecc"]["pending"]] == [bool(v) for v in dump["ecc"]]
    assert gpu["ecc"]["uncorrected_volatile"] == dump["ecc_unc_vol"] == 0
    assert gpu["ecc"]["uncorrected_aggregate"] == dump["ecc_unc_agg"] == 0
    corr, unc, pending, failure = dump["remapped"]
    assert gpu["remapped_rows"] == {"correctable": corr, "uncorrectable": unc, "pending": bool(pending), "failure": bool(failure)}
    # H100 has row remapping, not page retirement: NVML says Not Supported, nvidia-smi says N/A -> null either way.
    assert dump["retired_sbe"]["code"] == gpus_utils.NVML_ERROR_NOT_SUPPORTED
    assert gpu["retired_pages"] is None
    assert [gpu["mig"]["current"], gpu["mig"]["pending"]] == [bool(v) for v in dump["mig"]]
    assert gpu["pcie"] == {"gen": dump["pcie_gen"], "gen_max": dump["pcie_gen_max"],
                           "width": dump["pcie_width"], "width_max": dump["pcie_width_max"],
                           "replay_count": 0}  # NVML's on the same GPU: tests/testdata/h100-580.159.04-health
    assert gpu["clock_event_reasons"] == {"mask": dump["clock_events"], "active": ["gpu_idle"]}
    assert dump["recovery_action"]["ret"] == 0
    assert gpu["recovery_action"] == gpus_utils.RECOVERY_ACTIONS[dump["recovery_action"]["value"]] == "None"


def test_smi_xml_temperature_and_power_plausible(smi, csv_rows, nvml_dump):
    """Sampled at different instants by the three tools: compare ranges, not values."""
    gpu, row, dump = smi[1][0], csv_rows[0], nvml_dump["gpus"][0]
    assert isinstance(gpu["temperature_c"], int)
    for other in (int(row["temperature.gpu"]), dump["temp"]):
        assert abs(gpu["temperature_c"] - other) <= 5
    assert 15 <= gpu["temperature_c"] <= 95
    limit_w = dump["power_limit_mw"] / 1000.0
    csv_w = float(row["power.draw [W]"].split()[0])
    assert isinstance(gpu["power_w"], float)
    for watts in (gpu["power_w"], csv_w, dump["power_mw"] / 1000.0):
        assert 30 < watts < limit_w  # an idle (gpu_idle) H100 draws well under its 700 W cap


def test_smi_xml_gpu_valid_against_schema(smi, schema):
    validator = def_validator(schema, "gpu")
    for gpu in smi[1]:
        validator.validate(gpu)


def test_smi_xml_rejects_non_smi_output():
    with pytest.raises(gpus_utils.SmiParseError):
        gpus_utils.parse_smi_xml("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    with pytest.raises(gpus_utils.SmiParseError):
        gpus_utils.parse_smi_xml("<?xml version='1.0'?><other/>")


# ---- NVML constants against the real pynvml -------------------------------------------------------

def test_nvml_constants_match_pynvml():
    pynvml = pytest.importorskip("pynvml")
    for name in ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_LIBRARY_NOT_FOUND",
                 "NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_LIB_RM_VERSION_MISMATCH", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"):
        if hasattr(pynvml, name):
            assert getattr(gpus_utils, name) == getattr(pynvml, name), name


def test_recovery_action_names_match_pynvml_codes():
    pynvml = pytest.importorskip("pynvml")
    codes = {"None": "NVML_GPU_RECOVERY_ACTION_NONE", "Reset": "NVML_GPU_RECOVERY_ACTION_GPU_RESET",
             "Reboot": "NVML_GPU_RECOVERY_ACTION_NODE_REBOOT", "Drain P2P": "NVML_GPU_RECOVERY_ACTION_DRAIN_P2P",
             "Drain and Reset": "NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET",
             "Recover IMEX Domain": "NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN",
             "Bus Reset": "NVML_GPU_RECOVERY_ACTION_BUS_RESET", "System Reboot": "NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT"}
    for value, name in gpus_utils.RECOVERY_ACTIONS.items():
        if hasattr(pynvml, codes[name]):
            assert getattr(pynvml, codes[name]) == value, name


def test_clock_event_bits_match_pynvml():
    pynvml = pytest.importorskip("pynvml")
    pynvml_names = {"gpu_idle": "GpuIdle", "applications_clocks_setting": "ApplicationsClocksSetting",
                    "sw_power_cap": "SwPowerCap", "hw_slowdown": "HwSlowdown", "sync_boost": "SyncBoost",
                    "sw_thermal_slowdown": "SwThermalSlowdown", "hw_thermal_slowdown": "HwThermalSlowdown",
                    "hw_power_brake_slowdown": "HwPowerBrakeSlowdown", "display_clocks_setting": "DisplayClockSetting"}
    for bit, name in gpus_utils.CLOCK_EVENT_BITS:
        assert getattr(pynvml, "nvmlClocksEventReason" + pynvml_names[name]) == bit, name
    assert gpus_utils.clock_event_names(pynvml.nvmlClocksEventReasonAll) == [n for _, n in gpus_utils.CLOCK_EVENT_BITS]
    assert gpus_utils.clock_event_names(pynvml.nvmlClocksEventReasonNone) == []
    assert gpus_utils.clock_event_names(pynvml.nvmlClocksEventReasonSwThermalSlowdown | pynvml.nvmlClocksEventReasonHwSlowdown) \
        == ["hw_slowdown", "sw_thermal_slowdown"]


def test_clock_event_names_of_real_mask(nvml_dump, csv_rows):
    assert gpus_utils.clock_event_names(nvml_dump["gpus"][0]["clock_events"]) == ["gpu_idle"]
    assert gpus_utils.clock_event_names(int(csv_rows[0]["clocks_event_reasons.active"], 16)) == ["gpu_idle"]


def test_nvml_reader_calls_exist_in_pynvml():
    """Every pynvml function and constant NvmlReader uses exists in the real binding."""
    pynvml = pytest.importorskip("pynvml")
    source = Path(gpus_utils.__file__).read_text()
    used = set(re.findall(r"\bn\.((?:nvml|NVML)\w+)", source))
    assert "nvmlDeviceGetRemappedRows" in used and "nvmlDeviceGetFieldValues" in used
    assert sorted(name for name in used if not hasattr(pynvml, name)) == []
    assert {"nvmlReturn", "value"} <= {f[0] for f in pynvml.c_nvmlFieldValue_t._fields_}
    assert "uiVal" in {f[0] for f in pynvml.c_nvmlValue_t._fields_}


# ---- kernel log -------------------------------------------------------------------------------------

XID_FORMS = ("kernel-log", "xid-forms.kmsg")

# (code, pci_bus_id, gpu_instance, pid, process, message start) for the Xid lines of xid-forms.*, in order.
EXPECTED_XIDS = [
    (119, "00000000:9b:00.0", None, 2024380, "nvidia-smi", "Timeout after 6s of waiting for RPC response from GPU1 GSP!"),
    (14, "00000000:03:00.0", None, None, None, "Channel 00000001"),
    (94, "00000000:01:00.0", 5, 7194, None, "Contained: CE User Channel (0x9). RST: No, D-RST: No"),
    (154, "00000009:01:00.0", None, None, None, "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)"),
    (79, "00000000:29:00.0", None, None, None, "GPU has fallen off the bus"),
    (79, "00000000:3b:00.0", None, 1234, "python3", "GPU has fallen off the bus."),
    (48, "00000000:3b:00.0", None, None, None, "An uncorrectable double bit error (DBE) has been detected on GPU"),
]


def test_parse_kmsg_real_capture_agrees_with_dmesg(testdata):
    kmsg = klog.parse_kmsg(read(testdata, H100, "kmsg-nvrm.txt"))
    dmesg = klog.parse_bracketed(read(testdata, H100, "dmesg-nvrm.txt"))
    assert [r["seq"] for r in kmsg] == [353, 354, 355, 356, 357]
    assert kmsg[2]["message"].startswith("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04")
    assert kmsg[0]["uptime_s"] == pytest.approx(0.440013)
    assert [r["message"] for r in kmsg] == [r["message"] for r in dmesg]
    assert [r["uptime_s"] for r in kmsg] == pytest.approx([r["uptime_s"] for r in dmesg])
    assert all(r["seq"] is None for r in dmesg)
    assert klog.xid_events(kmsg, {}) == [] and klog.xid_events(dmesg, {}) == []  # a healthy host: no Xid


def test_parse_kmsg_ignores_continuation_lines():
    text = ("3,900,123456789,-;NVRM: Xid (PCI:0000:9b:00): 79, pid=1, name=a, GPU has fallen off the bus.\n"
            " SUBSYSTEM=pci\n DEVICE=+pci:0000:9b:00.0\n")
    records = klog.parse_kmsg(text)
    assert len(records) == 1 and records[0]["seq"] == 900


@pytest.mark.parametrize("name,parse", [("xid-forms.kmsg", klog.parse_kmsg), ("xid-forms.dmesg", klog.parse_bracketed),
                                        ("xid-forms.journalctl", klog.parse_bracketed)])
def test_xid_forms_every_format(testdata, catalog, name, parse):
    text = read(testdata, "kernel-log", name)
    records = parse(text)
    assert len(records) == len(text.splitlines()) == 12
    events = klog.xid_events(records, klog.catalog_index(catalog))
    assert len(events) == len(EXPECTED_XIDS)
    by_code = {int(e["code"]): e for e in catalog}
    for event, (code, pci, gi, pid, process, message) in zip(events, EXPECTED_XIDS):
        assert event["code"] == code
        assert event["pci_bus_id"] == pci
        assert event["gpu_instance"] == gi
        assert event["pid"] == pid
        assert event["process"] == process
        assert event["message"].startswith(message)
        assert event["raw"] in text
        if code in by_code:
            entry = by_code[code]
            assert (event["name"], event["class"], event["severity"], event["action"], event["source"]) == \
                   (entry["name"], entry["class"], entry["severity"], entry["action"], entry["source"])
        if name.endswith(".kmsg"):
            assert isinstance(event["seq"], int)
        else:
            assert event["seq"] is None


def test_xid_forms_details(testdata, catalog):
    events = klog.xid_events(klog.parse_kmsg(read(testdata, *XID_FORMS)), klog.catalog_index(catalog))
    gsp, unknown, contained, recovery, fallen, fallen_xid, dbe = events
    assert (gsp["class"], gsp["severity"], gsp["name"]) == ("critical", "critical", "GSP RPC Timeout")
    assert (unknown["class"], unknown["severity"]) == ("unknown", "high")
    assert unknown["name"] == "unknown Xid 14"
    assert (contained["class"], contained["severity"]) == ("application", "medium")
    assert recovery["recovery_action"] == {"from_code": 0, "from": "None", "to_code": 4, "to": "Drain and Reset"}
    assert (recovery["class"], recovery["severity"]) == ("recovery", "high")
    assert all(e["recovery_action"] is None for e in events if e is not recovery)
    assert fallen["raw"] == "NVRM: GPU 0000:29:00.0: GPU has fallen off the bus."
    assert (fallen["code"], fallen["severity"], fallen["name"]) == (79, "critical", "GPU has fallen off the bus")
    assert (fallen_xid["class"], dbe["class"], dbe["severity"]) == ("critical", "critical", "critical")
    assert [e["seq"] for e in events] == [356, 358, 359, 361, 362, 363, 364]
    assert events[0]["uptime_s"] == pytest.approx(902.118345)


def test_xid_events_valid_against_schema(testdata, catalog, schema):
    validator = def_validator(schema, "xid_event")
    for name, parse in (("xid-forms.kmsg", klog.parse_kmsg), ("xid-forms.journalctl", klog.parse_bracketed)):
        for event in klog.xid_events(parse(read(testdata, "kernel-log", name)), klog.catalog_index(catalog)):
            validator.validate(event)


def test_xid_since_seq(testdata, catalog):
    index = klog.catalog_index(catalog)
    records = klog.parse_kmsg(read(testdata, *XID_FORMS))
    assert [e["seq"] for e in klog.xid_events(records, index, since_seq=361)] == [362, 363, 364]
    assert [e["code"] for e in klog.xid_events(records, index, since_seq=361)] == [79, 79, 48]
    assert klog.xid_events(records, index, since_seq=364) == []
    assert len(klog.xid_events(records, index, since_seq=0)) == 7
    # journalctl/dmesg records have no sequence number: since_seq cannot filter them.
    bracketed = klog.parse_bracketed(read(testdata, "kernel-log", "xid-forms.dmesg"))
    assert len(klog.xid_events(bracketed, index, since_seq=361)) == 7


def test_catalog_overrides(testdata, catalog):
    pristine = copy.deepcopy(catalog)
    index = klog.catalog_index(catalog, {94: {"class": "critical", "severity": "critical"},
                                         "14": {"name": "Channel error", "class": "application", "severity": "low",
                                                "source": "site runbook"}})
    assert catalog == pristine  # the shipped table is not changed by a baseline's overrides
    events = {e["code"]: e for e in klog.xid_events(klog.parse_kmsg(read(testdata, *XID_FORMS)), index)}
    shipped_94 = next(e for e in catalog if e["code"] == 94)
    assert (events[94]["class"], events[94]["severity"]) == ("critical", "critical")
    assert events[94]["name"] == shipped_94["name"]
    assert events[94]["source"] == "baseline override of: " + shipped_94["source"]
    assert (events[14]["name"], events[14]["class"], events[14]["severity"], events[14]["source"]) == \
           ("Channel error", "application", "low", "site runbook")
    # without overrides the same codes classify as shipped
    plain = {e["code"]: e for e in klog.xid_events(klog.parse_kmsg(read(testdata, *XID_FORMS)), klog.catalog_index(catalog))}
    assert plain[94]["severity"] == "medium" and plain[14]["class"] == "unknown"


def test_normalize_pci():
    assert klog.normalize_pci("0000:9b:00") == "00000000:9b:00.0"
    assert klog.normalize_pci("00000000:9B:00.0") == "00000000:9b:00.0"
    assert klog.normalize_pci("0009:01:00") == "00000009:01:00.0"


# ---- driver version and state -------------------------------------------------------------------

def test_proc_driver_version_real_open_module(gpu_facts_module, testdata):
    parsed = gpu_facts_module.parse_proc_driver_version(read(testdata, H100, "proc-driver-nvidia-version.txt"))
    assert parsed == ("580.159.04", "open")
    assert parsed[0] == read(testdata, H100, "sys-module-nvidia-version.txt").strip()


def test_proc_driver_version_proprietary(gpu_facts_module):
    text = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
            "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n")
    assert gpu_facts_module.parse_proc_driver_version(text) == ("550.54.15", "proprietary")
    assert gpu_facts_module.parse_proc_driver_version("") == (None, None)


def test_userspace_version_from_real_ldconfig_listing(gpu_facts_module, testdata):
    """The module takes libnvidia-ml's version from the file libnvidia-ml.so.1 resolves to."""
    listing = read(testdata, H100, "ldconfig-nvml.txt")
    target = re.search(r"libnvidia-ml\.so\.1 -> (\S+)", listing).group(1)
    version = gpu_facts_module._LIB_VERSION.search(target).group(1)
    module_version = read(testdata, H100, "sys-module-nvidia-version.txt").strip()
    assert version == module_version == "580.159.04"
    assert gpu_facts_module.driver_state(module_version, version, installed=True) == "loaded"


@pytest.mark.parametrize("module_version,userspace,installed,nvml_mismatch,state", [
    ("580.159.04", "580.159.04", True, False, "loaded"),
    ("580.159.04", None, True, False, "loaded"),
    ("580.159.04", "580.159.04", False, False, "loaded"),
    ("580.126.09", "580.159.04", True, False, "version_mismatch"),
    ("580.159.04", "580.159.04", True, True, "version_mismatch"),
    ("580.159.04", None, True, True, "version_mismatch"),
    (None, "580.159.04", True, False, "not_loaded"),
    (None, None, True, False, "not_loaded"),
    (None, None, False, False, "not_installed"),
])
def test_driver_state(gpu_facts_module, module_version, userspace, installed, nvml_mismatch, state):
    assert gpu_facts_module.driver_state(module_version, userspace, installed, nvml_mismatch) == state


# ---- packages ----------------------------------------------------------------------------------------

def test_dpkg_real_capture_has_no_driver_packages(gpu_facts_module, testdata):
    """The capture host runs a driver installed outside dpkg: only CUDA, cuDNN and NCCL packages are listed."""
    text = read(testdata, H100, "dpkg-nvidia.txt")
    lines = text.splitlines()
    assert lines and all(len(line.split("\t")) == 3 for line in lines)
    assert any(line.startswith("libnccl2\t") and line.endswith("hold ok installed") for line in lines)
    assert gpu_facts_module.parse_dpkg_query(text) == []
    for name in ("libnccl2", "libnccl-dev", "cuda-compat-13-0", "cuda-driver-dev-13-0", "cuda-nvml-dev-13-0", "libcudnn9-cuda-13"):
        assert gpu_facts_module.package_role(name) is None, name


def test_dpkg_ubuntu_driver_570(gpu_facts_module, testdata):
    packages = gpu_facts_module.parse_dpkg_query(read(testdata, "packages", "dpkg-ubuntu-driver-570.txt"))
    got = {p["name"]: (p["role"], p["held"]) for p in packages}
    assert got == {  # every part Ubuntu spells with the branch or the version moves with the driver
        "libnvidia-cfg1-570": ("driver", False),
        "libnvidia-common-570": ("driver", False),
        "libnvidia-decode-570": ("driver", False),
        "nvidia-firmware-570-570.133.07": ("driver", False),
        "libnvidia-compute-570": ("driver", False),
        "libnvidia-container-tools": ("container_toolkit", False),
        "libnvidia-container1": ("container_toolkit", False),
        "libnvidia-gl-570": ("driver", False),
        "libnvidia-nscq-570": ("fabricmanager", False),
        "nvidia-compute-utils-570": ("driver", False),
        "nvidia-container-toolkit": ("container_toolkit", False),
        "nvidia-container-toolkit-base": ("container_toolkit", False),
        "nvidia-dkms-570-open": ("driver", False),
        "nvidia-driver-570-open": ("driver", True),
        "nvidia-fabricmanager-570": ("fabricmanager", False),
        "nvidia-kernel-common-570": ("driver", False),
        "nvidia-kernel-source-570-open": ("driver", False),
        "nvidia-persistenced": ("persistenced", False),
        "nvidia-utils-570": ("driver", False),
    }
    assert "nvidia-driver-535-open" not in got  # removed, only its config files remain
    assert all(p["manager"] == "dpkg" for p in packages)
    assert {p["version"] for p in packages if p["role"] == "driver"} == {"570.133.07-0ubuntu0.24.04.1"}
    assert {p["version"] for p in packages if p["role"] == "container_toolkit"} == {"1.17.8-1"}


@pytest.mark.skipif(not Path("/var/lib/dpkg/status").exists(), reason="no dpkg database on this machine")
def test_dpkg_status_file_reads_as_dpkg_query_lists_it(gpu_facts_module):
    """gpu_facts reads dpkg's status file instead of running dpkg-query: this machine's real database, read both
    ways, lists the same packages, versions and states."""
    query = subprocess.run(["dpkg-query", "-W", "-f=${Package}\t${Version}\t${Status}\n"], capture_output=True,
                           text=True, check=True).stdout
    read = gpu_facts_module.dpkg_status_lines(Path("/var/lib/dpkg/status").read_text(encoding="utf-8"))
    assert len(read.splitlines()) > 10
    assert sorted(read.splitlines()) == sorted(query.splitlines())


def test_dpkg_journal_record_replaces_the_status_files(gpu_facts_module):
    """A record in dpkg's journal (/var/lib/dpkg/updates: an apt run under way, or interrupted) wins over the status
    file's, as in dpkg-query: a driver package an upgrade left half-configured is not listed as installed."""
    status = ("Package: nvidia-driver-570-open\nStatus: hold ok installed\nPriority: optional\nArchitecture: amd64\n"
              "Version: 570.133.07-0ubuntu0.24.04.1\nDescription: NVIDIA driver metapackage\n This package: all\n\n"
              "Package: nvidia-utils-570\nStatus: install ok installed\nArchitecture: amd64\nVersion: 570.133.07-0ubuntu1\n")
    journal = "Package: nvidia-driver-570-open\nStatus: install ok half-configured\nArchitecture: amd64\nVersion: 575.51.03-0ubuntu1\n"
    got = {p["name"]: (p["version"], p["held"]) for p in gpu_facts_module.parse_dpkg_query(
        gpu_facts_module.dpkg_status_lines(status))}
    assert got == {"nvidia-driver-570-open": ("570.133.07-0ubuntu0.24.04.1", True),
                   "nvidia-utils-570": ("570.133.07-0ubuntu1", False)}
    got = {p["name"] for p in gpu_facts_module.parse_dpkg_query(gpu_facts_module.dpkg_status_lines(status, journal))}
    assert got == {"nvidia-utils-570"}  # half-configured: not installed, as dpkg-query's status says


@pytest.mark.skipif(not Path("/etc/ld.so.cache").exists(), reason="no dynamic linker cache on this machine")
def test_ld_cache_read_lists_what_ldconfig_lists(gpu_facts_module):
    """gpu_facts finds libnvidia-ml.so.1 in /etc/ld.so.cache instead of running `ldconfig -p`: this machine's real
    cache, read both ways, gives the same libraries at the same paths in the same order. A file cut short or in
    another format reads as None (then ldconfig is asked)."""
    listed = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    expected = re.findall(r"^\t(\S+) \([^)]*\) => (.+)$", listed, re.M)
    data = Path("/etc/ld.so.cache").read_bytes()
    assert len(expected) > 10
    assert gpu_facts_module.ld_cache_entries(data) == expected
    for damaged in (data[:len(data) // 2], data[:40], b"ld.so-1.7.0" + bytes(64), b""):
        assert gpu_facts_module.ld_cache_entries(damaged) is None


def test_rpm_query_with_versionlock(gpu_facts_module, schema):
    rpm = "\n".join([
        "nvidia-driver\t570.86.15-1.el9", "nvidia-driver-libs\t570.86.15-1.el9", "nvidia-driver-cuda\t570.86.15-1.el9",
        "kmod-nvidia-open-dkms\t570.86.15-1.el9", "nvidia-persistenced\t570.86.15-1.el9",
        "nvidia-fabric-manager\t570.86.15-1", "nvidia-container-toolkit\t1.17.8-1", "kernel\t5.14.0-503.14.1.el9_5",
        "cuda-toolkit-12-8\t12.8.0-1"]) + "\n"
    versionlock = "\n".join([
        "# Added lock on Mon Mar 17 10:02:11 2025",
        "nvidia-driver-3:570.86.15-1.el9.*",
        "nvidia-driver-libs-3:570.86.15-1.el9.*",
        "kmod-nvidia-open-dkms-3:570.86.15-1.el9.*",
        "# Added exclude on Mon Mar 17 10:03:40 2025",
        "!nvidia-driver-cuda-3:575.51.03-1.el9.*",
    ]) + "\n"
    packages = gpu_facts_module.parse_rpm_query(rpm, versionlock)
    got = {p["name"]: (p["role"], p["held"], p["version"]) for p in packages}
    assert got == {
        "nvidia-driver": ("driver", True, "570.86.15-1.el9"),
        "nvidia-driver-libs": ("driver", True, "570.86.15-1.el9"),
        "nvidia-driver-cuda": ("driver", False, "570.86.15-1.el9"),  # an excluded version is not a hold
        "kmod-nvidia-open-dkms": ("driver", True, "570.86.15-1.el9"),
        "nvidia-persistenced": ("persistenced", False, "570.86.15-1.el9"),
        "nvidia-fabric-manager": ("fabricmanager", False, "570.86.15-1"),
        "nvidia-container-toolkit": ("container_toolkit", False, "1.17.8-1"),
    }
    validator = def_validator(schema, "package")
    for p in packages:
        assert p["manager"] == "rpm"
        validator.validate(p)


# ---- nouveau -------------------------------------------------------------------------------------------

def test_modprobe_blacklists(gpu_facts_module):
    files = [
        ("/etc/modprobe.d/blacklist-nvidia-nouveau.conf", "blacklist nouveau\noptions nouveau modeset=0\n"),
        ("/etc/modprobe.d/disable-nouveau.conf", "# keep nouveau away for good\ninstall nouveau /bin/false\n"),
        ("/etc/modprobe.d/old.conf", "# blacklist nouveau\n#install nouveau /bin/false\n"),
        ("/etc/modprobe.d/nouveau-fb.conf", "blacklist nouveaufb\noptions nouveau modeset=0\n"),
        ("/usr/lib/modprobe.d/nvidia-installer-disable-nouveau.conf",
         "# generated by nvidia-installer\nblacklist nouveau   # trailing comment\noptions nouveau modeset=0\n"),
    ]
    found = gpu_facts_module.modprobe_blacklists(files, "BOOT_IMAGE=/vmlinuz-6.8.0-48-generic root=UUID=1b2c ro quiet splash\n")
    assert found == ["/etc/modprobe.d/blacklist-nvidia-nouveau.conf", "/etc/modprobe.d/disable-nouveau.conf",
                     "/usr/lib/modprobe.d/nvidia-installer-disable-nouveau.conf"]
    cmdline = "BOOT_IMAGE=/vmlinuz-6.8.0-48-generic root=UUID=1b2c ro modprobe.blacklist=nouveau nouveau.modeset=0\n"
    assert gpu_facts_module.modprobe_blacklists([], cmdline) == ["/proc/cmdline"]
    assert gpu_facts_module.modprobe_blacklists([], "ro rd.driver.blacklist=nouveau quiet") == ["/proc/cmdline"]
    assert gpu_facts_module.modprobe_blacklists([], "ro nouveau.modeset=0 quiet") == []
    assert gpu_facts_module.modprobe_blacklists(files[2:4], "ro quiet") == []


# ---- container runtimes and CDI -------------------------------------------------------------------------

def test_containerd_config_from_nvidia_ctk(gpu_facts_module, testdata):
    text = read(testdata, "container-runtime", "containerd-config-nvidia-ctk.toml")
    assert gpu_facts_module.toml_has_nvidia_runtime(text, "containerd") == (True, True)


def test_containerd_config_with_nvidia_commented_out(gpu_facts_module, testdata):
    text = read(testdata, "container-runtime", "containerd-config-nvidia-commented.toml")
    assert gpu_facts_module.toml_has_nvidia_runtime(text, "containerd") == (False, False)


def test_containerd_runtime_not_default(gpu_facts_module, testdata):
    text = read(testdata, "container-runtime", "containerd-config-nvidia-ctk.toml")
    text = text.replace('default_runtime_name = "nvidia"', 'default_runtime_name = "runc"')
    assert gpu_facts_module.toml_has_nvidia_runtime(text, "containerd") == (True, False)


def test_crio_config_from_nvidia_ctk(gpu_facts_module, testdata):
    text = read(testdata, "container-runtime", "crio-99-nvidia.toml")
    assert gpu_facts_module.toml_has_nvidia_runtime(text, "crio") == (True, True)
    assert gpu_facts_module.toml_has_nvidia_runtime(text.replace('default_runtime = "nvidia"', 'default_runtime = "crun"'),
                                                    "crio") == (True, False)


def test_cdi_driver_version(gpu_facts_module, testdata):
    text = read(testdata, "container-runtime", "cdi-nvidia-570.86.15.yaml")
    assert "nvidia.com/" in text  # what makes the collector read the spec at all
    assert yaml.safe_load(text)["kind"] == "nvidia.com/gpu"
    assert gpu_facts_module.cdi_driver_version(text) == "570.86.15"
    assert gpu_facts_module.cdi_driver_version("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n") is None


# ---- schema ------------------------------------------------------------------------------------------------

def test_schema_is_valid_2020_12(schema):
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == "https://fleetctl.dev/schemas/host-facts.schema.json"


def test_schema_gpu_entries(schema, smi):
    items = Draft202012Validator({"$schema": schema["$schema"], "$defs": schema["$defs"],
                                  "type": "array", "items": schema["properties"]["gpus"]["items"]})
    gpu = smi[1][0]
    items.validate([gpu, {"index": 1, "lost": True}])
    assert not items.is_valid([{"index": 1, "lost": False}])
    assert not items.is_valid([dict(gpu, lost=True)])
    assert not items.is_valid([dict(gpu, fan_speed=30)])
    missing = dict(gpu)
    del missing["recovery_action"]
    assert not items.is_valid([missing])


# ---- the real module, run by Ansible on this machine ---------------------------------------------------------

@pytest.mark.skipif(os.path.exists("/sys/module/nvidia"), reason="this host has the nvidia module loaded")
def test_real_module_run_validates_against_schema(tmp_path, schema, catalog):
    ansible = Path(sys.executable).parent / "ansible"
    env = dict(os.environ,
               ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"),
               ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_INVENTORY_UNPARSED_WARNING="False",
               ANSIBLE_NOCOLOR="1")
    args = json.dumps({"xid_catalog": catalog, "xid_overrides": {}, "kmsg_since_seq": -1, "check_initramfs": True})
    tree = tmp_path / "tree"
    proc = subprocess.run([str(ansible), "localhost", "-c", "local", "-m", "fleetctl.gpu.gpu_facts", "-a", args,
                           "-e", "ansible_python_interpreter=" + sys.executable, "--tree", str(tree)],
                          env=env, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    result = json.loads((tree / "localhost").read_text())
    assert result.get("failed") is not True, result
    facts = result["facts"]
    errors = sorted(Draft202012Validator(schema).iter_errors(facts), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join("%s: %s" % ("/".join(map(str, e.absolute_path)), e.message) for e in errors)
    assert facts["driver"]["state"] == "not_installed"
    assert facts["driver"]["module_version"] is None and facts["driver"]["module_flavor"] is None
    assert facts["gpus"] == []
