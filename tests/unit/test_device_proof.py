"""What fleetctl audit collected on a real H100 (driver 580.159.04) against what nvidia-smi said in the same run.

tests/testdata/h100-580.159.04-audit was made by scripts/device-audit-proof.sh on the device machine: the audit
ran once through pynvml and once through the nvidia-smi -q -x fallback; nvidia-smi-q-x.xml was taken beside them.
The XML is read here with ElementTree directly, not with fleetctl's parser, so the two can disagree.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from orchestrator import schemas

DIR = "h100-580.159.04-audit"


@pytest.fixture(scope="module")
def reports(testdata):
    return {path: json.loads((testdata / DIR / f"audit-{path}.json").read_text()) for path in ("nvml", "smi")}


@pytest.fixture(scope="module")
def smi(testdata):
    return ET.parse(testdata / DIR / "nvidia-smi-q-x.xml").getroot()


def text(el, path):
    return el.find(path).text.strip()


@pytest.mark.parametrize("path", ["nvml", "smi"])
def test_the_collector_read_what_nvidia_smi_reported(reports, smi, path):
    facts = reports[path]["hosts"][0]["facts"]
    gpu_xml = smi.find("gpu")
    gpu = facts["gpus"][0]
    assert facts["sources"]["gpus"] == {"nvml": "nvml", "smi": "nvidia-smi -q -x"}[path]
    assert facts["driver"]["state"] == "loaded"
    assert facts["driver"]["module_version"] == text(smi, "driver_version") == "580.159.04"
    assert facts["driver"]["userspace_version"] == "580.159.04"
    assert facts["driver"]["module_flavor"] == "open"
    assert facts["driver"]["cuda_driver_version"] == text(smi, "cuda_version") == "13.0"
    assert len(facts["gpus"]) == int(text(smi, "attached_gpus")) == 1
    assert gpu["name"] == text(gpu_xml, "product_name") == "NVIDIA H100 80GB HBM3"
    assert gpu["uuid"] == text(gpu_xml, "uuid")
    assert gpu["serial"] == text(gpu_xml, "serial")
    assert gpu["pci_bus_id"] == text(gpu_xml, "pci/pci_bus_id").lower()
    assert gpu["vbios"] == text(gpu_xml, "vbios_version")
    assert gpu["persistence_mode"] is (text(gpu_xml, "persistence_mode") == "Enabled")
    assert gpu["ecc"]["enabled"] is (text(gpu_xml, "ecc_mode/current_ecc") == "Enabled")
    assert gpu["ecc"]["uncorrected_volatile"] == int(text(gpu_xml, "ecc_errors/volatile/dram_uncorrectable"))
    assert gpu["mig"]["current"] is (text(gpu_xml, "mig_mode/current_mig") == "Enabled")
    link = "pci/pci_gpu_link_info/"
    assert gpu["pcie"] == {"gen": int(text(gpu_xml, link + "pcie_gen/current_link_gen")),
                           "gen_max": int(text(gpu_xml, link + "pcie_gen/max_link_gen")),
                           "width": int(text(gpu_xml, link + "link_widths/current_link_width").rstrip("x")),
                           "width_max": int(text(gpu_xml, link + "link_widths/max_link_width").rstrip("x"))}
    assert gpu["remapped_rows"]["pending"] is (text(gpu_xml, "remapped_rows/remapped_row_pending") == "Yes")
    assert gpu["remapped_rows"]["uncorrectable"] == int(text(gpu_xml, "remapped_rows/remapped_row_unc"))
    assert gpu["recovery_action"] == text(gpu_xml, "gpu_recovery_action") == "None"
    idle = text(gpu_xml, "clocks_event_reasons/clocks_event_reason_gpu_idle") == "Active"
    assert ("gpu_idle" in gpu["clock_event_reasons"]["active"]) is idle
    assert 10 <= gpu["temperature_c"] <= 95 and 20 <= gpu["power_w"] <= 700


def test_nvml_and_the_nvidia_smi_fallback_agree(reports):
    nvml, smi = (reports[p]["hosts"][0]["facts"]["gpus"][0] for p in ("nvml", "smi"))
    differing = {k for k in nvml if nvml[k] != smi[k]}
    assert differing <= {"power_w", "temperature_c"}  # instantaneous readings, taken seconds apart


def test_the_device_reports_are_valid_and_show_real_drift(reports):
    for report in reports.values():
        assert schemas.first_error("audit-report", report) is None
        failing = {f["control"] for f in report["hosts"][0]["findings"] if f["status"] == "fail"}
        # that machine runs a container-image driver: no nouveau blacklist, no nvidia-persistenced
        assert failing == {"nouveau.blacklisted", "persistence.daemon"}
        assert report["summary"]["exit_code"] == 1


def test_fleetctls_parser_on_the_captured_xml_gives_what_nvml_gave(reports, testdata):
    from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_gpus import parse_smi_xml

    system, gpus = parse_smi_xml((testdata / DIR / "nvidia-smi-q-x.xml").read_text())
    nvml = reports["nvml"]["hosts"][0]["facts"]
    assert system["driver_version"] == nvml["driver"]["module_version"]
    assert system["cuda_driver_version"] == nvml["driver"]["cuda_driver_version"]
    (parsed,), (seen,) = gpus, nvml["gpus"]
    parsed["pcie"] = {k: v for k, v in parsed["pcie"].items() if k in seen["pcie"]}  # the capture predates replay_count
    assert {k for k in seen if seen[k] != parsed[k]} <= {"power_w", "temperature_c"}
