"""The lab's fleet description on the command line (no root needed to parse it)."""

import pytest

from orchestrator.errors import InputError
from fleetctl_lab.cli import parse_specs
from fleetctl_lab.faults import xid_line


def test_a_mixed_fleet_in_one_command():
    specs, extra = parse_specs(("3xh100-sxm@570.86.15", "1xl40s/2@550.163.01+nouveau+runtime"), 4, "h100-sxm", None, None, ())
    assert [(s.name, s.sku, s.gpus, s.driver, s.nouveau) for s in specs] == [
        ("h100-01", "h100-sxm", None, "570.86.15", False), ("h100-02", "h100-sxm", None, "570.86.15", False),
        ("h100-03", "h100-sxm", None, "570.86.15", False), ("l40s-01", "l40s", 2, "550.163.01", True)]
    assert extra["l40s-01"] == {"runtime"} and extra["h100-01"] == set()


def test_the_uniform_form():
    specs, _ = parse_specs((), 2, "a100-sxm", 4, None, ("persistence-off",))
    assert [(s.name, s.gpus, s.persistence_off) for s in specs] == [("a100-01", 4, True), ("a100-02", 4, True)]


def test_debian_and_rpm_hosts_and_a100_boards_numbered_together():
    specs, _ = parse_specs(("1xa100-sxm@570.86.15+rpm", "2xa100-pcie/1@470.256.02+debian"), 1, "h100-sxm", None, None, ())
    assert [(s.name, s.sku, s.packaging) for s in specs] == [
        ("a100-01", "a100-sxm", "rpm"), ("a100-02", "a100-pcie", "debian"), ("a100-03", "a100-pcie", "debian")]
    uniform, _ = parse_specs((), 1, "a100-pcie", None, "535.216.03", (), packaging="debian")
    assert uniform[0].packaging == "debian"


def test_a_debian_host_holds_everything_at_its_driver_version():
    from fleetctl_lab.debian import held

    installed = {"nvidia-tesla-535-kernel-dkms": "535.216.03-3~deb12u1", "firmware-nvidia-tesla-535-gsp":
                 "535.216.03-3~deb12u1", "nvidia-kernel-common": "20220217+3~deb12u1",
                 "nvidia-modprobe": "535.309.01-0+deb12u1", "dkms": "3.0.10-8+deb12u1"}
    assert held("535.216.03", installed) == ["firmware-nvidia-tesla-535-gsp", "nvidia-tesla-535-kernel-dkms"]


def test_rack_scale_trays_in_nvlink_domains():
    specs, extra = parse_specs(("3xgb200-nvl/4@570.86.15+domain=rack-a", "2xgb200-nvl@570.86.15+rpm+domain=rack-b",
                                "1xh100-sxm/2"), 1, "h100-sxm", None, None, ())
    assert [(s.name, s.sku, s.gpus, s.packaging, s.domain) for s in specs] == [
        ("gb200-01", "gb200-nvl", 4, "deb", "rack-a"), ("gb200-02", "gb200-nvl", 4, "deb", "rack-a"),
        ("gb200-03", "gb200-nvl", 4, "deb", "rack-a"), ("gb200-04", "gb200-nvl", None, "rpm", "rack-b"),
        ("gb200-05", "gb200-nvl", None, "rpm", "rack-b"), ("h100-01", "h100-sxm", 2, "deb", None)]
    assert extra["gb200-01"] == set()


@pytest.mark.parametrize("spec,message", [
    ("2xh100-sxm+domain=rack-a", "h100-sxm is not a rack-scale SKU"),
    ("2xgb200-nvl+domain=Rack_A", "domain name 'Rack_A'"), ("2xgb200-nvl+domain=", "domain name ''"),
    ("2xgb200-nvl+rack=a", "unknown option 'rack'"),
    ("2xa100-pcie+rpm+debian", "exclude each other"),
    ("3xh900", "unknown SKU 'h900'"), ("h100-sxm", "expected COUNTxSKU"), ("2xl40s+melted", "unknown drift 'melted'"),
    ("0xl40s", "at least one host"),
])
def test_bad_specs_are_one_line_errors(spec, message):
    with pytest.raises(InputError, match=message):
        parse_specs((spec,), 1, "h100-sxm", None, None, ())


@pytest.mark.parametrize("form", ["pci", "legacy", "mig", "bare"])
def test_every_planted_xid_form_is_read_back_by_the_collector(form):
    from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_kernel_log import parse_xid

    event = parse_xid(xid_line(79, "00000000:18:00.0", form))
    assert (event["code"], event["pci_bus_id"]) == (79, "00000000:18:00.0")
    assert event["gpu_instance"] == (5 if form == "mig" else None)
    recovery = parse_xid(xid_line(154, "00000000:18:00.0", form))
    if form in ("pci", "mig", "legacy"):
        assert recovery["code"] == 154


def test_fault_inputs_cannot_forge_records_or_keys():
    from fleetctl_lab import faults

    with pytest.raises(InputError, match="one line"):
        faults.kmsg(None, "NVRM: Xid (PCI:0000:18:00): 79, x\n6,999,0,-;forged")
    for bad in ("570.86.15\ninstall_fail=1", "latest", ""):
        with pytest.raises(InputError, match="is not a driver version"):
            faults.check_version(bad)


def test_a_kernel_update_installs_the_next_patch_release():
    from fleetctl_lab.faults import newer_release

    assert newer_release("6.18.44-fc-v782") == "6.18.45-fc-v782"
    assert newer_release("6.1.0") == "6.1.1"
    with pytest.raises(InputError, match="give --release"):
        newer_release("lab-kernel")
