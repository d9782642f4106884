"""Upgrades and rollbacks on Debian's own NVIDIA packages (`+debian` lab hosts, lab/fleetctl_lab/debian.py): real
nvidia-tesla-470-*, nvidia-tesla-535-* and unversioned nvidia-* packages from bookworm, installed by real apt and
dpkg with their real maintainer scripts (dkms, update-alternatives), one lab for the whole path:
470.256.02 -> 535.216.03 (a branch change across Debian's tesla sources) -> 535.261.03 (the unversioned source),
which fails on one host on a real unmet dependency and rolls the other back to the exact packages it had."""

from __future__ import annotations

import json
import subprocess

import pytest
from tests.helpers.lab import ANSIBLE, REPO_ROOT, fleetctl_lab


pytestmark = pytest.mark.lab
COLLECTIONS = REPO_ROOT / "collections"

TESLA_470 = {"nvidia-tesla-470-kernel-dkms", "libnvidia-tesla-470-ml1", "nvidia-tesla-470-smi",
             "nvidia-tesla-470-alternative", "nvidia-tesla-470-kernel-support"}
TESLA_535 = {"nvidia-tesla-535-kernel-dkms", "libnvidia-tesla-535-ml1", "nvidia-tesla-535-smi",
             "nvidia-tesla-535-alternative", "nvidia-tesla-535-kernel-support", "firmware-nvidia-tesla-535-gsp"}
UNVERSIONED = {"nvidia-kernel-dkms", "libnvidia-ml1", "nvidia-smi", "nvidia-alternative", "nvidia-kernel-support",
               "firmware-nvidia-gsp"}


def packages(fleet, host: str) -> dict[str, tuple[str, str]]:
    """name -> (dpkg status abbreviation, version) of every package dpkg knows (removed ones with conffiles too)."""
    out = fleet.ssh(host, "dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\n'").stdout
    rows = [line.split("\t") for line in out.splitlines() if line.count("\t") == 2]
    return {name: (status.strip(), version) for status, name, version in rows if not status.startswith("un")}


def driver_state(fleet, host: str) -> tuple[str, str]:
    """(loaded module version, dkms status) of HOST."""
    module = fleet.ssh(host, "cat /sys/module/nvidia/version").stdout.strip()
    return module, fleet.ssh(host, "dkms status").stdout.strip()


def held_at(pkgs: dict[str, tuple[str, str]], names: set[str], version: str) -> dict[str, tuple[str, str]]:
    """The NAMES of PKGS that are not installed, held and at VERSION (upstream), with what they are instead."""
    return {n: pkgs.get(n, ("absent", "")) for n in names
            if pkgs.get(n, ("", ""))[0] != "hi" or not pkgs[n][1].startswith(version + "-")}


@pytest.fixture(scope="module")
def debian_fleet(tmp_path_factory):
    with fleetctl_lab(tmp_path_factory.mktemp("debian"), ("2xa100-pcie/1@470.256.02+debian",)) as fleet:
        yield fleet


def test_hosts_run_debian_470_from_the_real_packages(debian_fleet):
    fleet = debian_fleet
    pkgs = packages(fleet, "a100-01")
    assert held_at(pkgs, TESLA_470, "470.256.02") == {}
    assert pkgs["nvidia-tesla-470-kernel-dkms"][1] == "470.256.02-1~deb12u1"
    assert driver_state(fleet, "a100-01") == ("470.256.02", "nvidia-tesla-470/470.256.02: added")
    # Debian's alternatives point libnvidia-ml.so.1 at the branch's library; the lab's NVML answers for it.
    real = fleet.ssh("a100-01", "readlink -f /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").stdout.strip()
    assert real == "/usr/lib/x86_64-linux-gnu/nvidia/tesla-470/libnvidia-ml.so.470.256.02"
    facts = fleet.facts("a100-01")["driver"]
    assert (facts["state"], facts["module_version"], facts["userspace_version"]) == ("loaded", "470.256.02", "470.256.02")
    assert facts["module_flavor"] == "proprietary" and facts["held"] is True
    roles = {p["name"]: p["role"] for p in facts["packages"]}
    assert {n for n, r in roles.items() if r == "driver"} >= TESLA_470
    drift = fleet.drift()["a100-01"]
    assert drift.get("driver.version_allowed") == "fail"  # 470 is not a blessed branch of the default baseline
    assert "driver.held" not in drift  # nvidia-kernel-common and nvidia-modprobe keep their own versions


def test_branch_change_to_535_removes_every_470_package(debian_fleet):
    fleet = debian_fleet
    proc = fleet.fleetctl("upgrade", "-i", fleet.inventory, "--to", "535.216.03", "--waves", "1,100%", "--soak", "0",
                          "--yes", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for host in ("a100-01", "a100-02"):
        pkgs = packages(fleet, host)
        assert held_at(pkgs, TESLA_535, "535.216.03") == {}, host
        assert not [n for n in pkgs if "tesla-470" in n], (host, pkgs)  # purged: not even conffiles ("rc")
        assert driver_state(fleet, host) == ("535.216.03", "nvidia-tesla-535/535.216.03: added")
    drift = fleet.drift()
    assert all("driver.version_allowed" not in d and "driver.held" not in d for d in drift.values()), drift


def test_unmet_dependency_fails_its_host_and_the_campaign_rolls_back_to_the_exact_packages(debian_fleet):
    """535.216.03 -> 535.261.03 moves from Debian's tesla-535 source to the unversioned one. a100-02's apt may not
    install nvidia-legacy-check (an operator's pin), which nvidia-alternative pre-depends on: its install fails in
    the second wave, and the canary, already on 535.261.03, goes back to exactly the packages it had."""
    fleet = debian_fleet
    before = packages(fleet, "a100-01")
    fleet.ssh("a100-02", "printf 'Package: nvidia-legacy-check\\nPin: release *\\nPin-Priority: -1\\n' "
                         "> /etc/apt/preferences.d/no-legacy-check")
    untouched = packages(fleet, "a100-02")
    proc = fleet.fleetctl("upgrade", "-i", fleet.inventory, "--to", "535.261.03", "--waves", "1,100%", "--soak", "0",
                          "--yes", timeout=900)
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "a100-02" in proc.stdout and "nvidia-legacy-check" in proc.stdout, proc.stdout[-2000:]

    assert packages(fleet, "a100-02") == untouched
    assert driver_state(fleet, "a100-02")[0] == "535.216.03"

    after = packages(fleet, "a100-01")
    driver = lambda pkgs: {n: v for n, v in pkgs.items() if n in TESLA_535 | UNVERSIONED}  # noqa: E731
    assert driver(after) == driver(before)  # every real package back at its recorded version, held
    assert not [n for n in after if n in UNVERSIONED], after  # nothing of the unversioned source, not even "rc"
    assert driver_state(fleet, "a100-01") == ("535.216.03", "nvidia-tesla-535/535.216.03: added")


def test_a_version_in_no_repository_is_one_line_naming_the_package_and_changes_nothing(debian_fleet):
    fleet = debian_fleet
    before = packages(fleet, "a100-01")
    env = dict(fleet.env, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS))
    proc = subprocess.run([str(ANSIBLE), "-i", fleet.inventory, "a100-01", "-m", "fleetctl.gpu.nvidia_driver_packages", "-a",
                           json.dumps({"packages": {"nvidia-tesla-535-kernel-dkms": "535.999.99"}})],
                          capture_output=True, text=True, env=env, timeout=180, cwd=fleet.workdir,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "no package version in the configured repositories for: nvidia-tesla-535-kernel-dkms=535.999.99" \
        in proc.stdout, proc.stdout[-2000:]
    assert packages(fleet, "a100-01") == before


def test_a_kernel_update_without_the_module_is_critical_drift_before_the_reboot_that_loses_the_driver(debian_fleet):
    """The classic outage after an unattended kernel update: DKMS built nothing for the new kernel (no headers; the
    real dkms says "added"), the audit says so while the old kernel still runs, and the reboot comes up without
    the driver. Removing the kernel brings the driver back at the next boot."""
    fleet = debian_fleet
    said = fleet.inject("a100-02", "kernel-update")
    new = said.split("kernel ", 1)[1].split()[0]
    finding = lambda: next(f for f in fleet.audit("-l", "a100-02")[1]["hosts"][0]["findings"]  # noqa: E731
                           if f["control"] == "driver.next_boot")
    before = finding()
    assert (before["status"], before["severity"]) == ("fail", "critical"), before
    assert f"the host boots {new} next (newest) and no nvidia module is installed for it" in before["message"]
    assert driver_state(fleet, "a100-02")[0] == "535.216.03"  # still running: nothing else says so yet

    fleet.reboot("a100-02")
    assert fleet.ssh("a100-02", "test -e /sys/module/nvidia/version", check=False).returncode == 1
    assert f"Linux version {new}" in fleet.ssh("a100-02", "head -c 300 /dev/kmsg").stdout
    drift = fleet.drift("-l", "a100-02")["a100-02"]
    assert drift["driver.loaded"] == "fail" and drift["driver.next_boot"] == "fail", drift

    fleet.inject("a100-02", "kernel-update", "--restore")
    fleet.reboot("a100-02")
    assert driver_state(fleet, "a100-02")[0] == "535.216.03"
    assert finding()["status"] == "not_applicable"  # no kernel image under /boot again
