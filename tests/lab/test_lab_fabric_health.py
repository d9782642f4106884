"""NVSwitch SXids and InfiniBand ports in the lab, end to end (issue 24): two 2-GPU H100 HGX hosts with their eight
emulated NDR HCAs; `lab inject` downs an InfiniBand port on one and logs a fatal SXid on the other, and one
`fleetctl audit` against a baseline asking for 8 ports at 400 Gb/s fails each host on its own fault only."""

from __future__ import annotations

import pytest
from tests.helpers.lab import fleetctl_lab


pytestmark = pytest.mark.lab


def test_a_downed_ib_port_and_a_fatal_sxid_fail_the_audit_on_their_host_only(tmp_path):
    baseline = tmp_path / "baseline.yml"
    baseline.write_text("schema_version: 1\nname: lab-fabric-health\ngroups:\n  all:\n"
                        "    interconnect: {ib: {ports: 8, rate: 400}}\n")
    with fleetctl_lab(tmp_path, ("2xh100-sxm/2@570.86.15",)) as lab:
        assert "mlx5_3 port 1 DOWN" in lab.inject("h100-01", "ib-port-down", "--port", "3")
        assert "20034, Fatal, Link 48 LTSSM Fault Up" in lab.inject("h100-02", "sxid", "20034", "--switch", "1")
        code, report = lab.audit("-b", str(baseline))
    assert code == 1
    by_host = {h["name"]: {f["control"]: f for f in h["findings"]} for h in report["hosts"]}
    # h100-01: 7 of its 8 ports active, the one down named by both InfiniBand controls; no SXid
    ports, rate = by_host["h100-01"]["ib.ports"], by_host["h100-01"]["ib.rate"]
    assert ports["status"] == "fail" and "7 of 8" in ports["message"], ports
    assert "mlx5_3 port 1 DOWN (Disabled)" in ports["message"], ports
    assert rate["status"] == "fail" and "down: mlx5_3 port 1 DOWN (Disabled)" in rate["message"], rate
    assert by_host["h100-01"]["nvswitch.sxid"]["status"] == "pass", by_host["h100-01"]["nvswitch.sxid"]
    # h100-02: the fatal SXid, by code, meaning, switch and link; its InfiniBand whole
    sxid = by_host["h100-02"]["nvswitch.sxid"]
    assert (sxid["status"], sxid["severity"]) == ("fail", "critical"), sxid
    assert "20034 (LTSSM fault up: the link went down from active) on nvswitch1 link 48" in sxid["message"], sxid
    assert [by_host["h100-02"][c]["status"] for c in ("ib.ports", "ib.rate")] == ["pass", "pass"]
