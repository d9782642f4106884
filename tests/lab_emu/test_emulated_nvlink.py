"""NVLink, the NVSwitch fabric, topology and P2P of the lab's emulated driver (libnvidia-ml.c through the real
pynvml, nvidia-smi nvlink/topo/-q, nvidia-lab-bench's interconnect metrics) and the faults that change them, without
namespaces: packages unpacked into fake roots as in test_emulated_driver.py.
"""
import json
import re
import shutil
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleetctl_lab import faults
from fleetctl_lab.conf import read_conf
from fleetctl_lab.skus import SKUS
from orchestrator.errors import InputError

from tests.helpers.emu import MISSING, deb, dpkg_deb, env_for, set_loaded

TESTDATA = Path(__file__).resolve().parents[1] / "testdata" / "h200x2-580.159.04"
V = "580.95.05"
pytestmark = pytest.mark.skipif(bool(MISSING), reason="building the lab packages needs %s" % ", ".join(MISSING))
# The real 2x H200 host's GPUs (tests/testdata/h200x2-580.159.04): its nvidia-smi output is the reference.
H200_UUIDS = ("GPU-0e3200d4-7a9e-dcf4-5eb8-8770bed1090d", "GPU-ceb82ed6-8eb6-aa53-189e-bec4db898c19")


def gpus_conf(sku, count):
    lines = ["sku=%s" % sku, "count=%d" % count]
    for i in range(count):
        uuid = H200_UUIDS[i] if i < 2 else "GPU-00000000-0000-0000-0000-%012d" % i
        lines += ["gpu.%d.name=%s" % (i, SKUS[sku].name), "gpu.%d.uuid=%s" % (i, uuid),
                  "gpu.%d.pci=00000000:%02X:00.0" % (i, 0x18 + 0x10 * i), "gpu.%d.lost=0" % i]
    return "\n".join(lines) + "\n"


class Host:
    """A fake root with driver V, pynvml and the fabric manager; fm() starts it, stop_fm() stops it."""

    def __init__(self, repo, path, sku="h100-sxm", count=2):
        self.root = path / "root"
        self.procs = []
        path.mkdir(parents=True)
        dpkg_deb("-x", deb(repo, "nvidia-driver-580-open", V), self.root)
        dpkg_deb("-x", deb(repo, "python3-nvidia-ml-py", ""), self.root)
        dpkg_deb("-x", deb(repo, "nvidia-fabricmanager-580", V), self.root)
        set_loaded(self.root, V)
        self.hw = self.root / "var/lib/nvidia-lab/hw"
        self.hw.mkdir(parents=True)
        (self.hw / "gpus.conf").write_text(gpus_conf(sku, count))
        (self.hw / "faults.conf").write_text("")
        # What `fleetctl lab inject` works on: the host's hw/ and kernel/ (loaded driver).
        (path / "kernel/sys-module/nvidia").mkdir(parents=True)
        (path / "kernel/sys-module/nvidia/version").write_text(V + "\n")
        self.lab_host = faults.Host.__new__(faults.Host)
        self.lab_host.record = SimpleNamespace(name="hgx-01")
        self.lab_host.dir = path
        self.lab_host.gpus_conf = self.hw / "gpus.conf"
        self.lab_host.faults_conf = self.hw / "faults.conf"
        self.lab_host.kmsg = path / "kernel/kmsg"

    def fm(self):
        proc = subprocess.Popen([str(self.root / "usr/bin/nv-fabricmanager"), "--foreground"], env=env_for(self.root),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.procs.append(proc)
        version = self.root / "var/run/nvidia-fabricmanager/nv-fabricmanager.version"
        deadline = time.monotonic() + 10
        while not version.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.02)
        return proc

    def stop_fm(self):
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
        self.procs = []

    def conf(self, text=None, **values):
        path = self.hw / "gpus.conf"
        conf = read_conf(path)
        conf.update({k.replace("__", "."): str(v) for k, v in values.items()})
        path.write_text("".join("%s=%s\n" % kv for kv in conf.items()))

    def reload(self, version=V):
        """A driver load (boot or modprobe) of VERSION: what the supervisor does to the links (boot_faults)."""
        hw = read_conf(self.hw / "gpus.conf")
        faults.apply_link_faults(hw, read_conf(self.hw / "faults.conf"), version)
        (self.hw / "gpus.conf").write_text("".join("%s=%s\n" % kv for kv in hw.items()))

    def py(self, code):
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env_for(self.root),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def tool(self, *args, name="nvidia-smi"):
        return subprocess.run([str(self.root / "usr/bin" / name), *args], env=env_for(self.root), capture_output=True,
                              text=True, timeout=60)


@pytest.fixture
def make(repo, tmp_path):
    hosts = []

    def make(sku="h100-sxm", count=2, fm=True):
        host = Host(repo, tmp_path / ("h%d" % len(hosts)), sku, count)
        hosts.append(host)
        if fm:
            host.fm()
        return host
    yield make
    for host in hosts:
        host.stop_fm()


# What fleetctl's collector would read, per GPU (docs/interconnect.md), straight from pynvml.
NVML_INTERCONNECT = """
    import ctypes, json, pynvml as p
    p.nvmlInit()
    def call(fn, *args):
        try:
            return fn(*args)
        except p.NVMLError as e:
            return "E%d" % e.value
    n = p.nvmlDeviceGetCount()
    hs = [p.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    out = {"gpus": [], "topology": {}, "p2p": {}}
    for i, h in enumerate(hs):
        links = []
        for l in range(40):
            state = call(p.nvmlDeviceGetNvLinkState, h, l)
            if state in ("E2", "E3"):
                out.setdefault("link_end", state)
                break
            remote = call(p.nvmlDeviceGetNvLinkRemotePciInfo, h, l)
            fields = p.nvmlDeviceGetFieldValues(h, [(214, l), (221, l), (219, l), (161, l), (162, l), (163, l)])
            links.append({"state": state, "version": call(p.nvmlDeviceGetNvLinkVersion, h, l),
                          "remote_type": call(p.nvmlDeviceGetNvLinkRemoteDeviceType, h, l),
                          "remote_pci": remote if isinstance(remote, str) and remote.startswith("E") else getattr(remote, "busId", remote),
                          "errors": [call(p.nvmlDeviceGetNvLinkErrorCounter, h, l, c) for c in range(5)],
                          "fields": [(f.nvmlReturn, f.value.ullVal) for f in fields],
                          "caps": [call(p.nvmlDeviceGetNvLinkCapability, h, l, c) for c in range(6)]})
        fields0 = p.nvmlDeviceGetFieldValues(h, [(221, 0), 91])
        v2 = p.c_nvmlGpuFabricInfo_v2_t()
        rc_v2 = call(p.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(v2))
        v1 = p.c_nvmlGpuFabricInfo_t()
        call(p.nvmlDeviceGetGpuFabricInfo, h, ctypes.byref(v1))
        v3 = p.c_nvmlGpuFabricInfo_v3_t()
        call(p.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(v3))
        bad = p.c_nvmlGpuFabricInfo_v2_t()
        bad.version = 0x01000024
        out["gpus"].append({"links": links, "field0": fields0[0].nvmlReturn,
                            "link_count": [fields0[1].nvmlReturn, fields0[1].value.uiVal],
                            "fabric": [v2.state, v2.status, v2.cliqueId, v2.healthMask, list(v2.clusterUuid)],
                            "fabric_rc": rc_v2, "fabric_v1": v1.state, "fabric_v3": [v3.state, v3.healthSummary],
                            "fabric_bad_version": call(p.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(bad))})
        for j, h2 in enumerate(hs):
            out["topology"]["%d-%d" % (i, j)] = p.nvmlDeviceGetTopologyCommonAncestor(h, h2)
            if i != j:
                out["p2p"]["%d-%d" % (i, j)] = [call(p.nvmlDeviceGetP2PStatus, h, h2, k) for k in range(5)]
    p.nvmlShutdown()
    print(json.dumps(out))
"""


# ---- NVML per SKU --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sku,links,version,device", [("h100-sxm", 18, 6, 0x22A310DE), ("h200-sxm", 18, 6, 0x22A310DE),
                                                       ("a100-sxm", 12, 4, 0x1AF110DE)])
def test_nvml_nvswitch_boards(make, sku, links, version, device):
    host = make(sku, 4)
    nvml = host.py(NVML_INTERCONNECT)
    assert nvml["link_end"] == "E2"  # past the last link: INVALID_ARGUMENT
    for gpu in nvml["gpus"]:
        assert len(gpu["links"]) == links and gpu["link_count"] == [0, links]  # NVML_FI_DEV_NVLINK_LINK_COUNT
        for n, link in enumerate(gpu["links"]):
            assert (link["state"], link["version"], link["remote_type"]) == (1, version, 2)  # up, NVSwitch
            switch = 0x05 + next(s for s, last in enumerate(_cumulative(SKUS[sku].nvswitch_links)) if n < last)
            assert link["remote_pci"] == "00000000:%02X:00.0" % switch
            assert link["errors"][:3] == [0, 0, 0] and link["fields"] == [[0, 0]] * 6 and link["caps"] == [1] * 6
            # the legacy data counters: 0-36 on healthy NVLink 4 links, as on the real H200; 0 on NVLink 3
            assert all(0 <= e <= 36 if version == 6 else e == 0 for e in link["errors"][3:])
        if version == 6:
            assert any(e for link in gpu["links"] for e in link["errors"][3:])
        assert gpu["fabric"] == [3, 0, 0, 0, [0] * 16] and gpu["fabric_rc"] == 0  # completed, success
        # the legacy call says not_supported on Hopper with 580 (as on the real H200): V comes first
        assert gpu["fabric_v1"] == (0 if version == 6 else 3)
        assert gpu["fabric_v3"] == [3, 0] and gpu["fabric_bad_version"] == "E25"
    # 4 GPUs: two per socket; NVLink P2P between every pair
    assert nvml["topology"] == {"0-0": 0, "0-1": 40, "0-2": 50, "0-3": 50, "1-0": 40, "1-1": 0, "1-2": 50, "1-3": 50,
                                "2-0": 50, "2-1": 50, "2-2": 0, "2-3": 40, "3-0": 50, "3-1": 50, "3-2": 40, "3-3": 0}
    assert set(map(tuple, nvml["p2p"].values())) == {(0, 0, 0, 0, 0)}


def _cumulative(counts):
    total, out = 0, []
    for n in counts:
        total += n
        out.append(total)
    return out


def test_nvml_l40s_has_no_nvlink_and_no_fabric(make):
    host = make("l40s", 4, fm=False)
    nvml = host.py(NVML_INTERCONNECT)
    assert nvml["link_end"] == "E3"  # NOT_SUPPORTED from link 0
    for gpu in nvml["gpus"]:
        assert gpu["links"] == [] and gpu["field0"] == 3 and gpu["link_count"][0] == 3
        assert gpu["fabric"][0] == 0 and gpu["fabric_v1"] == 0  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
    assert nvml["p2p"]["0-1"] == [0, 0, 5, 5, 0]  # same socket: PCIe read/write OK, no NVLink, no atomics
    assert nvml["p2p"]["0-2"] == [3, 3, 5, 5, 3]  # across sockets: topology not supported
    assert nvml["topology"]["0-1"] == 40 and nvml["topology"]["1-3"] == 50


def test_fabric_follows_the_fabric_manager(make):
    host = make("h200-sxm", 2)
    state = "[pynvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(i)), i.state][1]"
    code = ("import ctypes, json, pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(1); "
            "i = pynvml.c_nvmlGpuFabricInfo_v2_t(); print(json.dumps(%s))" % state)
    assert host.py(code) == 3
    version = host.root / "var/run/nvidia-fabricmanager/nv-fabricmanager.version"
    version.write_text("570.86.15\n")  # a fabric manager left at another version
    assert host.py(code) == 2
    version.write_text(V + "\n")
    assert host.py(code) == 3
    host.stop_fm()  # stopped: in progress (CUDA: 802)
    assert host.py(code) == 2
    assert host.py(NVML_INTERCONNECT)["p2p"]["0-1"] == [5] * 5
    host.fm()
    assert host.py(code) == 3
    faults.fabric_stuck(host.lab_host)  # stuck now and under this driver, whatever the fabric manager does
    assert host.py(code) == 2
    host.stop_fm()
    host.fm()
    assert host.py(code) == 2
    host.reload(V)
    assert host.py(code) == 2
    host.reload("570.86.15")  # another driver: the fault was this driver's
    assert host.py(code) == 3


# ---- faults --------------------------------------------------------------------------------------------------

LINKS = """
    import json, pynvml as p
    p.nvmlInit()
    h = p.nvmlDeviceGetHandleByIndex(%d)
    print(json.dumps({"up": [p.nvmlDeviceGetNvLinkState(h, l) for l in range(18)],
                      "crc": [p.nvmlDeviceGetNvLinkErrorCounter(h, l, p.NVML_NVLINK_ERROR_DL_CRC_FLIT) for l in range(18)],
                      "replay": [p.nvmlDeviceGetNvLinkErrorCounter(h, l, p.NVML_NVLINK_ERROR_DL_REPLAY) for l in range(18)],
                      "recovery": [p.nvmlDeviceGetNvLinkErrorCounter(h, l, p.NVML_NVLINK_ERROR_DL_RECOVERY) for l in range(18)],
                      "symbol": [f.value.ullVal for f in p.nvmlDeviceGetFieldValues(h, [(221, l) for l in range(18)])],
                      "effective": [f.value.ullVal for f in p.nvmlDeviceGetFieldValues(h, [(219, l) for l in range(18)])],
                      "f_replay": [f.value.ullVal for f in p.nvmlDeviceGetFieldValues(h, [(161, l) for l in range(18)])],
                      "f_crc": [f.value.ullVal for f in p.nvmlDeviceGetFieldValues(h, [(163, l) for l in range(18)])]}))
"""


def test_nvlink_down_now_and_across_reboots_under_that_driver(make):
    host = make("h100-sxm", 2)
    assert "down" in faults.nvlink_down(host.lab_host, 1, 5)
    after = host.py(LINKS % 1)
    assert after["up"] == [0 if l == 5 else 1 for l in range(18)]
    assert "Xid" in (host.lab_host.dir / "kernel/kmsg").read_text() and "link 5(" in (host.lab_host.dir / "kernel/kmsg").read_text()
    assert host.py(LINKS % 0)["up"] == [1] * 18
    host.reload(V)  # reboot into the same driver: still down
    assert host.py(LINKS % 1)["up"][5] == 0
    host.reload("570.86.15")  # another driver trains it again
    assert host.py(LINKS % 1)["up"][5] == 1
    # --driver: nothing now, down from the next load of that driver on
    faults.nvlink_down(host.lab_host, 0, 17, driver="570.86.15")
    assert host.py(LINKS % 0)["up"][17] == 1
    host.reload("570.86.15")
    assert host.py(LINKS % 0)["up"][17] == 0
    host.reload(V)
    assert host.py(LINKS % 0)["up"][17] == 1 and host.py(LINKS % 1)["up"][5] == 0


def test_nvlink_errors_are_volatile_or_planted_per_driver(make):
    host = make("h100-sxm", 2)
    faults.nvlink_errors(host.lab_host, 0, 7, link=3)
    faults.nvlink_errors(host.lab_host, 0, 5, link=3)
    got = host.py(LINKS % 0)
    for counter in ("crc", "replay", "symbol", "effective", "f_replay", "f_crc"):
        assert got[counter] == [12 if l == 3 else 0 for l in range(18)], counter
    assert got["recovery"] == [0] * 18
    host.reload(V)  # a driver load restarts the counters
    assert host.py(LINKS % 0)["crc"] == [0] * 18
    faults.nvlink_errors(host.lab_host, 1, 40, link=2, driver=V)
    assert host.py(LINKS % 1)["crc"] == [0] * 18
    host.reload(V)
    assert host.py(LINKS % 1)["crc"][2] == 40
    host.reload(V)
    assert host.py(LINKS % 1)["crc"][2] == 40  # after every load of that driver, not adding up


@pytest.mark.parametrize("call,message", [
    (lambda h: faults.nvlink_down(h, 2, 0), "has GPUs 0..1, not 2"),
    (lambda h: faults.nvlink_down(h, 0, 18), "has NVLinks 0..17, not 18"),
    (lambda h: faults.nvlink_down(h, 0, -1), "has NVLinks 0..17, not -1"),
    (lambda h: faults.nvlink_errors(h, 0, -3), "--count must be 0 or more"),
    (lambda h: faults.nvlink_errors(h, 0, 1, link=99), "not 99"),
    (lambda h: faults.nvlink_down(h, 0, 1, driver="latest"), "is not a driver version"),
])
def test_bad_fault_input(make, call, message):
    host = make("h100-sxm", 2, fm=False)
    with pytest.raises(InputError, match=re.escape(message)):
        call(host.lab_host)


def test_pcie_only_boards_refuse_nvlink_faults(make):
    host = make("l40s", 2, fm=False)
    with pytest.raises(InputError, match="has no NVLink"):
        faults.nvlink_down(host.lab_host, 0, 0)
    with pytest.raises(InputError, match="has no NVSwitch fabric"):
        faults.fabric_stuck(host.lab_host)


# ---- nvidia-smi ----------------------------------------------------------------------------------------------

def capture(section):
    """One section of the real 2x H200 capture ("===== nvidia-smi nvlink -s" ... up to its "rc=" line)."""
    text = (TESTDATA / "nvidia-smi-interconnect.txt").read_text()
    body = text.split("===== nvidia-smi %s\n" % section, 1)[1]
    return body.split("rc=", 1)[0]


@pytest.mark.parametrize("args", [("nvlink", "-s"), ("nvlink", "-e"), ("nvlink", "-c"), ("topo", "-m"),
                                  ("topo", "-p2p", "n")])
def test_smi_matches_the_real_2x_h200_output(make, args):
    """A lab 2x H200 host with the real host's GPU UUIDs prints what the real one printed, byte for byte."""
    host = make("h200-sxm", 2)
    result = host.tool(*args)
    assert result.returncode == 0, result.stdout
    assert result.stdout == capture(" ".join(args))


def test_smi_fabric_section_matches_the_real_one(make):
    host = make("h200-sxm", 2)
    text = host.tool("-q").stdout
    real = capture("-q")
    block = re.compile(r"^    Fabric\n(?:        .*\n)+", re.M)
    assert block.findall(text) == block.findall(real)
    xml = host.tool("-q", "-x").stdout
    real_xml = (TESTDATA / "nvidia-smi-q-x.xml").read_text()
    element = re.compile(r"^\t\t<fabric>\n.*?</fabric>\n", re.M | re.S)
    assert element.findall(xml) == element.findall(real_xml) and len(element.findall(xml)) == 2
    host.stop_fm()
    assert "        State                                          : In Progress\n" in host.tool("-q").stdout
    assert "<state>In Progress</state>" in host.tool("-q", "-x").stdout


def parse_status(text):
    """{gpu: {link: GB/s or None (inactive)}} from `nvidia-smi nvlink -s`."""
    out, gpu = {}, None
    for line in text.splitlines():
        m = re.match(r"GPU (\d+): ", line)
        if m:
            gpu = out.setdefault(int(m.group(1)), {})
            continue
        m = re.match(r"\t Link (\d+): (?:([\d.]+) GB/s|<inactive>)$", line)
        assert m, line
        gpu[int(m.group(1))] = float(m.group(2)) if m.group(2) else None
    return out


def parse_errors(text):
    out, gpu = {}, None
    for line in text.splitlines():
        m = re.match(r"GPU (\d+): ", line)
        if m:
            gpu = out.setdefault(int(m.group(1)), {})
            continue
        m = re.match(r"\t Link (\d+): (Replay|Recovery|CRC) Errors: (\d+)$", line)
        if m:
            gpu.setdefault(int(m.group(1)), {})[m.group(2)] = int(m.group(3))
        else:
            assert line == "", line
    return out


def test_smi_nvlink_and_topo_agree_with_nvml_under_faults(make):
    host = make("h100-sxm", 4)
    for link in range(9):
        faults.nvlink_down(host.lab_host, 2, link)
    faults.nvlink_errors(host.lab_host, 1, 6, link=4)
    status = parse_status(host.tool("nvlink", "-s").stdout)
    errors = parse_errors(host.tool("nvlink", "-e").stdout)
    for gpu in range(4):
        nvml = host.py(LINKS % gpu)
        assert [status[gpu][l] is not None for l in range(18)] == [bool(u) for u in nvml["up"]]
        assert {v for v in status[gpu].values() if v} == {26.562}
        assert [errors[gpu][l]["CRC"] for l in range(18)] == nvml["crc"]
        assert [errors[gpu][l]["Replay"] for l in range(18)] == nvml["replay"]
        assert [errors[gpu][l]["Recovery"] for l in range(18)] == nvml["recovery"]
    topo = host.tool("topo", "-m").stdout.splitlines()
    cells = {row.split("\t")[0]: row.split("\t")[1:5] for row in topo[1:5]}
    assert cells == {"GPU0": [" X ", "NV18", "NV9", "NV18"], "GPU1": ["NV18", " X ", "NV9", "NV18"],
                     "GPU2": ["NV9", "NV9", " X ", "NV9"], "GPU3": ["NV18", "NV18", "NV9", " X "]}
    for link in range(9, 18):
        faults.nvlink_down(host.lab_host, 2, link)  # every link down: GPU 2 falls back to PCIe
    cells = {row.split("\t")[0]: row.split("\t")[1:5] for row in host.tool("topo", "-m").stdout.splitlines()[1:5]}
    assert cells["GPU2"] == ["SYS", "SYS", " X ", "NODE"]
    assert host.py(NVML_INTERCONNECT)["p2p"]["2-3"] == [0, 0, 5, 5, 0]
    assert host.tool("nvlink", "-s", "-i", "1", "-l", "4").stdout.endswith("\t Link 4: 26.562 GB/s\n")
    assert host.tool("nvlink", "-s", "-l", "18").returncode == 2


def test_smi_nvlink_on_a_pcie_board(make):
    host = make("l40s", 2, fm=False)
    result = host.tool("nvlink", "-s")
    assert result.returncode == 0 and result.stdout == (
        "GPU 0: NVIDIA L40S (UUID: %s)\nGPU 1: NVIDIA L40S (UUID: %s)\n" % H200_UUIDS)
    assert host.tool("topo", "-m").stdout.splitlines()[1] == "GPU0\t X \tNODE\t0-31\t0\t\tN/A"
    assert "<state>N/A</state>" in host.tool("-q", "-x").stdout


# ---- nvidia-lab-bench ----------------------------------------------------------------------------------------

def bench(host, *args):
    result = host.tool("--samples", "30", "--seconds", "0", *args, name="nvidia-lab-bench")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def medians(report):
    busbw = statistics.median(s["allreduce_busbw_gbs"] for s in report["samples"] if "allreduce_busbw_gbs" in s)
    p2p = {}
    for s in report["samples"]:
        if "p2p_gbs" in s:
            p2p.setdefault((s["gpu"], s["peer"]), []).append(s["p2p_gbs"])
    return busbw, {k: statistics.median(v) for k, v in p2p.items()}


@pytest.mark.parametrize("sku,count,busbw,p2p", [("h100-sxm", 8, 480.0, 370.0), ("h200-sxm", 2, 322.5, 370.0),
                                                 ("a100-sxm", 8, 230.0, 230.0), ("l40s", 4, 20.0, 25.0)])
def test_bench_interconnect_figures(make, sku, count, busbw, p2p):
    host = make(sku, count, fm=SKUS[sku].nvswitch)
    report = bench(host, "--seed", "1")
    assert {"allreduce_busbw_gbs", "p2p_gbs"} <= set(report["metrics"])
    rows = [s for s in report["samples"] if "allreduce_busbw_gbs" in s]
    assert len(rows) == 30 and all(s["gpu"] is None and "peer" not in s for s in rows)
    got_busbw, got_p2p = medians(report)
    assert got_busbw == pytest.approx(busbw, rel=0.015)
    assert set(got_p2p) == {(i, (i + 1) % count) for i in range(count)}
    assert all(v == pytest.approx(p2p, rel=0.015) for v in got_p2p.values())
    values = [s["allreduce_busbw_gbs"] for s in rows]
    assert 0.001 <= statistics.stdev(values) / statistics.mean(values) <= 0.01


def test_bench_figures_fall_with_a_link_down_and_fail_on_a_stuck_fabric(make):
    host = make("h100-sxm", 4)
    base_busbw, base_p2p = medians(bench(host, "--seed", "2"))
    for link in range(6):
        faults.nvlink_down(host.lab_host, 1, link)  # 12 of 18 up
    busbw, p2p = medians(bench(host, "--seed", "2"))
    assert busbw / base_busbw == pytest.approx(12 / 18, abs=0.01)
    for pair in ((0, 1), (1, 2)):
        assert p2p[pair] / base_p2p[pair] == pytest.approx(12 / 18, abs=0.01)
    for pair in ((2, 3), (3, 0)):
        assert p2p[pair] / base_p2p[pair] == pytest.approx(1.0, abs=0.01)
    faults.fabric_stuck(host.lab_host)
    failed = host.tool(name="nvidia-lab-bench")
    assert failed.returncode == 1 and "CUDA error 802: system not yet initialized" in failed.stderr
    assert failed.stdout == ""


def test_bench_needs_the_fabric_manager_on_nvswitch_boards(make):
    host = make("h100-sxm", 1, fm=False)
    failed = host.tool(name="nvidia-lab-bench")
    assert failed.returncode == 1 and "CUDA error 802" in failed.stderr
    host.fm()
    report = bench(host)
    assert "allreduce_busbw_gbs" not in report["metrics"]  # one GPU: no interconnect
    assert all("p2p_gbs" not in s for s in report["samples"])


# ---- a rack-scale tray's multi-node NVLink domain (lab spec +domain=NAME) ------------------------------------

def test_a_tray_of_a_domain_reports_its_cluster_and_clique(make):
    from fleetctl_lab.skus import DOMAIN_CLIQUE, domain_cluster_uuid

    host = make("gb200-nvl", 4, fm=False)  # a compute tray runs no fabric manager: the rack's switch trays do
    code = ("import ctypes, json, pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(3); "
            "i = pynvml.c_nvmlGpuFabricInfo_v3_t(); i.version = pynvml.nvmlGpuFabricInfo_v3; "
            "pynvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(i)); "
            "print(json.dumps([i.state, i.status, i.cliqueId, bytes(i.clusterUuid).hex(), "
            "pynvml.nvmlDeviceGetNvLinkVersion(h, 0), pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, 17)]))")
    assert host.py(code) == [0, 0, 0, "00" * 16, 7, 2]  # no domain: no fabric of its own, as an HGX board's is zero
    cluster = domain_cluster_uuid("rack-a")
    assert cluster == domain_cluster_uuid("rack-a") != domain_cluster_uuid("rack-b")
    host.conf(fabric__domain="rack-a", fabric__cluster_uuid=cluster, fabric__clique_id=DOMAIN_CLIQUE)
    assert host.py(code) == [3, 0, 32766, cluster.replace("-", ""), 7, 2]  # completed, success, NVLink 5.0, switch
    fabric = host.tool("-q").stdout.split("    Fabric\n")[1]
    assert "State                                          : Completed" in fabric
    assert f"CliqueId                                       : {DOMAIN_CLIQUE}" in fabric
    assert f"ClusterUUID                                    : {cluster}" in fabric
    assert f"<clusterUuid>{cluster}</clusterUuid>" in host.tool("-q", "-x").stdout


def test_a_tray_back_from_its_reboot_in_another_clique():
    hw, planted = {"fabric.clique_id": "32766"}, {"clique_next_boot": "32765", "imex_down_next_boot": "1"}
    assert faults.apply_next_boot_faults(hw, planted, "boot-2")
    assert hw == {"fabric.clique_id": "32765"} and planted == {"imex_down_boot": "boot-2"}
    assert not faults.apply_next_boot_faults(hw, planted, "boot-3")  # once: the boot after that is plain
