"""Policy evaluation, one planted drift per control, on facts a real H100 host returned.

The healthy host is the device capture (tests/testdata/h100-580.159.04-audit) made compliant where that host
was not (nouveau blacklist, nvidia-persistenced, held packages). Each case changes one fact and asserts that
exactly the expected control changes status: drift is found, and nothing else is reported.
"""

from __future__ import annotations

import copy
import json

import pytest

from orchestrator import controls, schemas

STRICT = {
    "driver": {"branches": ["580"], "versions": ["580.159.04"], "flavor": "open", "held": True},
    "nouveau": {"blacklisted": True, "absent_from_initramfs": True},
    "persistence": {"mode": True, "daemon": True},
    "container_runtime": {"engines": ["containerd"], "nvidia_default": True, "toolkit_min": "1.17.8", "cdi": True},
    "fabric_manager": {"required": "auto"},
    "gpus": {"count": 1, "ecc": True, "mig": False, "max_uncorrectable_remapped_rows": 0, "max_retired_pages": 0,
             "pcie_full_width": True, "max_pcie_replays": 100},
    "workloads": {"cuda": ["12.8", "13.0"]},
    "xid": {"fail_on": "high"},
}


@pytest.fixture(scope="module")
def device_facts(testdata):
    report = json.loads((testdata / "h100-580.159.04-audit" / "audit-nvml.json").read_text())
    return report["hosts"][0]["facts"]


@pytest.fixture
def healthy(device_facts, testdata):
    f = copy.deepcopy(device_facts)
    f["nouveau"].update(blacklisted=True, blacklist_files=["/etc/modprobe.d/blacklist-nouveau.conf"],
                        initramfs="/boot/initrd.img-6.8.0-45-generic", in_initramfs=False)
    f["persistence"].update(daemon_running=True, daemon_enabled=True)
    f["driver"]["packages"] = [
        {"name": n, "version": "580.159.04-0ubuntu1", "manager": "dpkg", "role": "driver", "held": True}
        for n in ("nvidia-driver-580-open", "libnvidia-compute-580", "nvidia-kernel-common-580")
    ] + [{"name": "nvidia-container-toolkit", "version": "1.17.8-1", "manager": "dpkg", "role": "container_toolkit", "held": False}]
    f["driver"]["held"] = True
    engines = {e["name"]: e for e in f["container_runtime"]["engines"]}
    engines["containerd"].update(installed=True, running=True, nvidia_runtime=True, nvidia_default=True,
                                 config_files=["/etc/containerd/config.toml"])
    f["container_runtime"]["toolkit_version"] = "1.17.8-1"
    f["container_runtime"]["cdi_specs"] = [{"path": "/etc/cdi/nvidia.yaml", "driver_version": "580.159.04"}]
    f["host"]["pci_gpus"] = [f["gpus"][0]["pci_bus_id"]]
    # The facts this capture predates, as the same GPU gave them (tests/testdata/h100-580.159.04-health: NVML's
    # replay counter, InfoROM image, no process; no AER files in its VM; nvidia-smi's 480 MiB reserved, 0 MiB used).
    real = json.loads((testdata / "h100-580.159.04-health" / "nvml.json").read_text())[0]
    f["gpus"][0]["pcie"].update(replay_count=real["pcie_replay_counter"], aer=None)
    f["gpus"][0].update(inforom_image=real["inforom_image"],
                        memory={"total_bytes": real["memory_total_bytes"], "reserved_bytes": 480 << 20,
                                "used_bytes": 0, "processes": len(real["compute_processes"])})
    assert schemas.first_error("host-facts", f) is None
    return f


def statuses(facts, pol=STRICT):
    return {x["control"]: x["status"] for x in controls.evaluate(facts, pol)}


def test_the_healthy_real_host_passes_every_control(healthy):
    got = statuses(healthy)
    assert {c for c, s in got.items() if s not in ("pass", "not_applicable")} == set()
    # not applicable on this host: no NVSwitch, and H100s use row remapping, not page retirement; the capture
    # predates facts.interconnect, facts.boot, facts.sxid and facts.infiniband, so the interconnect controls,
    # driver.next_boot, nvswitch.sxid and the InfiniBand ones have nothing to judge (test_policy_interconnect.py,
    # test_next_boot.py, test_fabric_health.py); gpu.firmware_uniform has no other host to compare with; no
    # multi-node NVLink domain: the IMEX and NVLink domain controls (test_policy_imex.py)
    assert {c for c, s in got.items() if s == "not_applicable"} == {"fabricmanager.version", "gpu.retired_pages",
                                                                   "gpu.nvlink", "gpu.fabric", "gpu.topology",
                                                                   "gpudirect.peermem", "driver.next_boot",
                                                                   "gpu.firmware_uniform", "nvswitch.sxid",
                                                                   "ib.ports", "ib.rate", "gpu.fabric_clique",
                                                                   "imex.service", "imex.version", "imex.domain",
                                                                   "nvlink.domain_uniform", "nvlink.domain_declared"}


def test_the_device_host_as_captured_shows_its_real_drift(device_facts):
    got = statuses(device_facts, {**STRICT, "container_runtime": {}})
    drift = {c: s for c, s in got.items() if s in ("fail", "warn", "error")}
    assert drift == {"nouveau.blacklisted": "fail", "persistence.daemon": "fail", "driver.held": "warn"}


# AER counters as the kernel's sysfs files give them (Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats),
# parsed: tests/unit/test_health_checks.py reads the files themselves.
AER_FATAL = {"correctable": {"total": 0, "errors": {}}, "nonfatal": {"total": 0, "errors": {}},
             "fatal": {"total": 1, "errors": {"Surprise Down Error": 1}}}
AER_CORRECTABLE = {"correctable": {"total": 2, "errors": {"Receiver Error": 2}}, "nonfatal": {"total": 0, "errors": {}},
                   "fatal": {"total": 0, "errors": {}}}


def gpu0(f):
    return f["gpus"][0]


# (control id, expected status, change to the healthy facts)
DRIFTS = [
    ("driver.version_allowed", "fail", lambda f: (f["driver"].update(module_version="580.95.05", userspace_version="580.95.05"),
                                                  f["container_runtime"]["cdi_specs"][0].update(driver_version="580.95.05"))),
    ("driver.flavor", "fail", lambda f: f["driver"].update(module_flavor="proprietary")),
    ("driver.held", "fail", lambda f: f["driver"]["packages"][0].update(held=False)),
    ("driver.held", "warn", lambda f: f["driver"].update(packages=[])),
    ("nouveau.not_loaded", "fail", lambda f: f["nouveau"].update(loaded=True)),
    ("nouveau.blacklisted", "fail", lambda f: f["nouveau"].update(blacklisted=False, blacklist_files=[])),
    ("nouveau.initramfs", "fail", lambda f: f["nouveau"].update(in_initramfs=True)),
    ("persistence.mode", "fail", lambda f: gpu0(f).update(persistence_mode=False)),
    ("persistence.daemon", "fail", lambda f: f["persistence"].update(daemon_running=False)),
    ("persistence.daemon", "warn", lambda f: f["persistence"].update(daemon_enabled=False)),
    ({"runtime.nvidia": "fail", "runtime.default": "fail"}, None,
     lambda f: f["container_runtime"]["engines"][1].update(nvidia_runtime=False, nvidia_default=False)),
    ({"runtime.nvidia": "fail", "runtime.default": "fail"}, None,  # docker present too, left unconfigured
     lambda f: f["container_runtime"]["engines"][0].update(installed=True)),
    ("runtime.default", "fail", lambda f: f["container_runtime"]["engines"][1].update(nvidia_default=False)),
    ("runtime.toolkit", "fail", lambda f: f["container_runtime"].update(toolkit_version="1.17.7-1")),
    ("runtime.cdi", "fail", lambda f: f["container_runtime"]["cdi_specs"][0].update(driver_version="570.86.15")),
    ("runtime.cdi", "fail", lambda f: f["container_runtime"].update(cdi_specs=[])),
    ("gpu.count", "fail", lambda f: f["host"].update(pci_gpus=f["host"]["pci_gpus"] + ["00000000:00:07.0"])),
    ("gpu.count", "fail", lambda f: f["gpus"].append({"index": 1, "lost": True})),
    ({"gpu.ecc": "fail", "gpu.ecc_errors": "not_applicable"}, None, lambda f: gpu0(f)["ecc"].update(enabled=False, pending=False, uncorrected_volatile=None,
                                                          uncorrected_aggregate=None)),
    ("gpu.ecc_errors", "fail", lambda f: gpu0(f)["ecc"].update(uncorrected_volatile=2, uncorrected_aggregate=2)),
    ("gpu.ecc_errors", "warn", lambda f: gpu0(f)["ecc"].update(uncorrected_aggregate=3)),
    ("gpu.remapped_rows", "fail", lambda f: gpu0(f)["remapped_rows"].update(pending=True)),
    ("gpu.remapped_rows", "fail", lambda f: gpu0(f)["remapped_rows"].update(failure=True)),
    ("gpu.remapped_rows", "warn", lambda f: gpu0(f)["remapped_rows"].update(uncorrectable=4)),
    ("gpu.retired_pages", "fail", lambda f: gpu0(f).update(retired_pages={"single_bit": 1, "double_bit": 2, "pending": False})),
    ("gpu.mig", "fail", lambda f: gpu0(f).update(mig={"current": True, "pending": True})),
    ("gpu.pcie", "fail", lambda f: gpu0(f)["pcie"].update(width=8)),
    ("gpu.clocks", "warn", lambda f: gpu0(f).update(clock_event_reasons={"mask": 0x48, "active": ["hw_slowdown", "hw_thermal_slowdown"]})),
    ("gpu.recovery_action", "fail", lambda f: gpu0(f).update(recovery_action="Drain and Reset")),
    ("gpu.pcie_errors", "fail", lambda f: gpu0(f)["pcie"].update(aer=AER_FATAL)),
    ("gpu.pcie_errors", "warn", lambda f: gpu0(f)["pcie"].update(aer=AER_CORRECTABLE)),
    ("gpu.pcie_errors", "fail", lambda f: gpu0(f)["pcie"].update(replay_count=101)),
    ("gpu.memory_leak", "fail", lambda f: gpu0(f)["memory"].update(used_bytes=2 << 30)),
    ("driver.cuda_support", "fail", lambda f: f["driver"].update(cuda_driver_version="12.8")),
]


@pytest.mark.parametrize("control,expected,change", DRIFTS, ids=[f"{c}-{s}-{i}" for i, (c, s, _) in enumerate(DRIFTS)])
def test_one_planted_drift_is_found_by_its_control_and_nothing_else(healthy, control, expected, change):
    """A drift changes its own control; where it truly implies another (ECC off: no ECC counts), that one too."""
    before = statuses(healthy)
    change(healthy)
    after = statuses(healthy)
    changed = {c: s for c, s in after.items() if s != before[c]}
    assert changed == (control if isinstance(control, dict) else {control: expected})


def test_driver_states_gate_the_driver_controls(healthy):
    mismatch = copy.deepcopy(healthy)
    mismatch["driver"].update(state="version_mismatch", userspace_version="580.95.05")
    got = statuses(mismatch)
    assert got["driver.version_match"] == "fail"
    assert got["gpu.count"] == "not_applicable"  # NVML refuses to answer in this state

    unloaded = copy.deepcopy(healthy)
    unloaded["driver"].update(state="not_loaded", module_version=None, module_flavor=None)
    unloaded["gpus"] = []
    got = statuses(unloaded)
    assert got["driver.loaded"] == "fail" and got["driver.version_match"] == "not_applicable"
    assert got["driver.installed"] == "pass"

    absent = copy.deepcopy(unloaded)
    absent["driver"].update(state="not_installed", userspace_version=None, packages=[], held=None)
    got = statuses(absent)
    assert got["driver.installed"] == "fail" and got["driver.loaded"] == "not_applicable"


def test_a_branch_outside_the_matrix_fails_even_without_exact_versions(healthy):
    pol = {**STRICT, "driver": {"branches": ["550", "570"]}}
    finding = {x["control"]: x for x in controls.evaluate(healthy, pol)}["driver.version_allowed"]
    assert finding["status"] == "fail" and "branch 580" in finding["message"]
    assert finding["remediation"].startswith("move the host")


def test_xid_severity_threshold_and_classes(healthy):
    events = [
        {"code": 13, "pci_bus_id": "00000000:00:06.0", "gpu_instance": None, "pid": 1, "process": "python3", "message": "x",
         "recovery_action": None, "seq": 10, "uptime_s": 1.0, "raw": "NVRM: Xid (PCI:0000:00:06): 13, pid=1, name=python3, x",
         "name": "Graphics Engine Exception", "class": "application", "severity": "medium", "action": "check", "source": "NVIDIA"},
    ]
    healthy["xid"]["events"] = events
    finding = {x["control"]: x for x in controls.evaluate(healthy, STRICT)}["gpu.xid"]
    assert finding["status"] == "warn" and finding["evidence"]["count"] == 1
    events.append(dict(events[0], code=79, name="GPU has fallen off the bus", severity="critical", **{"class": "critical"}))
    finding = {x["control"]: x for x in controls.evaluate(healthy, STRICT)}["gpu.xid"]
    assert finding["status"] == "fail" and "79 (GPU has fallen off the bus)" in finding["message"]
    lenient = {**STRICT, "xid": {"fail_on": "critical"}}
    events.pop()
    assert statuses(healthy, lenient)["gpu.xid"] == "warn"


def test_unreadable_facts_make_their_controls_error_not_pass(healthy):
    healthy["errors"] = {"gpus[0].ecc": "NVML: Unknown Error"}
    got = statuses(healthy)
    assert {c for c, s in got.items() if s == "error"} == {c.id for c in controls.CONTROLS if "gpus" in c.needs}
    assert got["driver.installed"] == "pass"


def test_baseline_severity_overrides_apply(healthy):
    gpu0(healthy)["pcie"]["width"] = 8
    finding = {x["control"]: x for x in controls.evaluate(healthy, {**STRICT, "severity": {"gpu.pcie": "low"}})}["gpu.pcie"]
    assert finding["severity"] == "low" and finding["status"] == "fail"


def test_every_finding_matches_the_finding_schema(healthy):
    for finding in controls.evaluate(healthy, STRICT):
        assert schemas.first_error("finding", finding) is None, finding


def test_control_ids_are_unique_and_stable():
    ids = [c.id for c in controls.CONTROLS]
    assert len(ids) == len(set(ids))
    # scripts and the history key on these ids: renaming one is a breaking change
    assert {"driver.installed", "driver.version_allowed", "nouveau.not_loaded", "persistence.mode", "runtime.nvidia",
            "fabricmanager.version", "gpu.count", "gpu.xid"} <= set(ids)


def test_fabric_manager_on_an_nvswitch_host(healthy):
    healthy["fabric_manager"].update(nvswitch_present=True, package_version=None, running=False)
    assert statuses(healthy)["fabricmanager.version"] == "fail"
    healthy["fabric_manager"].update(package_version="580.95.05-1", running=True)
    assert statuses(healthy)["fabricmanager.version"] == "fail"  # must equal the driver exactly
    healthy["fabric_manager"].update(package_version="580.159.04-1")
    assert statuses(healthy)["fabricmanager.version"] == "pass"


def test_a_loaded_driver_that_sees_no_gpu_fails_the_count(healthy):
    healthy["gpus"] = []
    finding = {x["control"]: x for x in controls.evaluate(healthy, STRICT)}["gpu.count"]
    assert finding["status"] == "fail" and finding["evidence"] == {"visible": 0, "expected": 1, "on_pci_bus": 1, "lost": []}


def test_a_minor_driver_read_error_does_not_blind_every_driver_control(healthy):
    healthy["errors"] = {"driver.packages": "rpm exited 1: rpmdb open failed"}
    got = statuses(healthy)
    assert {c for c, s in got.items() if s == "error"} == {"driver.held"}


def test_fabric_manager_version_must_match_exactly_not_by_prefix(healthy):
    healthy["driver"].update(module_version="570.86.15", userspace_version="570.86.15", branch="570")
    healthy["fabric_manager"].update(nvswitch_present=True, package_version="570.86.150-1", running=True)
    assert statuses(healthy, {**STRICT, "driver": {}, "container_runtime": {}})["fabricmanager.version"] == "fail"


def test_nvml_failing_as_a_whole_makes_the_gpu_controls_error(healthy):
    healthy["errors"] = {"nvml": "NVML: Unknown Error"}
    healthy["gpus"] = []
    got = statuses(healthy)
    assert got["gpu.count"] == "error" and got["driver.loaded"] == "pass"
