"""A mixed emulated fleet, audited over real SSH exactly as a real one would be, and every lab fault kind.

One lab for the module (brought up through the CLI, torn down in any case); tests run in file order, and each
fault test works on its own host or undoes what it did, so the drift test sees the fleet as planted.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.helpers.lab import fleetctl_lab


pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
COLLECTION = REPO / "collections/ansible_collections/fleetctl/gpu"
BIN = Path(sys.executable).parent

SPECS = ("2xh100-sxm@570.86.15", "1xl40s/2@550.163.01+nouveau+persistence-off+runtime", "1xa100-sxm+nouveau")
PLANTED = {
    "h100-01": {},
    "h100-02": {},
    "l40s-01": {"nouveau.blacklisted": "fail", "persistence.mode": "fail", "persistence.daemon": "fail",
                "runtime.nvidia": "fail"},
    "a100-01": {"driver.installed": "fail", "nouveau.not_loaded": "fail", "nouveau.blacklisted": "fail"},
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with fleetctl_lab(tmp_path_factory.mktemp("fleet"), SPECS) as handle:
        yield handle


def test_every_planted_drift_is_found_with_its_control_and_nothing_else(fleet):
    code, report = fleet.audit()
    assert code == 1
    found = {h["name"]: {f["control"]: f["status"] for f in h["findings"] if f["status"] not in ("pass", "not_applicable")}
             for h in report["hosts"]}
    assert found == PLANTED
    facts = {h["name"]: h["facts"] for h in report["hosts"]}
    # The real pynvml answered through the lab's libnvidia-ml on every host with a driver.
    for name, version, gpus in (("h100-01", "570.86.15", 8), ("l40s-01", "550.163.01", 2)):
        f = facts[name]
        assert f["sources"]["gpus"] == "nvml" and f["driver"]["module_version"] == version
        assert len(f["gpus"]) == gpus == len({g["uuid"] for g in f["gpus"]}) == len(f["host"]["pci_gpus"])
    assert facts["h100-01"]["fabric_manager"]["nvswitch_present"] and facts["h100-01"]["driver"]["cuda_driver_version"] == "12.8"
    assert facts["a100-01"]["driver"]["state"] == "not_installed" and facts["a100-01"]["nouveau"]["loaded"]
    # dpkg's database read from its files; the rpm tool the lab's hosts carry keeps no system database: not asked.
    assert facts["h100-01"]["sources"]["packages"] == "dpkg"
    assert {(p["name"], p["manager"], p["held"]) for p in facts["h100-01"]["driver"]["packages"]
            if p["role"] == "driver"} >= {("nvidia-driver-570-open", "dpkg", True)}


def test_the_collection_built_and_installed_runs_a_plain_playbook_without_fleetctl(fleet, tmp_path):
    """What an Ansible user does: build (or download) the collection, install it, run their own playbook."""
    galaxy = [str(BIN / "ansible-galaxy"), "collection"]
    built = subprocess.run([*galaxy, "build", str(COLLECTION), "--output-path", str(tmp_path)], capture_output=True,
                           text=True, timeout=120)
    assert built.returncode == 0, built.stdout + built.stderr
    (tarball,) = tmp_path.glob("fleetctl-gpu-*.tar.gz")
    installed = subprocess.run([*galaxy, "install", str(tarball), "-p", str(tmp_path / "collections")],
                               capture_output=True, text=True, timeout=120)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    fleet.inject("h100-02", "xid", "79", "--gpu", "1")  # fallen off the bus: critical class
    env = {k: v for k, v in fleet.env.items() if k != "FLEETCTL_HOME"}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(tmp_path / "collections"), ANSIBLE_NOCOLOR="1", PATH=f"{BIN}:/usr/bin:/bin")
    play = subprocess.run([str(BIN / "ansible-playbook"), "-i", fleet.inventory, str(REPO / "examples/gpu-check.yml"),
                           "-e", "expected_driver=570.86.15"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300, stdin=subprocess.DEVNULL)
    out = play.stdout
    fleet.reboot("h100-02")  # clears the planted Xid for the tests after this one
    assert play.returncode == 2, out[-3000:] + play.stderr[-3000:]  # two hosts fail the driver assertion, one the Xid's
    recap = dict(re.findall(r"^(\S+)\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=(\d+)", out, re.M))
    assert recap == {"h100-01": "0", "h100-02": "1", "l40s-01": "1", "a100-01": "1"}, out[-3000:]
    said = dict(re.findall(r'^ok: \[(\S+)\] => \{\s*"msg": "([^"]*)"', out, re.M))
    assert said["h100-01"] == "driver 570.86.15 (loaded), 8 GPUs", said
    assert said["a100-01"] == "driver none (not_installed), 0 GPUs", said
    assert re.search(r'fatal: \[l40s-01\]: FAILED! => .*"msg": "loaded driver 550.163.01, expected 570.86.15"', out)
    probed = re.findall(r"^ok: \[(\S+)\]$", out.split("TASK [Probe GPU health")[1].split("TASK [")[0], re.M)
    assert sorted(probed) == ["h100-01", "h100-02"], out[-3000:]  # on the driver: the others stopped before
    assert re.search(r'fatal: \[h100-02\]: FAILED! => .*"msg": "critical Xid events since boot: \[79\]"', out), out


def test_the_nvidia_smi_fallback_reads_what_nvml_read(fleet):
    through_nvml = fleet.facts("h100-02")["gpus"]
    fleet.ssh("h100-02", "apt-get remove -y -q python3-nvidia-ml-py")
    facts = fleet.facts("h100-02")
    assert facts["sources"]["gpus"] == "nvidia-smi -q -x" and facts["errors"] == {}
    assert facts["gpus"] == through_nvml


def test_an_upgrade_without_reboot_is_a_mismatch_until_the_reboot_loads_it(fleet):
    fleet.ssh("h100-02", "apt-mark unhold nvidia-driver-570-open nvidia-persistenced nvidia-fabricmanager-570 && "
                         "apt-get install -y -q nvidia-driver-570-open=570.124.06-0lab1 nvidia-persistenced=570.124.06-0lab1 "
                         "nvidia-fabricmanager-570=570.124.06-0lab1")
    assert fleet.ssh("h100-02", "nvidia-smi", check=False).returncode == 18
    before = fleet.facts("h100-02")
    assert before["driver"]["state"] == "version_mismatch"
    assert (before["driver"]["module_version"], before["driver"]["userspace_version"]) == ("570.86.15", "570.124.06")
    assert fleet.drift("-l", "h100-02")["h100-02"]["driver.version_match"] == "fail"
    fleet.reboot("h100-02")
    after = fleet.facts("h100-02")
    assert after["host"]["boot_id"] != before["host"]["boot_id"]
    assert (after["driver"]["state"], after["driver"]["module_version"]) == ("loaded", "570.124.06")
    assert fleet.drift("-l", "h100-02")["h100-02"] == {"driver.held": "fail"}  # unheld above, on purpose


def test_xid_in_every_log_form_and_a_raw_line(fleet):
    fleet.inject("h100-01", "xid", "13", "--gpu", "2")
    assert fleet.drift("-l", "h100-01")["h100-01"] == {"gpu.xid": "warn"}  # an application Xid
    for form in ("legacy", "mig", "pci"):
        fleet.inject("h100-01", "xid", "94", "--gpu", "1", "--form", form)
    fleet.inject("h100-01", "xid", "154", "--gpu", "1")
    fleet.inject("h100-01", "kmsg", "NVRM: Xid (PCI:0000:3b:00): 119, pid=2024380, name=nvidia-smi, "
                                    "Timeout after 6s of waiting for RPC response from GPU1 GSP!")
    facts = fleet.facts("h100-01")
    events = facts["xid"]["events"]
    assert [e["code"] for e in events] == [13, 94, 94, 94, 154, 119]
    assert [e["gpu_instance"] for e in events if e["code"] == 94] == [None, 5, None]
    assert events[4]["recovery_action"]["to"] == "Drain and Reset"
    assert facts["gpus"][1]["recovery_action"] == "Drain and Reset"
    drift = fleet.drift("-l", "h100-01")["h100-01"]
    assert drift == {"gpu.xid": "fail", "gpu.recovery_action": "fail"}


def test_memory_faults_and_a_gpu_off_the_bus_then_what_a_reboot_clears(fleet):
    fleet.inject("h100-01", "ecc", "--gpu", "0", "--volatile", "2")
    fleet.inject("h100-01", "remap", "--gpu", "4", "--uncorrectable", "1")
    fleet.inject("h100-01", "fall-off-bus", "--gpu", "7")
    drift = fleet.drift("-l", "h100-01")["h100-01"]
    assert {k: drift[k] for k in ("gpu.ecc_errors", "gpu.remapped_rows", "gpu.count", "gpu.xid")} == \
        {"gpu.ecc_errors": "fail", "gpu.remapped_rows": "fail", "gpu.count": "fail", "gpu.xid": "fail"}
    smi = fleet.ssh("h100-01", "nvidia-smi -L", check=False)
    assert smi.returncode == 15 and smi.stdout.count("GPU ") == 7
    fleet.reboot("h100-01")
    drift = fleet.drift("-l", "h100-01")["h100-01"]
    # The kernel log and the volatile ECC counters start over, the pending remap and the recovery action were
    # done by the reset; the GPU that fell off stays lost, and the lifetime ECC count and the remapped row stay
    # (over the baseline's limit of 0: a warning), as on real hardware.
    assert drift == {"gpu.count": "fail", "gpu.ecc_errors": "warn", "gpu.remapped_rows": "warn"}


def test_nouveau_persistence_and_runtime_faults(fleet):
    fleet.inject("l40s-01", "nouveau")
    fleet.inject("h100-02", "persistence-off")
    fleet.inject("h100-02", "runtime-misconfigured")
    drift = fleet.drift()
    assert drift["l40s-01"]["nouveau.not_loaded"] == "fail"
    assert {k: v for k, v in drift["h100-02"].items() if k != "driver.held"} == \
        {"persistence.mode": "fail", "persistence.daemon": "fail", "runtime.nvidia": "fail"}
    fleet.reboot("h100-02")  # nvidia-persistenced is enabled: it comes back, and persistence mode with it
    drift = fleet.drift("-l", "h100-02")["h100-02"]
    assert "persistence.mode" not in drift and "persistence.daemon" not in drift and drift["runtime.nvidia"] == "fail"


def bench_median(fleet, host: str) -> float:
    out = json.loads(fleet.ssh(host, "nvidia-lab-bench --samples 10").stdout)
    return statistics.median(s["gemm_tflops"] for s in out["samples"] if "gemm_tflops" in s)  # not the interconnect rows


def test_throughput_factor_for_one_driver_version(fleet):
    before = bench_median(fleet, "l40s-01")
    fleet.inject("l40s-01", "throughput", "0.9", "--driver", "550.163.01")
    after = bench_median(fleet, "l40s-01")
    assert after / before == pytest.approx(0.9, abs=0.02)
    fleet.inject("l40s-01", "throughput", "1.0", "--driver", "550.163.01")


def test_install_failure_and_slow_reboot(fleet):
    fleet.inject("l40s-01", "install-failure", "580.95.05")
    proc = fleet.ssh("l40s-01", "apt-mark unhold nvidia-driver-550-open >/dev/null && "
                                "apt-get install -y -q nvidia-driver-580-open=580.95.05-0lab1", check=False)
    assert proc.returncode != 0 and "install_fail" in proc.stdout + proc.stderr
    # apt removed the conflicting 550 package before 580's preinst failed: nothing configured is left, and the
    # old module keeps running until the next boot (the state fleetctl upgrade must catch and roll back).
    status = fleet.ssh("l40s-01", "dpkg-query -W -f='${db:Status-Abbrev}' nvidia-driver-580-open", check=False).stdout
    assert not status.startswith("ii")
    assert fleet.facts("l40s-01")["driver"]["module_version"] == "550.163.01"
    fleet.ssh("l40s-01", "apt-get install -y -q nvidia-driver-550-open=550.163.01-0lab1")  # put it back
    plain = fleet.reboot("l40s-01")
    fleet.inject("l40s-01", "slow-reboot", "8")
    slow = fleet.reboot("l40s-01")
    assert slow >= plain + 6


def test_an_unreachable_host_is_listed_and_the_others_are_audited(fleet):
    fleet.inject("a100-01", "unreachable", "--mode", "link")
    code, report = fleet.audit()
    hosts = {h["name"]: h for h in report["hosts"]}
    assert code == 3 and not hosts["a100-01"]["reachable"] and "pre-flight" in hosts["a100-01"]["error"]
    assert all(hosts[n]["facts"] for n in ("h100-01", "h100-02", "l40s-01"))
    fleet.inject("a100-01", "unreachable", "--restore")
    fleet.inject("a100-01", "unreachable", "--mode", "sshd")
    code, report = fleet.audit("-l", "a100-01")
    assert code == 3 and "cannot connect" in report["hosts"][0]["error"]
    assert fleet.fleetctl("lab", "reboot", "a100-01").returncode == 0  # the power button brings sshd back
    deadline = time.monotonic() + 60
    while fleet.audit("-l", "a100-01")[0] == 3 and time.monotonic() < deadline:
        time.sleep(2)
    assert fleet.audit("-l", "a100-01")[1]["hosts"][0]["reachable"]


def test_status_shows_every_host(fleet):
    out = fleet.fleetctl("lab", "status", "--format", "json")
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert set(rows) == set(PLANTED) and all(r["running"] for r in rows.values())
    assert rows["h100-02"]["module_version"] == "570.124.06" and rows["a100-01"]["module_version"] is None
