"""The node-health checks of issue 24 on real captures: PCIe replays and AER counters (gpu.pcie_errors and the gate),
GPU memory held with no process (gpu.memory_leak and wait_idle's gpu_users), and firmware against the host's inventory
group (gpu.firmware_uniform). The real H100 and 2x H200 (driver 580.159.04) are healthy: each control passes on them;
each planted fault fails its control with a message naming it."""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil
import sys
import types
from pathlib import Path

import pytest

from orchestrator import audit, controls, resources, schemas
from orchestrator.judge import gate
from orchestrator.fleet import runner
from orchestrator.baseline import Baseline
from orchestrator.fleet.inventory import Fleet, Host
from orchestrator.history.store import Store

gpus_utils = resources.module_utils("fleetctl_gpus")
REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def findings(facts, pol=None, peers=None):
    return {f["control"]: f for f in controls.evaluate(facts, pol if pol is not None else {"gpus": {"max_pcie_replays": 100}},
                                                     peers=peers)}


@pytest.fixture(scope="module")
def h100_xml(testdata):
    return (testdata / "h100-580.159.04" / "nvidia-smi-q-x.xml").read_text()


@pytest.fixture(scope="module")
def h100_nvml(testdata):
    return json.loads((testdata / "h100-580.159.04-health" / "nvml.json").read_text())[0]


def facts_with(testdata, report, gpus):
    """A real audit's host facts with the GPUs as this collector reads them (the capture predates the new keys)."""
    facts = copy.deepcopy(json.loads((testdata / report / "audit-nvml.json").read_text())["hosts"][0]["facts"])
    facts["gpus"] = copy.deepcopy(gpus)
    assert schemas.first_error("host-facts", facts) is None
    return facts


@pytest.fixture
def h100(testdata, h100_xml):
    return facts_with(testdata, "h100-580.159.04-audit", gpus_utils.parse_smi_xml(h100_xml)[1])


@pytest.fixture
def h200x2(testdata):
    xml = (testdata / "h200x2-580.159.04" / "nvidia-smi-q-x.xml").read_text()
    return facts_with(testdata, "h200x2-580.159.04-audit", gpus_utils.parse_smi_xml(xml)[1])


# ---- the facts, from nvidia-smi -q -x and from NVML -------------------------------------------------------------

def test_nvidia_smi_reads_the_real_h100_as_nvml_did(h100_xml, h100_nvml):
    gpu = gpus_utils.parse_smi_xml(h100_xml)[1][0]
    assert gpu["pcie"]["replay_count"] == h100_nvml["pcie_replay_counter"] == 0
    assert gpu["inforom_image"] == h100_nvml["inforom_image"] == "G520.0200.00.05"
    assert gpu["vbios"] == h100_nvml["vbios"] == "96.00.DA.00.0C"
    # NVML v1 said 480 MiB used with no process: nvidia-smi (and NVML v2) count it as the driver's reserved memory
    assert h100_nvml["memory_used_bytes"] == 480 * MIB and h100_nvml["compute_processes"] == []
    assert gpu["memory"] == {"total_bytes": 81559 * MIB, "reserved_bytes": 480 * MIB, "used_bytes": 0, "processes": 0}


def test_nvidia_smi_reads_the_real_h200s(h200x2):
    assert [(g["inforom_image"], g["vbios"], g["pcie"]["replay_count"]) for g in h200x2["gpus"]] == \
        [("G520.0282.02.02", "96.00.A5.00.1A", 0)] * 2
    assert {g["memory"]["reserved_bytes"] // MIB for g in h200x2["gpus"]} == {616}
    assert {g["memory"]["used_bytes"] for g in h200x2["gpus"]} == {0}


def test_nvidia_smi_without_a_reserved_line_gives_no_memory_figure(h100_xml):
    """Before R510 nvidia-smi's <used> counted the reserved memory: no figure, rather than a leak on every GPU."""
    old = h100_xml.replace("<reserved>480 MiB</reserved>", "").replace("<used>0 MiB</used>", "<used>480 MiB</used>")
    assert gpus_utils.parse_smi_xml(old)[1][0]["memory"] is None


def test_nvidia_smi_counts_listed_processes(h100_xml):
    proc = ("<process_info><gpu_instance_id>N/A</gpu_instance_id><compute_instance_id>N/A</compute_instance_id>"
            "<pid>4242</pid><type>C</type><process_name>python3</process_name><used_memory>2048 MiB</used_memory>"
            "</process_info>")
    busy = h100_xml.replace("<used>0 MiB</used>", "<used>2048 MiB</used>").replace("<processes>\n\t\t</processes>",
                                                                                    f"<processes>{proc}</processes>")
    memory = gpus_utils.parse_smi_xml(busy)[1][0]["memory"]
    assert memory["processes"] == 1 and memory["used_bytes"] == 2048 * MIB
    assert gpus_utils.leaked_mib(memory) is None  # in use by a process: not a leak


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_nvml(used=0, processes=(), v2=True, memory_error=None):
    """The calls nvml_memory makes, answering with the real H100's figures (tests/testdata/h100-580.159.04-health)."""
    def memory_info(handle, version=None):
        if memory_error:
            raise NVMLError(memory_error)
        assert version == 0x02000028
        return types.SimpleNamespace(total=85520809984, reserved=480 * MIB, free=85520809984 - 480 * MIB - used,
                                     used=used)
    n = types.SimpleNamespace(NVMLError=NVMLError, nvmlDeviceGetMemoryInfo=memory_info,
                              nvmlDeviceGetComputeRunningProcesses=lambda h: [types.SimpleNamespace(pid=p) for p in processes],
                              nvmlDeviceGetGraphicsRunningProcesses=lambda h: [],
                              nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=b"00000000:00:06.0"),
                              nvmlDeviceGetCount=lambda: 1, nvmlDeviceGetHandleByIndex=lambda i: object(),
                              nvmlInit=lambda: None, nvmlShutdown=lambda: None)
    if v2:
        n.nvmlMemory_v2 = 0x02000028  # pynvml's
    return n


def test_nvml_memory_is_the_v2_figures_and_the_process_count():
    pynvml = pytest.importorskip("pynvml")
    assert pynvml.nvmlMemory_v2 == 0x02000028
    errors = {}
    assert gpus_utils.nvml_memory(fake_nvml(), None, errors, "gpus[0].memory") == \
        {"total_bytes": 85520809984, "reserved_bytes": 480 * MIB, "used_bytes": 0, "processes": 0}
    assert gpus_utils.nvml_memory(fake_nvml(v2=False), None, errors, "gpus[0].memory") is None  # v1 only: no figure
    assert errors == {}
    assert gpus_utils.nvml_memory(fake_nvml(memory_error=999), None, errors, "gpus[0].memory") is None
    assert errors == {"gpus[0].memory": "NVML: NVML error 999"}


# ---- PCIe: AER counters and replays ---------------------------------------------------------------------------

def sysfs_with(tmp_path, testdata, case, bdf="0000:00:06.0"):
    dev = tmp_path / "devices" / bdf
    shutil.copytree(testdata / "aer" / case, dev)
    return tmp_path / "devices"


def test_aer_files_as_the_kernel_writes_them(tmp_path, testdata):
    sysfs = sysfs_with(tmp_path, testdata, "surprise-down")
    errors = {}
    aer = gpus_utils.read_aer("00000000:00:06.0", errors, "gpus[0].pcie.aer", str(sysfs))
    assert errors == {}
    assert aer == {"correctable": {"total": 2, "errors": {"Receiver Error": 2, "Bad TLP": 1}},
                   "nonfatal": {"total": 0, "errors": {}},
                   "fatal": {"total": 1, "errors": {"Surprise Down Error": 1}}}


def test_no_aer_files_is_null_not_an_error(tmp_path, testdata):
    """The real H100's VM has no AER files (tests/testdata/h100-580.159.04-health/sysfs.json)."""
    real = json.loads((testdata / "h100-580.159.04-health" / "sysfs.json").read_text())["pci"]["0000:00:06.0"]
    assert {k for k, v in real.items() if "error" in v} == {"aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal"}
    (tmp_path / "0000:00:06.0").mkdir()
    errors = {}
    assert gpus_utils.read_aer("00000000:00:06.0", errors, "gpus[0].pcie.aer", str(tmp_path)) is None
    assert errors == {}


def test_unreadable_or_odd_aer_files_are_errors_entries(tmp_path, testdata, h100):
    sysfs = sysfs_with(tmp_path, testdata, "healthy")
    (sysfs / "0000:00:06.0" / "aer_dev_fatal").unlink()
    (sysfs / "0000:00:06.0" / "aer_dev_fatal").mkdir()  # read() fails: EISDIR
    (sysfs / "0000:00:06.0" / "aer_dev_nonfatal").write_text("\x00\xff garbage\n")
    errors = {}
    aer = gpus_utils.read_aer("00000000:00:06.0", errors, "gpus[0].pcie.aer", str(sysfs))
    assert aer["fatal"] is None and aer["nonfatal"] is None and aer["correctable"] == {"total": 0, "errors": {}}
    assert list(errors) == ["gpus[0].pcie.aer"]
    gpus = [{"index": 0, "pci_bus_id": "00000000:00:06.0", "pcie": {}}]
    gpus_utils.add_aer(gpus, {}, str(sysfs))
    assert gpus[0]["pcie"]["aer"]["correctable"]["total"] == 0
    # and the control that needs them says it could not read them
    h100["errors"] = errors
    got = findings(h100)["gpu.pcie_errors"]
    assert got["status"] == "error" and "gpus[0].pcie.aer: " in got["message"]


def test_pcie_errors_passes_the_real_hosts(h100, h200x2):
    for facts in (h100, h200x2):
        got = findings(facts)["gpu.pcie_errors"]
        assert got["status"] == "pass", got
        assert got["message"] == f"no uncorrectable PCIe errors on {len(facts['gpus'])} GPUs, replays within 100"


def test_a_fatal_aer_error_fails_naming_it(tmp_path, testdata, h100):
    gpus_utils.add_aer(h100["gpus"], h100["errors"], str(sysfs_with(tmp_path, testdata, "surprise-down")))
    assert schemas.first_error("host-facts", h100) is None
    got = findings(h100)["gpu.pcie_errors"]
    assert got["status"] == "fail"
    assert got["message"].startswith("GPU 0 (00000000:00:06.0): 1 fatal uncorrectable PCIe error(s) "
                                     "(AER: Surprise Down Error 1)")
    assert "2 correctable PCIe error(s) (Bad TLP 1, Receiver Error 2)" in got["message"]


def test_replays_over_the_baseline_limit_fail(h100):
    h100["gpus"][0]["pcie"]["replay_count"] = 101
    got = findings(h100)["gpu.pcie_errors"]
    assert got["status"] == "fail" and "101 PCIe replays since its last reset, over the baseline's 100" in got["message"]
    assert findings(h100, {})["gpu.pcie_errors"]["status"] == "pass"  # no limit in the baseline: replays not judged


def probe_of(facts, boot="boot-1", module="580.159.04"):
    return {"schema_version": 1, "collected_at": "2026-11-24T10:00:00Z", "host": {"hostname": "h", "boot_id": boot},
            "driver": {"state": "loaded", "module_version": module},
            "health": {"gpu_count": len(facts["gpus"]), "gpus": copy.deepcopy(facts["gpus"]),
                       "xid": {"since_seq": None, "last_seq": None, "events": []}, "nvml_xid_events": []},
            "throughput": None, "errors": {}, "sources": {}}


def test_the_gate_fails_counters_that_grew_across_the_change(h200x2):
    before, after = probe_of(h200x2), probe_of(h200x2)
    pol = gate.gate_policy({"gpus": {"max_pcie_replays": 100}})
    assert gate.judge_health(before, after, pol).status == "pass"
    after["health"]["gpus"][1]["pcie"]["aer"] = {"correctable": {"total": 3, "errors": {"Receiver Error": 3}},
                                                 "nonfatal": {"total": 1, "errors": {"Completion Timeout": 1}},
                                                 "fatal": {"total": 0, "errors": {}}}
    after["health"]["gpus"][0]["pcie"]["replay_count"] = 150
    assert schemas.first_error("probe-result", after) is None
    verdict = gate.judge_health(before, after, pol)
    assert verdict.status == "fail"
    assert verdict.reasons == ["GPU 0: 150 PCIe replays since the previous probe, over the baseline's 100",
                               "GPU 1: non-fatal PCIe AER errors 0 -> 1",
                               "GPU 1: correctable PCIe AER errors 0 -> 3 (warning)"]
    # counted before the change already (same boot, same driver load): nothing new
    assert gate.judge_health(after, copy.deepcopy(after), pol).status == "pass"
    # after a reboot the kernel's and NVML's counters restarted: what they hold now is new
    again = probe_of(h200x2, boot="boot-2")
    again["health"]["gpus"][1]["pcie"]["aer"] = after["health"]["gpus"][1]["pcie"]["aer"]
    assert gate.judge_health(after, again, pol).reasons[0] == "GPU 1: non-fatal PCIe AER errors 0 -> 1"


# ---- memory held with no process ------------------------------------------------------------------------------

def test_the_real_idle_gpus_hold_no_memory_without_a_process(h100, h200x2):
    assert findings(h100)["gpu.memory_leak"]["status"] == "pass"
    assert findings(h200x2)["gpu.memory_leak"]["message"] == \
        "no GPU holds more than 256 MiB without a process on 2 GPUs"


def test_memory_held_with_no_process_fails(h200x2):
    h200x2["gpus"][1]["memory"]["used_bytes"] = 2048 * MIB
    got = findings(h200x2)["gpu.memory_leak"]
    assert got["status"] == "fail"
    assert got["message"] == "GPU 1 holds 2048 MiB with no process: a leaked context, reset the GPU"
    assert findings(h200x2, {"gpus": {"max_unowned_memory_mib": 4096}})["gpu.memory_leak"]["status"] == "pass"
    h200x2["gpus"][1]["memory"]["processes"] = 1  # a job holds it: in use, not leaked
    assert findings(h200x2)["gpu.memory_leak"]["status"] == "pass"


def test_v1_only_memory_is_not_applicable_not_a_leak(h100):
    h100["gpus"][0]["memory"] = None
    assert findings(h100)["gpu.memory_leak"]["status"] == "not_applicable"


def load_gpu_users():
    path = REPO / "collections/ansible_collections/fleetctl/gpu/plugins/modules/gpu_users.py"
    spec = importlib.util.spec_from_file_location("gpu_users_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_wait_idle_does_not_call_a_leaked_gpu_idle(monkeypatch):
    users = load_gpu_users()
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(used=3 * 1024 * MIB))
    assert users.nvml_users() == ({}, [{"index": 0, "pci_bus_id": "00000000:00:06.0", "used_mib": 3072}], "ok")
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())  # the real idle H100
    assert users.nvml_users() == ({}, [], "ok")


def test_wait_idle_reports_the_leak(monkeypatch):
    from orchestrator.campaign import steps
    leaked = [{"index": 0, "pci_bus_id": "00000000:18:00.0", "used_mib": 2048}]
    outcome = runner.HostOutcome("n1", "failed", "retries exhausted",
                                 {"fleetctl.gpu.gpu_users": {"users": [], "leaked": leaked, "nvml": "ok"}})
    monkeypatch.setattr(steps, "playbook", lambda *a, **k: {"n1": outcome})
    ctx = types.SimpleNamespace(options=types.SimpleNamespace(idle=types.SimpleNamespace(timeout_s=300, poll_s=10)),
                                scheduler=types.SimpleNamespace(busy=lambda ctx, hosts: {}))
    got = steps.wait_idle(ctx, ["n1"])["n1"]
    assert got.outcome == "wait"  # looked at again until --idle-timeout (the engine's), then failed with this reason
    assert got.reason == "GPU 0 holds 2048 MiB with no process: a leaked context, reset the GPU"


# ---- firmware against the inventory group ---------------------------------------------------------------------

def fleet_of(hosts):
    return Fleet("hosts.ini", tuple(Host(n, g) for n, g in hosts), frozenset(g for _, gs in hosts for g in gs), {})


def audit_of(tmp_path, monkeypatch, facts_by_host, groups, base_groups=None):
    fleet = fleet_of([(n, groups[n]) for n in facts_by_host])
    base = Baseline(tmp_path / "b.yml", "b", "sha256:0", base_groups or {"all": {}})
    monkeypatch.setattr(runner.Runner, "run_on_fleet", lambda *a, **k: {
        n: runner.HostOutcome(n, results={"fleetctl.gpu.gpu_facts": {"facts": f}}) for n, f in facts_by_host.items()})
    with Store(tmp_path / "history.sqlite3") as store:
        entries = audit.collect(runner.Runner(), fleet, base, history=store)
    return {e["name"]: {f["control"]: f for f in e["findings"]} for e in entries}


def test_a_host_off_its_groups_firmware_fails_naming_the_majority(tmp_path, monkeypatch, h200x2):
    odd = copy.deepcopy(h200x2)
    odd["gpus"][1]["vbios"] = "96.00.99.00.01"
    hosts = {"h200-a": h200x2, "h200-b": copy.deepcopy(h200x2), "h200-c": odd}
    got = audit_of(tmp_path, monkeypatch, hosts, {n: ("all", "h200") for n in hosts})
    assert got["h200-c"]["gpu.firmware_uniform"]["status"] == "fail"
    assert got["h200-c"]["gpu.firmware_uniform"]["message"] == \
        "GPU 1: VBIOS 96.00.99.00.01, the group h200's NVIDIA H200 GPUs run 96.00.A5.00.1A (5 of 6)"
    assert got["h200-a"]["gpu.firmware_uniform"]["status"] == "pass"
    assert got["h200-a"]["gpu.firmware_uniform"]["message"] == \
        "VBIOS 96.00.A5.00.1A and InfoROM G520.0282.02.02 as on the group h200's other hosts"


def test_hosts_are_compared_within_their_own_group(tmp_path, monkeypatch, h200x2):
    """Two groups, each uniform in itself: no finding, though the fleet runs two VBIOS versions."""
    other = copy.deepcopy(h200x2)
    for g in other["gpus"]:
        g["vbios"] = "96.00.99.00.01"
    hosts = {"a1": h200x2, "a2": copy.deepcopy(h200x2), "b1": other, "b2": copy.deepcopy(other)}
    groups = {"a1": ("all", "rack_a"), "a2": ("all", "rack_a"), "b1": ("all", "rack_b"), "b2": ("all", "rack_b")}
    got = audit_of(tmp_path, monkeypatch, hosts, groups)
    assert {n: got[n]["gpu.firmware_uniform"]["status"] for n in hosts} == dict.fromkeys(hosts, "pass")


def test_no_majority_warns_and_a_lone_host_has_nothing_to_compare(tmp_path, monkeypatch, h200x2, h100):
    other = copy.deepcopy(h200x2)
    for g in other["gpus"]:
        g["inforom_image"] = "G520.0282.00.01"
    got = audit_of(tmp_path, monkeypatch, {"a": h200x2, "b": other, "c": h100}, dict.fromkeys("abc", ("all",)))
    assert got["a"]["gpu.firmware_uniform"]["status"] == "warn"
    assert "no majority version (G520.0282.00.01 on 2, G520.0282.02.02 on 2)" in got["a"]["gpu.firmware_uniform"]["message"]
    assert got["c"]["gpu.firmware_uniform"]["status"] == "not_applicable"  # the only H100


def test_the_baseline_pins_vbios(h100):
    got = findings(h100, {"gpus": {"vbios": ["96.00.DA.00.0D"]}})["gpu.firmware_uniform"]
    assert got["status"] == "fail"
    assert got["message"] == "GPU 0: VBIOS 96.00.DA.00.0C is not one the baseline allows (96.00.DA.00.0D)"
    assert findings(h100, {"gpus": {"vbios": ["96.00.DA.00.0C"]}})["gpu.firmware_uniform"]["status"] == "pass"


def test_the_verify_leaves_the_group_comparison_to_the_audit():
    """Which hosts reach the verify (the wave, less those that failed) is no property of the change: a firmware
    finding that appears because fewer hosts were collected together does not fail the host."""
    from orchestrator.campaign import steps
    entry = {"findings": [{"control": "gpu.firmware_uniform", "status": "fail", "message": "GPU 0: VBIOS ..."},
                          {"control": "gpu.memory_leak", "status": "fail", "message": "GPU 0 holds 2048 MiB ..."}]}
    before = {"findings": {"gpu.firmware_uniform": "pass", "gpu.memory_leak": "pass"}}
    assert steps.changed_controls(entry, before) == ["gpu.memory_leak: GPU 0 holds 2048 MiB ... (it was pass at the "
                                                     "pre-check)"]


# ---- the real H200 end to end (tests/testdata/h200-580.159.04-health: scripts/device-health-proof.sh) ----------

def test_a_real_cuda_context_is_a_process_and_no_leak(testdata):
    """nvidia-smi -q -x while a process held a bare CUDA context: one process, 612 MiB by its own figure, the GPU's
    used memory over 256 MiB but owned: gpu.memory_leak must not call it a leak, and NVML saw the same process."""
    d = testdata / "h200-580.159.04-health"
    gpu = gpus_utils.parse_smi_xml((d / "nvidia-smi-q-x-context.xml").read_text())[1][0]
    nvml = json.loads((d / "nvml-context.json").read_text())[0]
    assert gpu["memory"]["processes"] == len(nvml["compute_processes"]) == 1
    assert gpu["memory"]["used_bytes"] > 256 * MIB and nvml["compute_processes"][0]["used"] // MIB == 612
    assert gpus_utils.leaked_mib(gpu["memory"]) is None
    idle = gpus_utils.parse_smi_xml((d / "nvidia-smi-q-x.xml").read_text())[1][0]
    assert idle["memory"]["used_bytes"] == 0 and idle["memory"]["processes"] == 0


@pytest.mark.parametrize("report", ["audit-nvml.json", "audit-smi.json", "audit-context.json"])
def test_the_real_h200_audits_read_the_new_facts_and_pass_the_new_controls(testdata, report):
    host = json.loads((testdata / "h200-580.159.04-health" / report).read_text())["hosts"][0]
    facts = host["facts"]
    assert schemas.first_error("host-facts", facts) is None
    (gpu,) = facts["gpus"]
    assert (gpu["pcie"]["replay_count"], gpu["pcie"]["aer"], gpu["inforom_image"]) == (0, None, "G520.0282.02.02")
    assert facts["sxid"] == {"events": []} and facts["infiniband"] is None
    recorded = {f["control"]: f["status"] for f in host["findings"]}
    assert recorded["gpu.pcie_errors"] == recorded["gpu.memory_leak"] == "pass"
    again = findings(facts, {"gpus": {"max_pcie_replays": 100}})
    assert again["gpu.pcie_errors"]["status"] == again["gpu.memory_leak"]["status"] == "pass"
