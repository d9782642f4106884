"""fleetctl's interconnect reading on a real 2x H200, held against nvidia-smi's output of the same run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator import schemas

PROOF = Path(__file__).parents[1] / "testdata" / "h200x2-580.159.04-audit"


def facts(name: str) -> dict:
    report = json.loads((PROOF / name).read_text())
    assert schemas.first_error("audit-report", report) is None
    return report["hosts"][0]


def smi_section(args: str) -> str:
    text = (PROOF / "nvidia-smi-interconnect.txt").read_text()
    return text.split(f"===== {args}\n", 1)[1].split("\n===== ", 1)[0]


@pytest.mark.parametrize("name, source", [("audit-nvml.json", "nvml"), ("audit-smi.json", "nvidia-smi")])
def test_links_fabric_and_topology_equal_what_nvidia_smi_printed(name, source):
    host = facts(name)
    ic = host["facts"]["interconnect"]
    assert host["facts"]["sources"]["interconnect"] == source and not host["facts"]["errors"]
    per_gpu = re.split(r"^GPU \d+: ", smi_section("nvidia-smi nvlink -s"), flags=re.M)[1:]
    assert [g["nvlink"]["up"] for g in ic["gpus"]] == [len(re.findall(r"Link \d+: [\d.]+ GB/s", s)) for s in per_gpu]
    assert [g["nvlink"]["total"] for g in ic["gpus"]] == [len(re.findall(r"Link \d+:", s)) for s in per_gpu] == [18, 18]
    fabric = re.findall(r"Fabric\n\s+State\s+: (.+)\n\s+Status\s+: (.+)\n\s+CliqueId\s+: (\d+)\n\s+ClusterUUID\s+: (.+)\n",
                        smi_section("nvidia-smi -q"))
    assert [(g["fabric"]["state"], g["fabric"]["status"], str(g["fabric"]["clique_id"]), g["fabric"]["cluster_uuid"])
            for g in ic["gpus"]] == [(s.lower(), st.lower(), c, u) for s, st, c, u in fabric]
    matrix = re.sub(r"\x1b\[\d+m", "", smi_section("nvidia-smi topo -m"))
    assert re.search(r"^GPU0\s+X\s+NV18", matrix, re.M)
    assert ic["topology"] == [{"gpus": [0, 1], "link": "NV18", "nvlinks": 18}]
    errors = re.findall(r"Link (\d+): (Replay|Recovery|CRC) Errors: (\d+)", smi_section("nvidia-smi nvlink -e"))
    assert errors and {int(n) for _, _, n in errors} == {0}
    assert all(link["errors"][k] == 0 for g in ic["gpus"] for link in g["nvlink"]["links"]
               for k in ("replay", "recovery", "crc"))  # the counters nvidia-smi calls errors
    modules = smi_section("modules")
    assert ic["peermem_loaded"] is bool(re.search(r"^n\w*_peermem ", modules, re.M)) is False
    found = {f["control"]: f["status"] for f in host["findings"]}
    assert (found["gpu.nvlink"], found["gpu.fabric"], found["gpu.topology"]) == ("pass", "pass", "pass")


def test_both_paths_agree_link_by_link():
    nvml, smi = (facts(n)["facts"]["interconnect"] for n in ("audit-nvml.json", "audit-smi.json"))
    assert [[link["state"] for link in g["nvlink"]["links"]] for g in nvml["gpus"]] == \
        [[link["state"] for link in g["nvlink"]["links"]] for g in smi["gpus"]]
    assert nvml["topology"] == smi["topology"]
    # NVML says more: the version and the far end of every link (NVSwitch; its PCI id hidden by the VM).
    assert {(link["version"], link["remote"]["type"], link["remote"]["pci_bus_id"])
            for g in nvml["gpus"] for link in g["nvlink"]["links"]} == {("4.0", "switch", None)}


def test_the_probe_of_the_same_run_reads_the_interconnect_as_the_audit_and_measures_it():
    """fleetctl probe --throughput on the same machine: its health carries the same links, fabric and topology as
    the audit read, and the builtin engine's all-reduce and P2P samples are there, with their figures."""
    report = json.loads((PROOF / "probe-default.json").read_text())
    assert schemas.first_error("probe-report", report) is None
    host = report["hosts"][0]
    probe, audit = host["probe"], facts("audit-nvml.json")["facts"]["interconnect"]
    assert host["health"]["status"] == "pass" and probe["errors"] == {}
    assert probe["health"]["interconnect"]["topology"] == audit["topology"]
    assert [(g["nvlink"]["up"], g["fabric"]) for g in probe["health"]["interconnect"]["gpus"]] == \
        [(g["nvlink"]["up"], g["fabric"]) for g in audit["gpus"]]
    samples = probe["throughput"]["samples"]
    allreduce = [s["value"] for s in samples if s["metric"] == "allreduce_busbw_gbs"]
    p2p = {(s["gpu"], s["peer"]) for s in samples if s["metric"] == "p2p_gbs"}
    assert len(allreduce) == 10 and 300 < min(allreduce) and p2p == {(0, 1), (1, 0)}
    assert all(s["gpu"] is None for s in samples if s["metric"] == "allreduce_busbw_gbs")
