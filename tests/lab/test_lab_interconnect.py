"""Multi-GPU hosts in the lab, end to end through the CLI: NVLink, the NVSwitch fabric and the GPU topology.

One lab for the module (six 2-GPU H100 HGX hosts on 550.163.01 and one 2-GPU L40S host, PCIe only): h100-01..03
take the faults the audit and the probe must find, h100-04..06 the campaigns. Each fault
of issue 12 is followed from `lab inject` to what an operator sees: the audit's finding, the probe's verdict
against the host's own previous probe, and a campaign whose canary comes back from its reboot with a link down, or
with a fabric that never completes, rolled back.
"""

from __future__ import annotations

import json
import re

import pytest
from tests.helpers.lab import fleetctl_lab


pytestmark = pytest.mark.lab

FROM, TO = "550.163.01", "570.86.15"
SPECS = ("6xh100-sxm/2@550.163.01", "1xl40s/2@550.163.01")
PROBE = ("--throughput", "--samples", "10", "--warmup", "0", "--trial", "0.02", "--format", "json")
UPGRADE = ("--yes", "--soak", "0", "--warmup", "0", "--trial", "0.02", "--samples", "10", "--idle-timeout", "20")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with fleetctl_lab(tmp_path_factory.mktemp("interconnect"), SPECS) as handle:
        yield handle


def findings(report: dict) -> dict[str, dict[str, dict]]:
    return {h["name"]: {f["control"]: f for f in h["findings"]} for h in report["hosts"]}


def probe(lab, *args: str) -> tuple[int, dict[str, dict]]:
    proc = lab.fleetctl("probe", "-i", lab.inventory, *PROBE, *args)
    assert proc.returncode in (0, 1, 3), proc.stderr
    return proc.returncode, {h["name"]: h for h in json.loads(proc.stdout)["hosts"]}


def test_healthy_hosts_read_as_nvidia_smi_shows_them(lab):
    code, report = lab.audit()
    assert code == 0, [(h["name"], f["control"], f["message"]) for h in report["hosts"] for f in h["findings"]
                       if f["status"] == "fail"]
    by_host = findings(report)
    for host in ("h100-01", "h100-02", "h100-03", "h100-04", "h100-05", "h100-06"):
        assert {c: by_host[host][c]["status"] for c in ("gpu.nvlink", "gpu.fabric", "gpu.topology")} == \
            {"gpu.nvlink": "pass", "gpu.fabric": "pass", "gpu.topology": "pass"}
    assert by_host["l40s-01"]["gpu.nvlink"]["status"] == "not_applicable"
    assert by_host["l40s-01"]["gpu.fabric"]["status"] == "not_applicable"
    facts = {h["name"]: h["facts"] for h in report["hosts"]}
    ic = facts["h100-01"]["interconnect"]
    assert facts["h100-01"]["sources"]["interconnect"] == "nvml"
    assert [(g["nvlink"]["up"], g["nvlink"]["total"], g["fabric"]["state"], g["fabric"]["status"]) for g in ic["gpus"]] \
        == [(18, 18, "completed", "success")] * 2
    assert ic["topology"] == [{"gpus": [0, 1], "link": "NV18", "nvlinks": 18}]
    assert {link["version"] for g in ic["gpus"] for link in g["nvlink"]["links"]} == {"4.0"}
    # nvidia-smi, a second source, on the same host: 18 links at speed per GPU, NV18 in the matrix.
    smi = lab.ssh("h100-01", "nvidia-smi nvlink -s; nvidia-smi topo -m").stdout
    assert len(re.findall(r"Link \d+: [\d.]+ GB/s", smi)) == 36 and "NV18" in smi
    l40s = facts["l40s-01"]["interconnect"]
    assert all(not g["nvlink"]["supported"] for g in l40s["gpus"])
    assert l40s["topology"][0]["link"] in ("PIX", "PXB", "PHB", "NODE", "SYS")
    code, hosts = probe(lab)  # the reference every later probe of these hosts is judged against
    assert code == 0, {n: h["health"] for n, h in hosts.items()}
    metrics = {s["metric"] for s in hosts["h100-01"]["probe"]["throughput"]["samples"]}
    assert {"allreduce_busbw_gbs", "p2p_gbs"} <= metrics


def test_each_fault_is_found_by_the_audit_and_fails_the_probe(lab):
    lab.inject("h100-01", "nvlink-down", "--gpu", "1", "--link", "7")
    lab.inject("h100-02", "fabric-stuck")
    lab.inject("h100-03", "nvlink-errors", "--gpu", "0", "--count", "100000")
    _, report = lab.audit()
    by_host = findings(report)
    down = by_host["h100-01"]["gpu.nvlink"]
    assert down["status"] == "fail" and "17 of 18" in down["message"] and "7" in down["message"], down
    assert by_host["h100-01"]["gpu.topology"]["status"] == "fail"  # the pair is NV17 now
    fabric = by_host["h100-02"]["gpu.fabric"]
    assert (fabric["status"], fabric["severity"]) == ("fail", "critical") and "802" in fabric["message"], fabric
    errors = by_host["h100-03"]["gpu.nvlink"]
    assert errors["status"] in ("warn", "fail") and "error" in errors["message"], errors
    assert by_host["l40s-01"]["gpu.nvlink"]["status"] == "not_applicable"
    # The probe, each host against its own first probe: a link down costs the all-reduce ~1/18.
    code, hosts = probe(lab)
    assert code == 1
    status = {n: h["health"]["status"] for n, h in hosts.items()}
    assert status["h100-01"] == "fail" and status["l40s-01"] == "pass", status
    assert "allreduce_busbw_gbs" in " ".join(hosts["h100-01"]["health"]["reasons"])
    assert status["h100-02"] == "fail", hosts["h100-02"]["health"]  # CUDA error 802: nothing runs across the GPUs
    assert "802" in json.dumps(hosts["h100-02"]["probe"]["errors"]) + " ".join(hosts["h100-02"]["health"]["reasons"])
    # A link that trained down with this driver trains down again at every load of it.
    lab.reboot("h100-01")
    assert lab.drift("-l", "h100-01")["h100-01"].get("gpu.nvlink") == "fail"


def test_a_canary_back_with_a_link_down_a_stuck_fabric_or_link_errors_is_rolled_back(lab, tmp_path):
    """h100-04 (a link that trains down under the new driver), h100-05 (a fabric that never completes under it) and
    h100-06 (links counting errors under it, with a baseline that fails over 1000), the canary wave of one campaign:
    each canary is caught by its own verify and rolled back to the exact packages, its links and fabric whole
    again. (One campaign, not one a host: the steps run for the three at once.)"""
    baseline = tmp_path / "baseline.yml"
    baseline.write_text("schema_version: 1\nname: lab-interconnect\ngroups:\n  all:\n"
                        "    driver: {branches: ['550', '570'], held: true}\n"
                        "    interconnect: {nvlink: {errors_fail: 1000}}\n"
                        "    campaign: {fabric_wait_s: 15}\n")  # a stuck fabric is waited for, then judged
    lab.inject("h100-04", "nvlink-down", "--gpu", "0", "--link", "3", "--driver", TO)
    lab.inject("h100-05", "fabric-stuck", "--driver", TO)
    lab.inject("h100-06", "nvlink-errors", "--gpu", "1", "--count", "5000", "--driver", TO)
    cases = {"h100-04": "NVLink links up", "h100-05": "gpu.fabric", "h100-06": "NVLink errors"}
    proc = lab.fleetctl("upgrade", "--to", TO, "-i", lab.inventory, "-l", ",".join(cases), "-b", str(baseline),
                        *UPGRADE, "--waves", "100%", timeout=900)
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-2000:]
    doc = json.loads(lab.fleetctl("campaign", "show", "1", "--format", "json").stdout)
    assert doc["campaign"]["state"] == "rolled_back", doc["campaign"]
    hosts = {h["name"]: h for h in doc["hosts"]}
    assert sorted(hosts) == sorted(cases) and {h["wave"] for h in hosts.values()} == {1}  # all three canaries
    for host, why in cases.items():
        h = hosts[host]
        verify = next(s for s in h["steps"] if s["step"] == "verify")
        assert verify["status"] == "fail" and why in (verify["reason"] or ""), (host, verify)
        assert h["state"] == "rolled_back", h
        facts = lab.facts(host)
        assert facts["driver"]["module_version"] == FROM
        assert all(g["fabric"]["state"] == "completed" and g["nvlink"]["up"] == 18
                   for g in facts["interconnect"]["gpus"]), (host, facts["interconnect"])


def test_a_fabric_manager_not_at_the_driver_version_leaves_the_fabric_unregistered(lab):
    """The fabric manager moved without the driver (here: 570's beside a loaded 550, as a partial upgrade leaves it):
    it refuses to start, the GPUs are never registered, and the audit says so twice: the package version and the
    fabric state (CUDA error 802 for every multi-GPU program)."""
    lab.ssh("h100-03", "apt-mark unhold nvidia-fabricmanager-550 >/dev/null && apt-get install -y -q "
                       "nvidia-fabricmanager-570=570.86.15-0lab1 nvidia-fabricmanager-550- >/dev/null && "
                       "(systemctl restart nvidia-fabricmanager.service || true)")
    by_host = findings(lab.audit("-l", "h100-03")[1])["h100-03"]
    assert by_host["fabricmanager.version"]["status"] == "fail", by_host["fabricmanager.version"]
    fabric = by_host["gpu.fabric"]
    assert (fabric["status"], fabric["severity"]) == ("fail", "critical") and "802" in fabric["message"], fabric
