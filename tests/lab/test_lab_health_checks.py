"""The node-health checks of issue 24 on an emulated fleet: three hosts of one SKU (one inventory group), a PCIe
fault, a leaked context and another VBIOS planted on different hosts through `fleetctl lab inject`, one audit over
real SSH: each control fails on its host with a message naming the fault and passes on the others."""

from __future__ import annotations

import pytest
from tests.helpers.lab import fleetctl_lab


pytestmark = pytest.mark.lab

HOSTS = ("h100-01", "h100-02", "h100-03")


def test_pcie_errors_a_leaked_context_and_odd_firmware_each_fail_their_host(tmp_path_factory):
    with fleetctl_lab(tmp_path_factory.mktemp("health"), ("3xh100-sxm/1@570.86.15",)) as fleet:
        fleet.inject("h100-01", "pcie-errors", "--fatal", "1", "--replays", "150")
        fleet.inject("h100-02", "leaked-memory", "--mib", "2048")
        fleet.inject("h100-03", "vbios", "96.00.99.00.02")
        code, report = fleet.audit()
    assert code == 1
    got = {h["name"]: {f["control"]: f for f in h["findings"]} for h in report["hosts"]}
    faulty = {"gpu.pcie_errors": "h100-01", "gpu.memory_leak": "h100-02", "gpu.firmware_uniform": "h100-03"}
    assert {c: [n for n in HOSTS if got[n][c]["status"] != "pass"] for c in faulty} == \
        {c: [host] for c, host in faulty.items()}
    assert {c: got[host][c]["status"] for c, host in faulty.items()} == dict.fromkeys(faulty, "fail")
    pcie = got["h100-01"]["gpu.pcie_errors"]["message"]
    assert "1 fatal uncorrectable PCIe error(s) (AER: Surprise Down Error 1)" in pcie
    assert "150 PCIe replays since its last reset, over the baseline's 100" in pcie
    assert got["h100-02"]["gpu.memory_leak"]["message"] == \
        "GPU 0 holds 2048 MiB with no process: a leaked context, reset the GPU"
    assert got["h100-03"]["gpu.firmware_uniform"]["message"] == \
        "GPU 0: VBIOS 96.00.99.00.02, the group h100_sxm's NVIDIA H100 80GB HBM3 GPUs run 96.00.99.00.01 (2 of 3)"
    # nothing else drifted: the faults show in their own controls only
    assert {n: sorted(c for c, f in got[n].items() if f["status"] in ("fail", "warn", "error")) for n in HOSTS} == \
        {host: [c] for c, host in faulty.items()}
