"""The lab's emulated NVIDIA driver packages (lab/fleetctl_lab/packages.py, lab/fleetctl_lab/emu/), without namespaces.

The repository is built into a temporary directory; packages are unpacked with dpkg-deb -x into fake roots, and
the real pynvml (from the python3-nvidia-ml-py package), nvidia-smi and the other tools run against them in
subprocesses with NVIDIA_LAB_ROOT pointing at the root.
"""
import json
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from ansible_collections.fleetctl.gpu.plugins.module_utils import fleetctl_gpus
from ansible_collections.fleetctl.gpu.plugins.module_utils.fleetctl_gpus import parse_smi_xml
from fleetctl_lab import packages
from fleetctl_lab.skus import SKUS, host_copy_gbs
from tests.helpers.emu import LIB, MISSING, REPO, deb, dpkg_deb, env_for, set_loaded

TESTDATA = REPO / "tests" / "testdata"
pytestmark = pytest.mark.skipif(bool(MISSING), reason="building the lab packages needs %s" % ", ".join(MISSING))

# Two H100s with values away from the defaults; gpu 1 may be lost.
GPUS_CONF = """\
# lab hardware
sku=h100-sxm
count=2
gpu.0.name=NVIDIA H100 80GB HBM3
gpu.0.uuid=GPU-4da776c0-2c08-62ff-bf1f-3a5ac46e878a
gpu.0.serial=1652822000001
gpu.0.pci=00000000:9b:00.0
gpu.0.vbios=96.00.99.00.01
gpu.0.persistence=1
gpu.0.ecc=1
gpu.0.ecc_pending=1
gpu.0.ecc_unc_volatile=2
gpu.0.ecc_unc_aggregate=5
gpu.0.remap_corr=1
gpu.0.remap_unc=3
gpu.0.remap_pending=1
gpu.0.remap_failure=0
gpu.0.mig=0
gpu.0.pcie_gen=4
gpu.0.pcie_gen_max=5
gpu.0.pcie_width=8
gpu.0.pcie_width_max=16
gpu.0.temp=41
gpu.0.power_mw=123400
gpu.0.clock_events=0x48        # hw slowdown + hw thermal slowdown
gpu.0.recovery_action=2        # Reboot
gpu.0.lost=0
gpu.0.inforom=G520.0200.00.05
gpu.0.pcie_replays=7
gpu.1.name=NVIDIA H100 80GB HBM3
gpu.1.uuid=GPU-0a3c1f52-7e45-4b7e-a0a1-3c2b1d4e5f60
gpu.1.serial=1652822000002
gpu.1.pci=00000000:18:00.0
gpu.1.vbios=96.00.99.00.01
gpu.1.persistence=0
gpu.1.ecc=0
gpu.1.ecc_pending=1
gpu.1.mig=1
gpu.1.temp=30
gpu.1.power_mw=71000
gpu.1.clock_events=1
gpu.1.recovery_action=0
gpu.1.lost={lost}
gpu.1.mem_used_mib=300         # held with no process: a leaked context
"""


@pytest.fixture
def make_host(repo, tmp_path):
    """make_host(version, loaded=version, lost=0): a fake root with that driver and pynvml unpacked, and (as on a
    well-kept HGX host) its fabric manager running when the driver is loaded: the NVSwitch fabric is completed."""
    managers = []

    def make(version="570.86.15", loaded="same", lost=0, name="host"):
        root = tmp_path / name
        branch = version.split(".")[0]
        dpkg_deb("-x", deb(repo, "nvidia-driver-%s-open" % branch, version), root)
        dpkg_deb("-x", deb(repo, "python3-nvidia-ml-py", ""), root)
        dpkg_deb("-x", deb(repo, "nvidia-fabricmanager-%s" % branch, version), root)
        set_loaded(root, version if loaded == "same" else loaded)
        hw = root / "var/lib/nvidia-lab/hw"
        hw.mkdir(parents=True, exist_ok=True)
        (hw / "gpus.conf").write_text(GPUS_CONF.format(lost=lost))
        if loaded == "same":
            fm = subprocess.Popen([str(root / "usr/bin/nv-fabricmanager"), "--foreground"], env=env_for(root),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            managers.append(fm)
            deadline = time.monotonic() + 10
            while not (root / "var/run/nvidia-fabricmanager/nv-fabricmanager.version").exists():
                assert fm.poll() is None and time.monotonic() < deadline
                time.sleep(0.02)
        return root
    yield make
    for fm in managers:
        fm.terminate()
        fm.wait(10)


def py(root, code):
    """Runs code in a fresh interpreter against the host root; returns what it printed as JSON."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env_for(root), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def tool(root, *args, name="nvidia-smi"):
    return subprocess.run([str(root / "usr/bin" / name), *args], env=env_for(root), capture_output=True, text=True,
                          timeout=60)


NVML_READ = """
    import json, pynvml, fleetctl_gpus
    pynvml.nvmlInit()
    errors = {}
    reader = fleetctl_gpus.NvmlReader(pynvml, errors)
    out = {"system": reader.system(), "gpus": reader.gpus(), "errors": errors, "pynvml": pynvml.__file__}
    pynvml.nvmlShutdown()
    print(json.dumps(out))
"""


# ---- the repository -----------------------------------------------------------------------------------

def test_repository_has_every_package_indexed(repo):
    path, built = repo
    want = {("nvidia-container-toolkit", "1.17.4-1"), ("nvidia-container-toolkit", "1.17.8-1"),
            ("containerd", packages.CONTAINERD_VERSION + "-0lab1"), (packages.GPU_EMULATION, "1.0-0lab1")}
    for v in packages.DRIVER_VERSIONS:
        b = v.split(".")[0]
        want |= {("nvidia-driver-%s-open" % b, v + "-0lab1"), ("nvidia-persistenced", v + "-0lab1"),
                 ("nvidia-fabricmanager-%s" % b, v + "-0lab1"), ("nvidia-imex-%s" % b, v + "-0lab1")}
    assert packages.DRIVER_VERSIONS == ("550.163.01", "570.86.15", "570.124.06", "580.95.05")
    names = {(p["name"], p["version"]) for p in built}
    assert want <= names and len(names) == len(want) + 1
    assert any(n == "python3-nvidia-ml-py" for n, _ in names)
    index = (path / "Packages").read_text()
    stanzas = [s for s in index.split("\n\n") if s.strip()]
    assert len(stanzas) == len(built)  # --multiversion: both 570s, all four persistenced
    assert {(s.split("Package: ")[1].split("\n")[0], s.split("Version: ")[1].split("\n")[0]) for s in stanzas} == names
    release = (path / "Release").read_text()
    import hashlib
    assert hashlib.sha256((path / "Packages.gz").read_bytes()).hexdigest() in release
    assert "SHA256:" in release and "Architectures: amd64 all" in release


def test_rebuild_is_a_no_op(repo):
    path, built = repo
    mtimes = {p["path"]: os.stat(p["path"]).st_mtime_ns for p in built}
    started = time.monotonic()
    again = packages.build_repo(path)
    assert time.monotonic() - started < 1.0
    assert again == built
    assert {p["path"]: os.stat(p["path"]).st_mtime_ns for p in again} == mtimes


def test_driver_package_control_and_contents(repo):
    path = deb(repo, "nvidia-driver-570-open", "570.86.15")
    info = dpkg_deb("--info", path)
    for line in ("Package: nvidia-driver-570-open", "Version: 570.86.15-0lab1", "Architecture: amd64",
                 "Maintainer: ", "Conflicts: nvidia-driver-550-open, nvidia-driver-580-open",
                 "Replaces: nvidia-driver-550-open, nvidia-driver-580-open", "Description: "):
        assert line in info
    assert "preinst" in info and "triggers" in info
    contents = dpkg_deb("--contents", path)
    for entry in ("./usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.86.15",
                  "./usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 -> libnvidia-ml.so.570.86.15",
                  "./usr/bin/nvidia-smi", "./usr/bin/nvidia-lab-bench", "./usr/lib/nvidia-lab/modules/nvidia.version",
                  "./usr/lib/nvidia-lab/skus.json", "./usr/lib/nvidia-lab/nvidia_lab_interconnect.py"):
        assert entry in contents
    assert "root/root" in contents and "-rwxr-xr-x" in contents


def test_other_packages_contents(repo, tmp_path):
    assert "./usr/bin/nvidia-persistenced" in dpkg_deb("--contents", deb(repo, "nvidia-persistenced", "580.95.05"))
    assert "postinst" in dpkg_deb("--info", deb(repo, "nvidia-persistenced", "580.95.05"))
    fm = deb(repo, "nvidia-fabricmanager-580", "580.95.05")
    assert "./usr/bin/nv-fabricmanager" in dpkg_deb("--contents", fm)
    assert "Conflicts: nvidia-fabricmanager-550, nvidia-fabricmanager-570" in dpkg_deb("--info", fm)
    assert "./usr/bin/nvidia-ctk" in dpkg_deb("--contents", deb(repo, "nvidia-container-toolkit", "1.17.8"))
    pkg = deb(repo, "python3-nvidia-ml-py", "")
    import importlib.metadata
    assert "Version: %s" % importlib.metadata.version("nvidia-ml-py") in dpkg_deb("--info", pkg)
    dpkg_deb("-x", pkg, tmp_path)
    source, _ = packages.pynvml_source()
    assert (tmp_path / "usr/lib/python3/dist-packages/pynvml.py").read_bytes() == source


def test_preinst_fails_for_the_faulted_version(repo, tmp_path):
    dpkg_deb("-e", deb(repo, "nvidia-driver-570-open", "570.86.15"), tmp_path / "ctl")
    faults = tmp_path / "faults.conf"
    script = tmp_path / "preinst"
    script.write_text((tmp_path / "ctl/preinst").read_text().replace(packages.FAULTS, str(faults)))

    def preinst():
        return subprocess.run(["sh", str(script), "install"], capture_output=True, text=True)
    assert preinst().returncode == 0  # no faults file
    faults.write_text("throughput.any=0.9\ninstall_fail=580.95.05\n")
    assert preinst().returncode == 0
    faults.write_text("install_fail = 570.86.15   # this one\n")
    result = preinst()
    assert result.returncode == 1 and "570.86.15" in result.stderr


# ---- NVML through the real pynvml ------------------------------------------------------------------------

@pytest.mark.parametrize("version,nvml,cuda", [("550.163.01", "12.550.163.01", "12.4"), ("570.86.15", "12.570.86.15", "12.8"),
                                               ("570.124.06", "12.570.124.06", "12.8"), ("580.95.05", "13.580.95.05", "13.0")])
def test_nvml_system_per_version(make_host, version, nvml, cuda):
    root = make_host(version)
    out = py(root, NVML_READ)
    assert out["pynvml"].startswith(str(root))  # the packaged pynvml, not the venv's
    assert out["system"] == {"driver_version": version, "nvml_version": nvml, "cuda_driver_version": cuda}
    assert out["errors"] == {}


def test_nvml_gpu_values_follow_gpus_conf(make_host):
    root = make_host()
    out = py(root, NVML_READ)
    g0, g1 = out["gpus"]
    assert g0 == {
        "index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-4da776c0-2c08-62ff-bf1f-3a5ac46e878a",
        "serial": "1652822000001", "pci_bus_id": "00000000:9b:00.0", "vbios": "96.00.99.00.01", "persistence_mode": True,
        "ecc": {"enabled": True, "pending": True, "uncorrected_volatile": 2, "uncorrected_aggregate": 5},
        "remapped_rows": {"correctable": 1, "uncorrectable": 3, "pending": True, "failure": False},
        "retired_pages": None,  # NOT_SUPPORTED on Hopper, as on the real H100 capture
        "mig": {"current": False, "pending": False},
        "pcie": {"gen": 4, "gen_max": 5, "width": 8, "width_max": 16, "replay_count": 7},
        "clock_event_reasons": {"mask": 0x48, "active": ["hw_slowdown", "hw_thermal_slowdown"]},
        "temperature_c": 41, "power_w": 123.4, "recovery_action": "Reboot", "inforom_image": "G520.0200.00.05",
        "memory": {"total_bytes": 85520809984, "reserved_bytes": 480 << 20, "used_bytes": 0, "processes": 0}}
    assert g1["persistence_mode"] is False and g1["ecc"] == {"enabled": False, "pending": True,
                                                             "uncorrected_volatile": None, "uncorrected_aggregate": None}
    assert g1["mig"] == {"current": True, "pending": True} and g1["recovery_action"] == "None"
    assert g1["pcie"] == {"gen": 5, "gen_max": 5, "width": 16, "width_max": 16, "replay_count": 0}  # the SKU's
    assert g1["inforom_image"] is None  # no InfoROM key: NOT_SUPPORTED
    assert g1["memory"] == {"total_bytes": 85520809984, "reserved_bytes": 480 << 20, "used_bytes": 300 << 20,
                            "processes": 0}
    assert fleetctl_gpus.leaked_mib(g1["memory"]) == 300
    schema = json.loads((REPO / "schemas/host-facts.schema.json").read_text())
    validator = Draft202012Validator({**schema["properties"]["gpus"], "$defs": schema["$defs"]})
    assert list(validator.iter_errors(out["gpus"])) == []


def test_nvml_basics_match_the_real_library(make_host):
    out = py(make_host(), """
        import json, pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        mem, mem2 = pynvml.nvmlDeviceGetMemoryInfo(h), pynvml.nvmlDeviceGetMemoryInfo(h, pynvml.nvmlMemory_v2)
        pci = pynvml.nvmlDeviceGetPciInfo_v3(h)
        fv = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, pynvml.NVML_FI_DEV_ECC_CURRENT])
        try:
            pynvml.nvmlDeviceGetRetiredPages(h, 0)
        except pynvml.NVMLError as e:
            retired = e.value
        print(json.dumps({
            "count": pynvml.nvmlDeviceGetCount(), "power_limit": pynvml.nvmlDeviceGetEnforcedPowerLimit(h),
            "minor": pynvml.nvmlDeviceGetMinorNumber(h), "procs": pynvml.nvmlDeviceGetComputeRunningProcesses(h),
            "mem": [mem.total, mem.free, mem.used], "mem2": [mem2.total, mem2.reserved, mem2.free, mem2.used],
            "pci": [str(pci.busIdLegacy), str(pci.busId), pci.domain, pci.bus, pci.device, pci.pciDeviceId],
            "fv": [[v.fieldId, v.nvmlReturn, v.valueType, v.value.uiVal, v.timestamp > 0] for v in fv],
            "retired": retired, "arch": pynvml.nvmlDeviceGetArchitecture(h),
            "by_uuid": pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID("GPU-4da776c0-2c08-62ff-bf1f-3a5ac46e878a")),
            "err18": pynvml.nvmlErrorString(18),
        }))
        pynvml.nvmlShutdown()
    """)
    total = 85520809984  # what the real H100 80GB HBM3 reports
    assert out["count"] == 2 and out["power_limit"] == SKUS["h100-sxm"].power_limit_mw and out["minor"] == 0
    assert out["procs"] == [] and out["retired"] == 3 and out["arch"] == 9 and out["by_uuid"] == 0
    assert out["mem"] == [total, total - 503316480, 503316480] and out["mem2"] == [total, 503316480, total - 503316480, 0]
    assert out["pci"] == ["0000:9B:00.0", "00000000:9B:00.0", 0, 0x9B, 0, 0x233010DE]
    assert out["fv"] == [[230, 0, 1, 2, True], [1, 3, 1, 0, True]]
    assert out["err18"] == "RM has detected an NVML/RM version mismatch."


INIT_ERROR = """
    import json, pynvml
    try:
        pynvml.nvmlInit()
        print(json.dumps(0))
    except pynvml.NVMLError as e:
        print(json.dumps(e.value))
"""


def test_nvml_version_mismatch_and_not_loaded(make_host):
    root = make_host("570.86.15", loaded="570.124.06")
    assert py(root, INIT_ERROR) == 18
    set_loaded(root, None)
    assert py(root, INIT_ERROR) == 9
    set_loaded(root, "570.86.15")
    assert py(root, INIT_ERROR) == 0


def test_nvml_lost_gpu(make_host):
    root = make_host(lost=1)
    out = py(root, NVML_READ)
    assert out["gpus"][1] == {"index": 1, "lost": True} and out["gpus"][0]["uuid"].startswith("GPU-4da7")
    assert out["errors"] == {}  # a lost GPU is a fact (lost: true), not a read error
    # A handle taken before the GPU fell off the bus: every query answers GPU_IS_LOST.
    conf = root / "var/lib/nvidia-lab/hw/gpus.conf"
    conf.write_text(GPUS_CONF.format(lost=0))
    out = py(root, """
        import json, pathlib, pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(1)
        conf = pathlib.Path("%s")
        conf.write_text(conf.read_text().replace("gpu.1.lost=0", "gpu.1.lost=1"))
        codes = []
        for fn in (pynvml.nvmlDeviceGetName, pynvml.nvmlDeviceGetUUID, pynvml.nvmlDeviceGetPciInfo,
                   pynvml.nvmlDeviceGetEccMode, pynvml.nvmlDeviceGetPowerUsage, pynvml.nvmlDeviceGetRemappedRows):
            try:
                fn(h)
                codes.append(0)
            except pynvml.NVMLError as e:
                codes.append(e.value)
        print(json.dumps([pynvml.nvmlDeviceGetCount(), codes]))
    """ % conf)
    assert out == [2, [15] * 6]


# ---- nvidia-smi --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sku", ["h100-sxm", "l40s"])
def test_smi_xml_gives_the_same_facts_as_nvml(make_host, sku):
    root = make_host("580.95.05")
    conf = root / "var/lib/nvidia-lab/hw/gpus.conf"
    conf.write_text(conf.read_text().replace("sku=h100-sxm", "sku=" + sku))
    nvml = py(root, NVML_READ)
    assert nvml["errors"] == {}
    assert (nvml["gpus"][0]["mig"] is None) == (sku == "l40s")  # Ada has no MIG: NOT_SUPPORTED
    result = tool(root, "-q", "-x")
    assert result.returncode == 0, result.stdout
    system, gpus = parse_smi_xml(result.stdout)
    assert system == {"driver_version": "580.95.05", "nvml_version": None, "cuda_driver_version": "13.0"}
    for smi, ref in zip(gpus, nvml["gpus"], strict=True):
        assert smi.pop("power_w") == pytest.approx(ref.pop("power_w"), abs=0.05)  # NVML's reader rounds to 0.1 W
        assert smi == ref
    assert result.stdout.startswith('<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">')


def test_smi_xml_has_the_real_structure(make_host):
    """Every element path of the emulated output exists in the real H100 capture (same nesting and tag names)."""
    import xml.etree.ElementTree as ET

    def paths(el, prefix=""):
        found = set()
        for child in el:
            p = prefix + "/" + child.tag
            found |= {p} | paths(child, p)
        return found
    real = paths(ET.parse(TESTDATA / "h100-580.159.04/nvidia-smi-q-x.xml").getroot())
    ours = paths(ET.fromstring(tool(make_host("580.95.05"), "-q", "-x").stdout))
    assert ours - real == set()
    assert len(ours) > 100


def test_smi_table_and_list(make_host):
    root = make_host("580.95.05")
    out = tool(root).stdout.splitlines()
    real = (TESTDATA / "h100-580.159.04/nvidia-smi.txt").read_text().splitlines()
    assert all(len(line) == 91 for line in out[1:] if line)
    assert out[2] == "| NVIDIA-SMI 580.95.05              Driver Version: 580.95.05      CUDA Version: 13.0     |"
    assert out[3:8] == real[3:8]  # column headers
    assert out[8] == "|   0  NVIDIA H100 80GB HBM3          On  |   00000000:9B:00.0 Off |                    2 |"
    assert out[9] == "| N/A   41C    P0            123W /  700W |       0MiB /  81559MiB |      0%      Default |"
    assert out[10:12] == real[10:12]  # MIG Disabled, separator
    assert out[-7:] == real[-7:]  # processes
    assert tool(root, "-L").stdout == ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-4da776c0-2c08-62ff-bf1f-3a5ac46e878a)\n"
                                       "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-0a3c1f52-7e45-4b7e-a0a1-3c2b1d4e5f60)\n")
    version = tool(root, "--version").stdout
    assert version == ("NVIDIA-SMI version  : 580.95.05\nNVML version        : 580.95\nDRIVER version      : 580.95.05\n"
                       "CUDA Version        : 13.0\n")
    q = tool(root, "-q").stdout
    assert "    Product Name                                       : NVIDIA H100 80GB HBM3\n" in q
    assert "        Pending                                        : Yes\n" in q  # remapped row pending
    assert "    GPU Recovery Action                                : Reboot\n" in q


def test_smi_query_csv(make_host):
    root = make_host("570.124.06")
    real_header = (TESTDATA / "h100-580.159.04/nvidia-smi-query.csv").read_text().splitlines()[0]
    fields = real_header.replace(" [W]", "").replace(", ", ",")
    out = tool(root, "--query-gpu=" + fields, "--format=csv").stdout.splitlines()
    assert out[0] == real_header
    assert out[1] == ("0, NVIDIA H100 80GB HBM3, GPU-4da776c0-2c08-62ff-bf1f-3a5ac46e878a, 1652822000001, 00000000:9B:00.0, "
                      "570.124.06, 96.00.99.00.01, Enabled, Enabled, Disabled, 4, 5, 8, 16, 41, 123.40 W, 0x0000000000000048")
    assert tool(root, "--query-gpu=index,power.draw", "--format=csv,noheader,nounits").stdout == "0, 123.40\n1, 71.00\n"
    bad = tool(root, "--query-gpu=index,bogus", "--format=csv")
    assert bad.returncode == 2 and 'Field "bogus" is not a valid field to query.' in bad.stdout


def test_smi_mismatch_not_loaded_and_lost(make_host):
    root = make_host("570.124.06", loaded="570.86.15")
    for args in ((), ("-q", "-x"), ("--query-gpu=index", "--format=csv")):
        result = tool(root, *args)
        assert result.returncode == 18
        assert result.stdout == "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 570.124\n"
    set_loaded(root, None)
    result = tool(root, "-q", "-x")
    assert result.returncode == 9
    assert result.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                                    "Make sure that the latest NVIDIA driver is installed and running.")
    lost = make_host(lost=1, name="lost")
    message = "Unable to determine the device handle for GPU00000000:18:00.0: Unknown Error\n"
    plain = tool(lost)
    assert plain.returncode == 15 and plain.stdout == message
    xml = tool(lost, "-q", "-x")
    assert xml.returncode == 15 and xml.stderr == message
    _, gpus = parse_smi_xml(xml.stdout)
    assert [g["index"] for g in gpus] == [0]


# ---- nvidia-lab-bench ------------------------------------------------------------------------------------------

def bench(root, *args):
    result = tool(root, "--samples", "40", "--seconds", "0", *args, name="nvidia-lab-bench")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("sku", ["h100-sxm", "l40s"])
def test_bench_follows_the_sku_and_faults(make_host, sku):
    root = make_host("570.86.15")
    conf = root / "var/lib/nvidia-lab/hw/gpus.conf"
    conf.write_text(conf.read_text().replace("sku=h100-sxm", "sku=" + sku))
    base = bench(root, "--seed", "1")
    assert base["sku"] == sku and base["factor"] == 1.0 and base["lost"] == []
    for field, centre in (("gemm_tflops", SKUS[sku].gemm_tflops), ("bandwidth_gbs", SKUS[sku].bandwidth_gbs)):
        for gpu in (0, 1):
            values = [s[field] for s in base["samples"] if s["gpu"] == gpu and field in s]
            assert len(values) == 40
            assert statistics.median(values) == pytest.approx(centre, rel=0.015)
            cv = statistics.stdev(values) / statistics.mean(values)
            assert 0.002 <= cv <= 0.01, cv
    faults = root / "var/lib/nvidia-lab/hw/faults.conf"
    faults.write_text("throughput.570.86.15=0.9\nthroughput.580.95.05=0.5\n")
    slow = bench(root, "--seed", "2")
    ratio = statistics.median(s["gemm_tflops"] for s in slow["samples"] if "gemm_tflops" in s) / \
        statistics.median(s["gemm_tflops"] for s in base["samples"] if "gemm_tflops" in s)
    assert slow["factor"] == 0.9 and ratio == pytest.approx(0.9, abs=0.006)
    faults.write_text("throughput.any=0.8\n")
    assert bench(root)["factor"] == 0.8
    faults.write_text("throughput.any=0.8\ndrift=0.9\n")  # the lab's fleet-wide drift (fleetctl lab drift 0.9)
    assert bench(root)["factor"] == pytest.approx(0.72)


def test_bench_host_copies_follow_the_current_pcie_link(make_host):
    """GPU 0 of the test host trained at Gen4 x8 (a quarter of Gen5 x16), GPU 1 at the SKU's Gen5 x16: the real
    H100's 54.8 / 55.1 GB/s; a downgrade of GPU 1 to x8 (what lab inject pcie-downgrade writes) halves its copies."""
    root = make_host("570.86.15")

    def medians(out, gpu):
        return [statistics.median(s[m] for s in out["samples"] if s["gpu"] == gpu and m in s)
                for m in ("h2d_gbs", "d2h_gbs")]
    base = bench(root, "--seed", "4")
    assert base["metrics"]["h2d_gbs"] == {"unit": "GB/s", "higher_is_better": True}
    full = [host_copy_gbs("h2d_gbs", 5, 16), host_copy_gbs("d2h_gbs", 5, 16)]
    assert medians(base, 1) == pytest.approx(full, rel=0.015)
    assert medians(base, 1) == pytest.approx([54.8, 55.1], rel=0.015)
    assert [g["pcie"] for g in base["gpus"]] == ["Gen4 x8", "Gen5 x16"]
    assert [a / b for a, b in zip(medians(base, 0), medians(base, 1))] == pytest.approx([0.25, 0.25], rel=0.02)
    conf = root / "var/lib/nvidia-lab/hw/gpus.conf"
    conf.write_text(conf.read_text() + "gpu.1.pcie_width=8\n")
    narrow = bench(root, "--seed", "4")
    assert [a / b for a, b in zip(medians(narrow, 1), medians(base, 1))] == pytest.approx([0.5, 0.5], abs=0.005)
    assert narrow["gpus"][1]["pcie"] == "Gen5 x8"
    assert py(root, NVML_READ)["gpus"][1]["pcie"]["width"] == 8  # what the probe's health and the audit read


def test_bench_skips_lost_gpus_and_needs_the_driver(make_host):
    root = make_host(lost=1)
    out = bench(root, "--seed", "3")
    assert out["lost"] == [1] and {s["gpu"] for s in out["samples"]} == {0} and len(out["gpus"]) == 1
    assert out == bench(root, "--seed", "3")  # --seed makes it reproducible
    set_loaded(root, "580.95.05")
    failed = tool(root, name="nvidia-lab-bench")
    assert failed.returncode == 1 and "unsupported display driver" in failed.stderr


# ---- nvidia-ctk -------------------------------------------------------------------------------------------------

def ctk_host(repo, tmp_path, toolkit="1.17.8"):
    root = tmp_path / "ctk"
    root.mkdir(parents=True)
    dpkg_deb("-x", deb(repo, "nvidia-container-toolkit", toolkit), root)
    return root


def test_ctk_version(repo, tmp_path):
    for v in ("1.17.4", "1.17.8"):
        root = ctk_host(repo, tmp_path / v, v)
        assert tool(root, "--version", name="nvidia-ctk").stdout.startswith("NVIDIA Container Toolkit CLI version %s\n" % v)


def test_ctk_runtime_configure(repo, tmp_path, gpu_facts_module):
    root = ctk_host(repo, tmp_path)
    ctk = lambda *a: tool(root, "runtime", "configure", *a, name="nvidia-ctk")  # noqa: E731
    # containerd, fresh config: runtime only, then as default
    assert ctk("--runtime=containerd").returncode == 0
    text = (root / "etc/containerd/config.toml").read_text()
    assert gpu_facts_module.toml_has_nvidia_runtime(text, "containerd") == (True, False)
    assert ctk("--runtime=containerd", "--set-as-default").returncode == 0
    text = (root / "etc/containerd/config.toml").read_text()
    assert gpu_facts_module.toml_has_nvidia_runtime(text, "containerd") == (True, True)
    parsed = tomllib.loads(text)
    containerd = parsed["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert containerd["default_runtime_name"] == "nvidia"
    assert containerd["runtimes"]["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    # an existing config whose containerd table names runc: replaced in place, still valid TOML
    existing = root / "etc/containerd/other.toml"
    existing.write_text('version = 2\n\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
                        '  default_runtime_name = "runc"\n  snapshotter = "overlayfs"\n')
    assert ctk("--runtime=containerd", "--set-as-default", "--config=/etc/containerd/other.toml").returncode == 0
    parsed = tomllib.loads(existing.read_text())["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert parsed["default_runtime_name"] == "nvidia" and parsed["snapshotter"] == "overlayfs"
    # docker
    daemon = root / "etc/docker/daemon.json"
    daemon.parent.mkdir(parents=True)
    daemon.write_text('{"log-driver": "json-file"}')
    assert ctk("--runtime=docker", "--set-as-default").returncode == 0
    conf = json.loads(daemon.read_text())
    assert conf["log-driver"] == "json-file" and conf["default-runtime"] == "nvidia"
    assert conf["runtimes"]["nvidia"] == {"args": [], "path": "nvidia-container-runtime"}
    # crio
    assert ctk("--runtime=crio", "--set-as-default").returncode == 0
    text = (root / "etc/crio/crio.conf.d/99-nvidia.toml").read_text()
    assert gpu_facts_module.toml_has_nvidia_runtime(text, "crio") == (True, True)


def test_ctk_cdi_generate(repo, make_host, gpu_facts_module):
    root = make_host("570.124.06", lost=1)
    dpkg_deb("-x", deb(repo, "nvidia-container-toolkit", "1.17.8"), root)
    result = tool(root, "cdi", "generate", "--output=/etc/cdi/nvidia.yaml", name="nvidia-ctk")
    assert result.returncode == 0, result.stderr
    text = (root / "etc/cdi/nvidia.yaml").read_text()
    assert "kind: nvidia.com/gpu" in text and "libcuda.so.570.124.06" in text
    assert gpu_facts_module.cdi_driver_version(text) == "570.124.06"
    assert 'name: "0"' in text and "name: GPU-4da776c0-2c08-62ff-bf1f-3a5ac46e878a" in text
    assert 'name: "1"' not in text and "name: all" in text  # GPU 1 is lost
    set_loaded(root, "570.86.15")
    failed = tool(root, "cdi", "generate", name="nvidia-ctk")
    assert failed.returncode == 1 and "ERROR_LIB_RM_VERSION_MISMATCH" in failed.stderr


# ---- daemons ----------------------------------------------------------------------------------------------------

def argv0(pid):
    return Path("/proc/%d/cmdline" % pid).read_bytes().split(b"\0")[0].decode()


def test_persistenced_runs_as_itself_and_stops_on_sigterm(repo, tmp_path):
    root = tmp_path / "root"
    dpkg_deb("-x", deb(repo, "nvidia-persistenced", "570.86.15"), root)
    env = dict(os.environ, NVIDIA_LAB_ROOT=str(root))
    pidfile = root / "var/run/nvidia-persistenced/nvidia-persistenced.pid"
    # In front, for a supervisor.
    proc = subprocess.Popen([str(root / "usr/bin/nvidia-persistenced"), "--foreground"], env=env)
    try:
        for _ in range(100):
            if pidfile.exists() and os.path.basename(argv0(proc.pid)) == "nvidia-persistenced":
                break
            time.sleep(0.05)
        assert os.path.basename(argv0(proc.pid)) == "nvidia-persistenced"
        assert int(pidfile.read_text()) == proc.pid
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert not pidfile.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
    # As the package's postinst starts it: forks into the background.
    assert subprocess.run([str(root / "usr/bin/nvidia-persistenced"), "--verbose"], env=env, timeout=10).returncode == 0
    for _ in range(100):
        if pidfile.exists():
            break
        time.sleep(0.05)
    pid = int(pidfile.read_text())
    try:
        assert os.path.basename(argv0(pid)) == "nvidia-persistenced"
    finally:
        os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        if not pidfile.exists():
            break
        time.sleep(0.05)
    assert not pidfile.exists()
    assert tool(root, "--version", name="nvidia-persistenced").stdout == "nvidia-persistenced:  version 570.86.15\n"


def test_fabricmanager_refuses_another_driver(repo, tmp_path):
    root = tmp_path / "root"
    dpkg_deb("-x", deb(repo, "nvidia-fabricmanager-570", "570.124.06"), root)
    set_loaded(root, "570.86.15")
    result = tool(root, "--foreground", name="nv-fabricmanager")
    assert result.returncode == 1 and "does not match" in result.stderr


NVML_EVENTS = """
    import json, time, pynvml
    pynvml.nvmlInit()
    s = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlEventTypeXidCriticalError, s)
    started = time.monotonic()
    try:
        pynvml.nvmlEventSetWait_v2(s, 150)
        code = 0
    except pynvml.NVMLError as e:
        code = e.value
    waited = time.monotonic() - started
    pynvml.nvmlEventSetFree(s)
    pynvml.nvmlShutdown()
    print(json.dumps({"code": code, "waited": waited}))
"""


def test_nvml_xid_event_listening_times_out_like_a_quiet_gpu(make_host):
    out = py(make_host(), NVML_EVENTS)
    assert out["code"] == 10 and 0.1 <= out["waited"] < 2  # NVML_ERROR_TIMEOUT after the wait


def test_nvml_lists_a_gpu_process_while_it_lives(make_host):
    """gpus.conf gpu.N.process=PID (lab inject gpu-in-use): NVML's compute process list, only while PID lives."""
    root = make_host()
    live = subprocess.Popen(["sleep", "60"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    conf = root / "var/lib/nvidia-lab/hw/gpus.conf"
    base = conf.read_text()
    code = """
        import json, pynvml
        pynvml.nvmlInit()
        print(json.dumps([[p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))]
                          for i in range(pynvml.nvmlDeviceGetCount())]))
    """
    try:
        conf.write_text(base + f"gpu.1.process={live.pid}\n")
        assert py(root, code) == [[], [live.pid]]
        # it holds 1 GiB: in use by a process, which NVML and nvidia-smi both list (not a leaked context)
        memory = py(root, NVML_READ)["gpus"][1]["memory"]
        assert memory == {"total_bytes": 85520809984, "reserved_bytes": 480 << 20, "used_bytes": (1 << 30) + (300 << 20),
                          "processes": 1}
        assert parse_smi_xml(tool(root, "-q", "-x").stdout)[1][1]["memory"] == memory
        conf.write_text(base + f"gpu.1.process={dead.pid}\n")
        assert py(root, code) == [[], []]
    finally:
        live.kill()
        live.wait()


# ---- fleetctl-lab-gpu: the emulation beside a real distribution's driver packages (+debian hosts) -------------

def debian_host(repo, tmp_path, real_version):
    """A root with fleetctl-lab-gpu and pynvml unpacked and, when REAL_VERSION, Debian's layout of the real
    library: libnvidia-ml.so.1 -> /etc/alternatives/... -> nvidia/tesla-470/libnvidia-ml.so.1 -> .so.VERSION
    (relative links here, so that they stay inside the fake root)."""
    root = tmp_path / "debian-host"
    dpkg_deb("-x", deb(repo, packages.GPU_EMULATION, ""), root)
    dpkg_deb("-x", deb(repo, "python3-nvidia-ml-py", ""), root)
    if real_version:
        branch_dir = root / LIB / "nvidia/tesla-470"
        branch_dir.mkdir(parents=True)
        (branch_dir / ("libnvidia-ml.so." + real_version)).write_bytes(b"\x7fELF (Debian's library)")
        (branch_dir / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so." + real_version)
        (root / "etc/alternatives").mkdir(parents=True)
        (root / "etc/alternatives/nvidia--libnvidia-ml.so.1-x86_64-linux-gnu").symlink_to(
            "../../" + LIB + "/nvidia/tesla-470/libnvidia-ml.so.1")
        (root / LIB / "libnvidia-ml.so.1").symlink_to("../../../etc/alternatives/nvidia--libnvidia-ml.so.1-x86_64-linux-gnu")
    hw = root / "var/lib/nvidia-lab/hw"
    hw.mkdir(parents=True)
    (hw / "gpus.conf").write_text("sku=a100-pcie\ncount=1\ngpu.0.uuid=GPU-0\ngpu.0.pci=00000000:18:00.0\n")
    return root


def run_shadowed(root, args):
    env = dict(env_for(root), LD_LIBRARY_PATH=str(root / "usr/local/lib/x86_64-linux-gnu"))
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)


NVML_VERSION = """
    import json, pynvml
    try:
        pynvml.nvmlInit()
        print(json.dumps([pynvml.nvmlSystemGetDriverVersion(), pynvml.nvmlSystemGetCudaDriverVersion_v2(),
                          pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))]))
    except pynvml.NVMLError as e:
        print(json.dumps(e.value))
"""


def test_lab_gpu_answers_for_the_real_library_it_shadows(repo, tmp_path):
    root = debian_host(repo, tmp_path, "470.256.02")
    set_loaded(root, "470.256.02")
    nvml = run_shadowed(root, [sys.executable, "-c", textwrap.dedent(NVML_VERSION)])
    assert json.loads(nvml.stdout) == ["470.256.02", 11040, "NVIDIA A100 80GB PCIe"], nvml.stderr
    smi = run_shadowed(root, [str(root / "usr/local/bin/nvidia-smi")])
    assert "Driver Version: 470.256.02" in smi.stdout and "CUDA Version: 11.4" in smi.stdout, smi.stderr
    set_loaded(root, "535.216.03")  # packages changed, not rebooted: the real library's version no longer matches
    assert json.loads(run_shadowed(root, [sys.executable, "-c", textwrap.dedent(NVML_VERSION)]).stdout) == 18
    assert "Driver/library version mismatch" in run_shadowed(root, [str(root / "usr/local/bin/nvidia-smi")]).stdout


def test_lab_gpu_without_a_real_driver_is_no_library_and_no_nvidia_smi(repo, tmp_path):
    root = debian_host(repo, tmp_path, None)
    set_loaded(root, "470.256.02")
    assert json.loads(run_shadowed(root, [sys.executable, "-c", textwrap.dedent(NVML_VERSION)]).stdout) == 12
    smi = run_shadowed(root, [str(root / "usr/local/bin/nvidia-smi")])
    assert (smi.returncode, smi.stderr) == (127, "nvidia-smi: command not found\n")


def test_each_lab_gets_its_own_copy_of_one_build_per_machine(tmp_path, monkeypatch):
    """lab_repo builds once per content hash (in $XDG_CACHE_HOME) and hands each lab a copy: a second lab up builds
    nothing, its manifest names its own files, and what a lab does to its copy never reaches the next lab."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = packages.lab_repo(tmp_path / "a" / "repo")
    assert first and all(Path(p["path"]).parent == tmp_path / "a" / "repo" for p in first)
    (built,) = (tmp_path / "cache" / "fleetctl-lab").iterdir()
    stamp = {p: p.stat().st_mtime_ns for p in built.iterdir() if p.name != ".lab-packages.lock"}
    (tmp_path / "a" / "repo" / "Packages").write_text("")  # a lab's test emptying its index
    second = packages.lab_repo(tmp_path / "b" / "repo")
    assert [p["name"] for p in second] == [p["name"] for p in first]
    assert all(Path(p["path"]).parent == tmp_path / "b" / "repo" and Path(p["path"]).exists() for p in second)
    assert "Package: nvidia-driver-580-open" in (tmp_path / "b" / "repo" / "Packages").read_text()
    assert {p: p.stat().st_mtime_ns for p in built.iterdir() if p.name != ".lab-packages.lock"} == stamp
