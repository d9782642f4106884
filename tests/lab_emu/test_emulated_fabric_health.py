"""The lab's emulated /sys/class/infiniband and its NVSwitch SXid lines (issue 24), without namespaces: the tree the
lab writes for a host's hardware (fleetctl_lab.kernel.write_infiniband, at each boot and at `lab inject
ib-port-down`) and the kernel log lines of `lab inject sxid`, read by the collection's own parsers
(fleetctl_infiniband, fleetctl_kernel_log) into facts and judged by ib.ports, ib.rate and nvswitch.sxid."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from ansible_collections.fleetctl.gpu.plugins.module_utils import fleetctl_infiniband as ib
from ansible_collections.fleetctl.gpu.plugins.module_utils import fleetctl_kernel_log as klog
from fleetctl_lab import faults, hosts, state
from fleetctl_lab.conf import read_conf
from fleetctl_lab.kernel import ib_boot, write_infiniband
from orchestrator import controls, schemas
from orchestrator.errors import InputError

DATA = Path(__file__).resolve().parents[1] / "testdata"
IB_POLICY = {"interconnect": {"ib": {"ports": 8, "rate": 400}}}


class Host:
    """A lab host's hw/ and kernel/ as `fleetctl lab up` writes them, and the handle `lab inject` works on."""

    def __init__(self, path: Path, sku: str = "h100-sxm"):
        record = SimpleNamespace(name=f"{sku}-01", index=0, spec=state.HostSpec(f"{sku}-01", sku, 2))
        (path / "hw").mkdir(parents=True)
        (path / "kernel").mkdir()
        (path / "hw/gpus.conf").write_text(hosts.gpus_conf(record))
        (path / "kernel/kmsg").write_text("")
        self.dir = path
        self.lab_host = faults.Host.__new__(faults.Host)
        self.lab_host.record = record
        self.lab_host.dir = path
        self.lab_host.gpus_conf = path / "hw/gpus.conf"
        self.lab_host.faults_conf = path / "hw/faults.conf"
        self.lab_host.kmsg = path / "kernel/kmsg"
        self.boot()

    @property
    def sysfs(self) -> Path:
        return self.dir / "kernel/class-infiniband"

    def boot(self) -> None:
        """What the supervisor's boot does to the HCAs (kernel_modules.boot_kernel)."""
        hw = ib_boot(read_conf(self.lab_host.gpus_conf))
        self.lab_host.gpus_conf.write_text("".join(f"{k}={v}\n" for k, v in hw.items()))
        write_infiniband(self.sysfs, hw)

    def facts(self) -> dict:
        """The real 2x H200's facts with this host's infiniband and sxid, as gpu_facts reads them."""
        facts = json.loads((DATA / "h200x2-580.159.04-audit" / "audit-nvml.json").read_text())["hosts"][0]["facts"]
        facts = copy.deepcopy(facts)
        errors: dict = {}
        facts["infiniband"] = ib.read_infiniband(errors, str(self.sysfs))
        facts["sxid"] = {"events": klog.sxid_events(klog.parse_kmsg(self.lab_host.kmsg.read_text()))}
        assert errors == {}
        return facts


def finding(facts: dict, control: str, policy: dict | None = None) -> dict:
    return next(f for f in controls.evaluate(facts, policy or IB_POLICY) if f["control"] == control)


def test_an_hgx_host_has_eight_ndr_ports_in_the_kernels_formats(tmp_path):
    host = Host(tmp_path / "h")
    port = host.sysfs / "mlx5_3/ports/1"
    assert [(port / n).read_text() for n in ("state", "phys_state", "rate", "link_layer")] == \
        ["4: ACTIVE\n", "5: LinkUp\n", "400 Gb/sec (4X NDR)\n", "InfiniBand\n"]
    assert (port / "counters/link_downed").read_text() == "0\n" and (host.sysfs / "mlx5_3/node_type").read_text() == "1: CA\n"
    facts = host.facts()
    assert schemas.first_error("host-facts", facts) is None
    assert [(p["device"], p["port"], p["state"], p["phys_state"], p["rate_gbps"], p["width"], p["speed"])
            for p in facts["infiniband"]["ports"]] == [(f"mlx5_{i}", 1, "ACTIVE", "LinkUp", 400.0, 4, "NDR")
                                                       for i in range(8)]
    assert [finding(facts, c)["status"] for c in ("ib.ports", "ib.rate", "nvswitch.sxid")] == ["pass"] * 3


def test_a_board_without_hcas_has_no_infiniband_class(tmp_path):
    host = Host(tmp_path / "l", sku="l40s")
    assert list(host.sysfs.iterdir()) == [] and host.facts()["infiniband"] is None
    with pytest.raises(InputError, match="has no InfiniBand port"):
        faults.ib_port_down(host.lab_host, 0)
    with pytest.raises(InputError, match="has no NVSwitch"):
        faults.sxid(host.lab_host, 20034)


def test_a_downed_port_reads_down_fails_both_controls_and_stays_down_after_a_boot(tmp_path):
    host = Host(tmp_path / "h")
    assert "mlx5_3 port 1 DOWN" in faults.ib_port_down(host.lab_host, 3)
    port = host.sysfs / "mlx5_3/ports/1"
    assert ((port / "state").read_text(), (port / "phys_state").read_text()) == ("1: DOWN\n", "3: Disabled\n")
    facts = host.facts()
    assert schemas.first_error("host-facts", facts) is None
    down = facts["infiniband"]["ports"][3]
    assert (down["state"], down["state_code"], down["phys_state"], down["counters"]["link_downed"]) == \
        ("DOWN", 1, "Disabled", 1)
    ports, rate = finding(facts, "ib.ports"), finding(facts, "ib.rate")
    assert ports["status"] == "fail" and "7 of 8" in ports["message"] and "mlx5_3 port 1 DOWN" in ports["message"]
    assert rate["status"] == "fail" and "mlx5_3 port 1" in rate["message"]
    host.boot()  # a cable fault survives the reboot; the HCA's counters restart
    after = host.facts()["infiniband"]["ports"][3]
    assert (after["state"], after["counters"]["link_downed"]) == ("DOWN", 0)


def test_a_port_retrained_below_its_rate_fails_ib_rate_only(tmp_path):
    host = Host(tmp_path / "h")
    assert "200 Gb/s (2X NDR)" in faults.ib_port_down(host.lab_host, 5, rate=200)
    assert (host.sysfs / "mlx5_5/ports/1/rate").read_text() == "200 Gb/sec (2X NDR)\n"
    facts = host.facts()
    assert finding(facts, "ib.ports")["status"] == "pass"
    rate = finding(facts, "ib.rate")
    assert rate["status"] == "fail" and "below 400 Gb/s: mlx5_5 port 1 200 Gb/sec (2X NDR)" in rate["message"]
    assert "link_downed 1" in rate["message"]


@pytest.mark.parametrize("port, rate, why", [
    (8, None, "ports 0..7"), (-1, None, "ports 0..7"), (0, 400, "--rate 400"), (0, 300, "--rate 300"),
])
def test_bad_ib_fault_input_plants_nothing(tmp_path, port, rate, why):
    host = Host(tmp_path / "h")
    before = host.lab_host.gpus_conf.read_text()
    with pytest.raises(InputError, match=why.replace(".", r"\.")):
        faults.ib_port_down(host.lab_host, port, rate)
    assert host.lab_host.gpus_conf.read_text() == before


def test_an_injected_fatal_sxid_fails_nvswitch_sxid_naming_code_and_meaning(tmp_path):
    host = Host(tmp_path / "h")
    assert faults.sxid(host.lab_host, 20034, switch=1) == \
        "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"
    events = host.facts()["sxid"]["events"]
    assert [(e["code"], e["device"], e["link"], e["fatal"], e["fatal_from"]) for e in events] == \
        [(20034, "nvswitch1", 48, True, "log")]  # the Severity and Data lines fold into the headline
    f = finding(host.facts(), "nvswitch.sxid")
    assert (f["status"], f["severity"]) == ("fail", "critical")
    assert "20034 (LTSSM fault up" in f["message"] and "nvswitch1 link 48" in f["message"]


def test_a_non_fatal_sxid_and_one_without_a_headline(tmp_path):
    host = Host(tmp_path / "h")
    faults.sxid(host.lab_host, 22013)
    assert finding(host.facts(), "nvswitch.sxid")["status"] == "warn"
    faults.sxid(host.lab_host, 12028, switch=2, fatal=True)  # Severity and Data lines only: the Severity decides
    event = host.facts()["sxid"]["events"][-1]
    assert (event["code"], event["device"], event["message"], event["fatal"]) == (12028, "nvswitch2", None, True)
    assert finding(host.facts(), "nvswitch.sxid")["status"] == "fail"
    with pytest.raises(InputError, match="NVSwitches 0..3, not 4"):
        faults.sxid(host.lab_host, 20034, switch=4)


# ---- through the CLI: `fleetctl lab inject HOST ib-port-down|sxid` -------------------------------------------------

@pytest.fixture
def lab(tmp_path, monkeypatch):
    """One recorded 2x H100 SXM host, hgx-01, its hw/ and kernel/ as `lab up` and its first boot left them."""
    from fleetctl_lab import state
    monkeypatch.setenv("FLEETCTL_LAB_DIR", str(tmp_path))
    monkeypatch.setattr("os.geteuid", lambda: 0)  # `fleetctl lab` insists on root
    spec = state.HostSpec(name="hgx-01", sku="h100-sxm", gpus=2, driver="580.95.05")
    record = state.HostRecord(spec, 0, "10.0.0.2", "fl-hgx-01", "vfl-0")
    Host(tmp_path / "hosts/hgx-01")
    state.save(state.Lab(tmp_path, "flbr0", "10.0.0.1", [record]))
    return tmp_path / "hosts/hgx-01"


def fleetctl(monkeypatch, capsys, *args):
    from orchestrator import cli
    monkeypatch.setattr("sys.argv", ["fleetctl", "lab", "inject", "hgx-01", *args])
    try:
        cli.main()
        code = 0
    except SystemExit as e:
        code = e.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_cli_plants_both_faults(lab, monkeypatch, capsys):
    assert fleetctl(monkeypatch, capsys, "ib-port-down", "--port", "2") == \
        (0, "hgx-01: mlx5_2 port 1 DOWN (Disabled)\n", "")
    assert (lab / "kernel/class-infiniband/mlx5_2/ports/1/state").read_text() == "1: DOWN\n"
    code, out, _ = fleetctl(monkeypatch, capsys, "sxid", "20034", "--switch", "3")
    assert code == 0 and out == "hgx-01: nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 20034, Fatal, Link 48 LTSSM Fault Up\n"
    assert (lab / "kernel/kmsg").read_text().count("SXid (PCI:0000:08:00.0): 20034, ") == 3


@pytest.mark.parametrize("args, message", [
    (("ib-port-down",), "Missing option '--port'"),
    (("ib-port-down", "--port", "8"), "hgx-01 has InfiniBand ports 0..7 (mlx5_N), not 8"),
    (("ib-port-down", "--port", "0", "--rate", "0"), "--rate"),
    (("ib-port-down", "--port", "0", "--rate", "450"), "--rate 450: not a rate below the port's 400 Gb/s"),
    (("sxid", "79"), "79 is not in the range 10000<=x<=99999"),
    (("sxid", "20034", "--switch", "9"), "hgx-01 has NVSwitches 0..3, not 9"),
])
def test_bad_input_is_one_line_exit_2(lab, monkeypatch, capsys, args, message):
    before = (lab / "hw/gpus.conf").read_text(), (lab / "kernel/kmsg").read_text()
    code, out, err = fleetctl(monkeypatch, capsys, *args)
    assert code == 2 and out == "" and message in err and err.count("\n") == 1, err
    assert ((lab / "hw/gpus.conf").read_text(), (lab / "kernel/kmsg").read_text()) == before
