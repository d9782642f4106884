"""An Enterprise-Linux-style lab host (`+rpm`): the driver set installed by the real dnf from the lab's rpm
repository, held by the real dnf versionlock plugin, no apt; audited over real SSH like any other host.

One host for the module (brought up through the CLI, torn down in any case); tests run in file order.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers.lab import fleetctl_lab


pytestmark = pytest.mark.lab

DRIVER = "550.163.01"
HOST = "h100-01"
HELD = ("nvidia-driver", "nvidia-persistenced", "nvidia-fabric-manager")  # h100-sxm: NVSwitch, fabric manager
RPM_QA = "rpm -qa --qf '%{NAME} %{EPOCH}:%{VERSION}-%{RELEASE}\\n' | sort"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with fleetctl_lab(tmp_path_factory.mktemp("rpm"), (f"1xh100-sxm/2@{DRIVER}+rpm",)) as handle:
        yield handle


def installed(fleet) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in fleet.ssh(HOST, RPM_QA).stdout.splitlines())


def test_the_driver_set_is_installed_by_dnf(fleet):
    rpms = installed(fleet)
    for name in HELD:
        assert rpms[name] == f"3:{DRIVER}-0lab1"
    assert {"python3-nvidia-ml-py", "containerd", "nvidia-container-toolkit", "fleetctl-lab-system"} <= set(rpms)
    assert fleet.ssh(HOST, "dpkg-query -W 'nvidia*' 2>/dev/null | wc -l").stdout.strip() == "0"
    assert fleet.ssh(HOST, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.split() == [DRIVER] * 2


def test_the_driver_set_is_held_by_dnf_versionlock(fleet):
    listed = fleet.ssh(HOST, "dnf -q versionlock list").stdout.split()
    assert sorted(listed) == sorted(f"{name}-3:{DRIVER}-0lab1.*" for name in HELD)
    assert set(listed) <= set(fleet.ssh(HOST, "cat /etc/dnf/plugins/versionlock.list").stdout.split())


def test_apt_is_gone_from_the_host_only(fleet):
    assert fleet.ssh(HOST, "command -v apt-get apt apt-cache apt-mark", check=False).stdout == ""
    assert fleet.ssh(HOST, "command -v dnf rpm dpkg").stdout.split() == ["/usr/bin/dnf", "/usr/bin/rpm", "/usr/bin/dpkg"]
    assert Path("/usr/bin/apt-get").exists() and Path("/usr/bin/apt-mark").exists()  # the machine's own


def test_a_fresh_rpm_host_audits_clean_with_the_driver_held(fleet):
    code, report = fleet.audit()
    (host,) = report["hosts"]
    assert {f["control"]: f["status"] for f in host["findings"] if f["status"] not in ("pass", "not_applicable")} == {}
    assert code == 0
    assert {f["control"]: f["status"] for f in host["findings"]}["driver.held"] == "pass"
    assert host["facts"]["driver"]["packages"] and all(p["manager"] == "rpm" for p in host["facts"]["driver"]["packages"])
    assert host["facts"]["sources"]["packages"] == "dpkg+rpm"  # dpkg stays on the lab's rpm host, with no package


def test_the_versionlock_blocks_an_upgrade(fleet):
    proc = fleet.ssh(HOST, "dnf -y install nvidia-driver-570.86.15", check=False)
    assert proc.returncode == 1
    assert "filtered out by exclude filtering" in proc.stdout + proc.stderr
    assert installed(fleet)["nvidia-driver"] == f"3:{DRIVER}-0lab1"


def test_a_reboot_keeps_packages_locks_and_the_missing_apt(fleet):
    before = installed(fleet), fleet.ssh(HOST, "cat /etc/dnf/plugins/versionlock.list").stdout
    boot_id = fleet.ssh(HOST, "cat /proc/sys/kernel/random/boot_id").stdout
    fleet.reboot(HOST)
    assert fleet.ssh(HOST, "cat /proc/sys/kernel/random/boot_id").stdout != boot_id
    assert (installed(fleet), fleet.ssh(HOST, "cat /etc/dnf/plugins/versionlock.list").stdout) == before
    assert fleet.ssh(HOST, "command -v apt-get", check=False).returncode != 0
    assert fleet.ssh(HOST, "cat /sys/module/nvidia/version").stdout.strip() == DRIVER
    code, _ = fleet.audit()
    assert code == 0


def test_a_dnf_upgrade_loads_at_the_next_boot(fleet):
    fleet.ssh(HOST, "dnf -q versionlock delete nvidia-driver nvidia-persistenced nvidia-fabric-manager")
    fleet.ssh(HOST, "dnf -y install nvidia-driver-570.86.15 nvidia-persistenced-570.86.15 "
                    "nvidia-fabric-manager-570.86.15")
    assert installed(fleet)["nvidia-driver"] == "3:570.86.15-0lab1"
    assert "version mismatch" in fleet.ssh(HOST, "nvidia-smi", check=False).stdout
    fleet.reboot(HOST)
    assert fleet.ssh(HOST, "cat /sys/module/nvidia/version").stdout.strip() == "570.86.15"
    assert fleet.ssh(HOST, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.split() == ["570.86.15"] * 2
